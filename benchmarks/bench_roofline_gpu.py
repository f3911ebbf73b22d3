"""Measure what the roofline backend assumes, on the local CUDA GPU, and compare.

Measures dense GEMM throughput (bf16, fp8, tf32, fp32 CUDA cores) at LLM-like shapes, HBM
bandwidth (copy, read, elementwise add), per-kernel launch overhead, and reads the device
properties (memory, SMs). Next to each measurement it prints what ``RooflineCostBackend`` predicts
from ``cluster_specs/gpus/<gpu>.yaml``, so the YAML's ``compute_efficiency``,
``memory_efficiency`` and ``launch_overhead_us`` can be checked against silicon.

Run on a GPU machine from the repo root: ``python3 benchmarks/bench_roofline_gpu.py --gpu h200``
(``--out FILE`` also writes the JSON). ``--dry-run`` runs tiny shapes on the CPU to check the
script. The last printed line is one JSON object ``{"gpu", "device", "cases": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench import config_errors

GEMMS = [  # (m, n, k): tokens x out x in
    (8192, 8192, 8192),
    (16384, 8192, 8192),
    (4096, 28672, 8192),  # Llama-70B MLP up/gate, 4k tokens
    (4096, 8192, 28672),  # Llama-70B MLP down
    (4096, 4096, 4096),
    (2048, 4096, 4096),
    (512, 8192, 8192),
    (64, 8192, 8192),  # decode batch: memory-bound
    (1, 8192, 8192),
]


def _timer(torch, device: str):  # type: ignore[no-untyped-def]
    def run(fn, iters: int, warmup: int = 3) -> float:  # type: ignore[no-untyped-def]
        for _ in range(warmup):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1e-3 / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default="h200-sxm-141gb",
                    help="GPU spec whose roofline predicts each case (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    args = ap.parse_args()

    import torch

    from charon_search.cost.base import ShapePoint
    from charon_search.cost.roofline import RooflineCostBackend
    from charon_search.hardware import load_gpu
    from charon_search.ir import Node, OpKind, as_poly, poly_params
    from charon_search.testing import gemm_node

    with config_errors(ap):
        gpu = load_gpu(args.gpu)
    if not args.dry_run and not torch.cuda.is_available():
        ap.error("no CUDA GPU here; use --dry-run to check the script on the CPU")
    backend = RooflineCostBackend()
    device = "cpu" if args.dry_run else "cuda"
    scale = 64 if args.dry_run else 1
    timed = _timer(torch, device)
    cases: list[dict[str, object]] = []
    info: dict[str, object] = {"spec": gpu.name}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, total_memory_bytes=p.total_memory,
                    num_sms=p.multi_processor_count, torch=torch.__version__)
    else:
        info.update(device="cpu (dry run)")

    def predict(node: Node) -> float:
        cost = backend.cost(node, ShapePoint(1, 1, 1), gpu)
        assert cost is not None
        return cost.duration_s

    def add(name: str, measured_s: float, predicted_s: float, **extra: object) -> None:
        row = {"name": name, "measured_s": measured_s, "predicted_s": predicted_s,
               "pred_over_meas": predicted_s / measured_s, **extra}
        cases.append(row)
        print(f"{name:40s} meas {measured_s * 1e6:10.1f} us  pred {predicted_s * 1e6:10.1f} us  "
              f"ratio {predicted_s / measured_s:5.2f}  "
              + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in extra.items()), flush=True)

    # ---------------------------------------------------------------- GEMMs
    torch.backends.cuda.matmul.allow_tf32 = False
    for m, n, k in GEMMS:
        m, n, k = max(1, m // scale), max(1, n // scale), max(1, k // scale)
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        t = timed(lambda a=a, b=b: a @ b, iters=20)
        flops = 2 * m * n * k
        add(f"gemm_bf16_{m}x{n}x{k}", t, predict(gemm_node(m, n, k)),
            tflops_per_s=flops / t / 1e12, frac_of_peak=flops / t / gpu.peak_flops("bf16"))
        if device == "cuda" and hasattr(torch, "_scaled_mm") and m >= 16:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major B
            one = torch.ones((), device=device)
            try:
                t8 = timed(lambda a8=a8, b8=b8, one=one: torch._scaled_mm(
                    a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), iters=20)
                add(f"gemm_fp8_{m}x{n}x{k}", t8, predict(gemm_node(m, n, k, dtype="fp8")),
                    tflops_per_s=flops / t8 / 1e12,
                    frac_of_peak=flops / t8 / gpu.peak_flops("fp8"))
            except RuntimeError as e:  # shape or build without fp8 support
                print(f"fp8 {m}x{n}x{k} skipped: {e}", flush=True)
        del a, b
    for tf32 in (True, False):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        m = n = k = max(1, 8192 // scale)
        a = torch.randn(m, k, device=device)
        b = torch.randn(k, n, device=device)
        t = timed(lambda a=a, b=b: a @ b, iters=5)
        dtype = "tf32" if tf32 else "fp32"
        node = gemm_node(m, n, k, dtype="fp32")
        # The roofline prices fp32 GEMMs at the CUDA-core rate; tf32 at the tf32 rate.
        pred = predict(node) if not tf32 else (2 * m * n * k / (gpu.peak_flops("tf32")
                                               * gpu.compute_efficiency) + gpu.launch_overhead_s)
        add(f"gemm_{dtype}_{m}x{n}x{k}", t, pred, tflops_per_s=2 * m * n * k / t / 1e12,
            frac_of_peak=2 * m * n * k / t / gpu.peak_flops(dtype))
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False

    # ---------------------------------------------------------------- memory
    numel = (2**30 if device == "cuda" else 2**22)  # 2 GiB of bf16 per tensor (dry run 8 MiB)
    x = torch.empty(numel, device=device, dtype=torch.bfloat16).normal_()
    y = torch.empty_like(x)
    z = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    size = f"{nbytes >> 30}GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20}MiB"  # dry run: 8 MiB

    def ew(name: str, fn, read: int, written: int,  # type: ignore[no-untyped-def]
           flops: int = 0) -> None:
        t = timed(fn, iters=10)
        node = Node(id=0, name=name, kind=OpKind.ELEMENTWISE, bytes_read=as_poly(read),
                    bytes_written=as_poly(written), flops=as_poly(flops),
                    params=poly_params(numel=x.numel()))
        add(name, t, predict(node), gbyte_per_s=(read + written) / t / 1e9,
            frac_of_peak=(read + written) / t / gpu.hbm_bandwidth_bytes_per_s)

    ew(f"copy_{size}_bf16", lambda: y.copy_(x), nbytes, nbytes)
    ew(f"add_{size}_bf16", lambda: torch.add(x, y, out=z), 2 * nbytes, nbytes, x.numel())
    ew(f"mul_scalar_inplace_{size}_bf16", lambda: x.mul_(1.0), nbytes, nbytes, x.numel())
    t = timed(lambda: x.sum(dtype=torch.float32), iters=10)
    node = Node(id=0, name="sum", kind=OpKind.REDUCTION, bytes_read=as_poly(nbytes),
                bytes_written=as_poly(4), flops=as_poly(x.numel()),
                params=poly_params(numel=x.numel()))
    add(f"sum_{size}_bf16", t, predict(node), gbyte_per_s=nbytes / t / 1e9,
        frac_of_peak=nbytes / t / gpu.hbm_bandwidth_bytes_per_s)

    # ---------------------------------------------------------------- launch overhead
    small = torch.zeros(1024, device=device)
    t = timed(lambda: small.add_(1.0), iters=2000, warmup=50)
    node = Node(id=0, name="tiny", kind=OpKind.ELEMENTWISE, bytes_read=as_poly(4096),
                bytes_written=as_poly(4096), flops=as_poly(1024),
                params=poly_params(numel=1024))
    add("tiny_add_back_to_back", t, predict(node), note="per-kernel time incl. launch, no graph")

    result = {"gpu": gpu.name, "device": info, "cases": cases}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
