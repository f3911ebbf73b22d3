"""Cross-check of fp8 GEMM speed on the local GPU: ``python -m charon_search.profiling.check_fp8``.

Times an ``N x N x N`` GEMM (default 8192) as bf16 ``torch.matmul`` and as fp8 e4m3
``torch._scaled_mm`` (tensor-wise scales, fast accumulation) on random and on zero inputs,
with the SM clock and power read by ``nvidia-smi`` right after each, and prints one JSON line
per case. Tensor-core power depends on the data (zeros toggle no bits), so a random-input rate
far below the zero-input rate means the part is power-capped, not slow.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

from charon_search.profiling.runner import CudaEventTimer


def _smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception as e:  # no nvidia-smi: still print the timings
        return f"nvidia-smi failed: {e}"


def main(n: int = 8192, reps: int = 50) -> None:
    import torch

    dev = "cuda"
    timer = CudaEventTimer(warmup=5, repeats=reps, device=dev, use_graphs=False)
    for data in ("randn", "zeros"):
        make = torch.randn if data == "randn" else torch.zeros
        a = make(n, n, device=dev, dtype=torch.bfloat16)
        b = make(n, n, device=dev, dtype=torch.bfloat16)
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as cuBLASLt wants
        one = torch.ones((), device=dev)
        def bf16(a: Any = a, b: Any = b) -> Any:
            return a @ b

        def fp8(a8: Any = a8, b8: Any = b8, one: Any = one) -> Any:
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                    use_fast_accum=True)

        cases: dict[str, Callable[[], Any]] = {"bf16_matmul": bf16, "fp8_scaled_mm": fp8}
        for name, fn in cases.items():
            med = timer.time_fn(fn)
            smi = _smi()
            print(json.dumps({"case": name, "data": data, "n": n, "median_s": med,
                              "tflops": 2 * n**3 / med / 1e12, "sm_clock_power": smi}))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=8192, help="GEMM size (default 8192)")
    ap.add_argument("reps", type=int, nargs="?", default=50, help="timed calls (default 50)")
    args = ap.parse_args()
    if args.n < 16 or args.n % 16 or args.reps < 1:
        ap.error(f"n must be a multiple of 16 (fp8 GEMMs need it) and reps >= 1, got n={args.n}, "
                 f"reps={args.reps}")
    main(args.n, args.reps)
