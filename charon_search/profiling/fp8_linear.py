"""fp8 training linears as torchao runs them: ``python -m charon_search.profiling.fp8_linear``.

Times one linear layer's forward and forward + backward (input and weight gradients) at the
TP8 Llama-3.1 70B training shapes of the torchtitan AsyncTP records
(``profiling.shapes.fp8_training_gemm_grid``' first model): a bf16 ``nn.Linear`` against the
same layer converted by torchao's ``convert_to_float8_training`` with the ``tensorwise`` and
``rowwise`` recipes under ``torch.compile`` (as torchtitan runs float8). That includes the
dynamic-scaling amax reductions and casts the simulator prices as their own nodes
(``passes.fusion``), so the measured fp8 / bf16 time of a whole linear checks them. Prints one
JSON line per (shape, variant) and writes them to ``--out`` as they finish.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

from charon_search.profiling.runner import CudaEventTimer

#: (tokens, in, out) of the 70B TP8 linears: 16 x 8192 tokens; q/k/v 8192 -> 1280, o 1024 ->
#: 8192, gate+up 8192 -> 7168, down 3584 -> 8192 (meta-llama/Llama-3.1-70B config.json).
SHAPES_70B_TP8 = ((131072, 8192, 1280), (131072, 1024, 8192), (131072, 8192, 7168),
                  (131072, 3584, 8192))


def main(argv: list[str] | None = None) -> None:
    import torch
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scale", type=int, default=1, help="divide every dimension (dry runs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    for flag, value, low in (("--scale", args.scale, 1), ("--repeats", args.repeats, 1),
                             ("--warmup", args.warmup, 0)):
        if value < low:
            ap.error(f"{flag} must be >= {low}, got {value}")
    if args.device not in ("cuda", "cpu"):
        ap.error(f"--device must be one of ['cpu', 'cuda'], got {args.device!r}")
    dev, out = args.device, Path(args.out)
    cuda = dev == "cuda"
    # eager calls timed with CUDA events, median after warm-ups (the profiler's own timer)
    timer = CudaEventTimer(warmup=args.warmup, repeats=args.repeats, device=dev,
                           use_graphs=False) if cuda else None
    import torchao

    where = torch.cuda.get_device_name(0) if cuda else "CPU (dry run)"
    source = (f"charon-search profiling/fp8_linear.py on {where}, torch {torch.__version__}, "
              f"torchao {torchao.__version__}, {time.strftime('%Y-%m-%d')}")
    for tokens, k, n in SHAPES_70B_TP8:
        tokens, k, n = tokens // args.scale, k // args.scale, n // args.scale
        base = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).to(dev, torch.bfloat16)
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16)
        variants: dict[str, Any] = {"bf16": base}
        for recipe in ("tensorwise", "rowwise"):
            m = convert_to_float8_training(copy.deepcopy(base),
                                           config=Float8LinearConfig.from_recipe_name(recipe))
            variants[f"fp8_{recipe}"] = m if args.no_compile else torch.compile(m)
        for name, m in variants.items():
            def fwd(m: Any = m, x: Any = x) -> Any:
                return m(x)

            def step(m: Any = m, x: Any = x, g: Any = g) -> None:
                m(x).backward(g)

            t0 = time.time()
            rec: dict[str, Any] = {"tokens": tokens, "in": k, "out": n, "variant": name,
                                   "source": source}
            try:
                if timer is None:  # CPU dry run: only check that it runs
                    step()
                    rec["ok"] = True
                else:
                    rec["fwd_s"] = timer.time_fn(fwd)
                    rec["fwd_bwd_s"] = timer.time_fn(step)
            except Exception as e:  # one variant failing must not lose the others
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            rec["wall_s"] = round(time.time() - t0, 1)
            print(json.dumps(rec), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
        del x, g, variants, base
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
