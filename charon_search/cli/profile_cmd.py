"""Measure op latencies (and collectives, overlap) on this machine's CUDA GPU.

Times the compute ops of a catalog model at the given points (and/or a standard shape grid)
with CUDA events (warm-up, repeats, median) and writes profile-DB rows
(``OUT/profile_rows.parquet``, ``cost.profile_db`` schema), a ``calibration.yaml`` block
(collective α/β fitted to NCCL over the local GPUs, overlap slowdown) and ``summary.json``.
Example: ``charon-search profile --model llama-3.1-8b --points 1x4096,64x1:4096 --grid
--overlap --out prof/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from charon_search.errors import ConfigError
from charon_search.profiling.runner import SDPA_BACKENDS

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=None,
                        help="catalog model whose traced shapes to time (repeatable)")
    parser.add_argument("--phase", default="prefill", choices=("train", "prefill", "decode"))
    parser.add_argument("--points", default="1x4096",
                        help="BxS[:C] points, comma separated (default 1x4096)")
    parser.add_argument("--grid", action="store_true",
                        help="also time the standard grid (comparable to the shipped DB)")
    parser.add_argument("--train-attention", action="store_true",
                        help="time training attention forward and backward (causal squares "
                             "1k-32k, ring-attention blocks; profiling.training_attention_grid)")
    parser.add_argument("--head-dim", type=int, default=128,
                        help="head dimension of --train-attention shapes (default 128)")
    parser.add_argument("--v-head-dim", type=int, default=None,
                        help="value head dimension of --train-attention shapes (default: "
                             "--head-dim; MLA: 192 / 128)")
    parser.add_argument("--fp8-gemm", action="store_true",
                        help="time bf16 F.linear and fp8 torch._scaled_mm (tensorwise, rowwise) "
                             "at TP8 Llama-3.1 8B/70B training GEMMs")
    parser.add_argument("--gh100-crosscheck", action="store_true",
                        help="time the H100 / H200 cross-check shapes (profiling.shapes."
                             "gh100_crosscheck_grid: bf16 and fp8 GEMMs where the shipped "
                             "tables disagree, decode-sized norms and elementwise ops)")
    parser.add_argument("--sdpa-backend", default="default", choices=tuple(SDPA_BACKENDS),
                        help="SDPA kernel for attention shapes (default: torch's choice; flash = "
                             "FlashAttention-2, cudnn = cuDNN fused attention)")
    parser.add_argument("--eager", action="store_true",
                        help="time eager calls instead of CUDA-graph replay (ms-scale ops, "
                             "autograd backward)")
    parser.add_argument("--collectives", action="store_true",
                        help="time NCCL all-reduce/all-gather/reduce-scatter (>= 2 GPUs)")
    parser.add_argument("--overlap", action="store_true",
                        help="measure the GEMM || communication overlap slowdown")
    parser.add_argument("--gpu-name", default=None,
                        help="profile-DB GPU key (default: from the CUDA device name)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", required=True, help="output folder")


def _gpu_key(args: argparse.Namespace, device_name: str) -> str:
    from charon_search.cost.profile_db import normalize_gpu

    key = args.gpu_name or normalize_gpu(device_name)
    if key is None:
        raise ConfigError(f"--gpu-name: cannot map CUDA device {device_name!r} to a GPU key; "
                          "pass --gpu-name")
    return key


def run(args: argparse.Namespace) -> int:
    import pandas as pd
    import yaml

    from charon_search.profiling import (
        CudaEventTimer,
        measure_collectives,
        measure_overlap,
        model_graphs,
        overlap_calibration,
        parse_points,
        profile_shapes,
        select_shapes,
        standard_grid,
    )
    from charon_search.profiling.runner import default_source
    from charon_search.profiling.shapes import (
        fp8_training_gemm_grid,
        gh100_crosscheck_grid,
        training_attention_grid,
    )

    for flag, value in (("--head-dim", args.head_dim), ("--v-head-dim", args.v_head_dim),
                        ("--repeats", args.repeats)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {args.warmup}")
    # The arguments before the GPU: a bad command fails the same on a machine without one.
    points = parse_points(args.points)
    if not (args.model or args.grid or args.train_attention or args.fp8_gemm
            or args.gh100_crosscheck or args.collectives or args.overlap):
        raise ConfigError("nothing to measure: give --model NAME, --grid, --train-attention, "
                          "--fp8-gemm, --gh100-crosscheck, --collectives or --overlap")
    from charon_search.catalog import load_model
    from charon_search.cli._common import prepare_out_folder

    for name in args.model or ():
        load_model(name)  # an unknown name: its one-line error, with the close ones
    prepare_out_folder("--out", args.out)
    try:
        import torch
    except ImportError:
        raise ConfigError("charon-search profile needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise ConfigError("charon-search profile needs a CUDA GPU; none is visible")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0)
    gpu = _gpu_key(args, device)
    source = default_source(device)
    shapes = []
    errors: list[str] = []
    for name in args.model or ():
        try:
            shapes += select_shapes(model_graphs(name, args.phase), points)
        except Exception as e:  # one model failing must not lose the rest of the run
            errors.append(f"model {name}: {type(e).__name__}: {e}")
    if args.grid:
        shapes += standard_grid()
    if args.train_attention:
        shapes += training_attention_grid(head_dim=args.head_dim, v_head_dim=args.v_head_dim)
    if args.fp8_gemm:
        shapes += fp8_training_gemm_grid()
    if args.gh100_crosscheck:
        shapes += gh100_crosscheck_grid()
    shapes = list(dict.fromkeys(shapes))
    timer = CudaEventTimer(warmup=args.warmup, repeats=args.repeats, use_graphs=not args.eager,
                           sdpa_backend=args.sdpa_backend)
    t0 = time.time()
    kernel = f"torch {torch.__version__}"
    if args.sdpa_backend != "default":
        kernel += f" sdpa:{args.sdpa_backend}"
    rows = profile_shapes(shapes, timer=timer, gpu=gpu, kernel=kernel, source=source,
                          on_error=lambda s, e: errors.append(f"{s}: {type(e).__name__}: {e}"))
    summary: dict[str, Any] = {"device": device, "gpu": gpu, "num_shapes": len(shapes),
                               "num_rows": len(rows), "errors": errors,
                               "compute_wall_s": time.time() - t0,
                               "eager_fallbacks": timer.eager_fallbacks,
                               "timing": (f"eager calls, median of {args.repeats}, "
                                          f"{args.warmup} warm-up" if args.eager else
                                          f"CUDA-graph replay of {timer.inner} calls, median "
                                          f"of {args.repeats}, {args.warmup} warm-up"),
                               "sdpa_backend": args.sdpa_backend}
    calibration: dict[str, Any] = {}
    if args.collectives:
        if torch.cuda.device_count() < 2:
            summary["collectives"] = f"skipped: {torch.cuda.device_count()} GPU visible"
        else:
            from charon_search.cost.nccl_fit import fit_points

            sizes = [2**i for i in range(12, 31, 2)]
            coll = measure_collectives(sizes, warmup=args.warmup, repeats=args.repeats)
            for r in coll:
                rows.append({**r, "gpu": gpu, "kernel": f"nccl torch {torch.__version__}",
                             "source": source})
            import numpy as np

            alpha, bus, mape = fit_points([r["op_kind"] for r in coll],
                                          np.array([r["group_size"] for r in coll]),
                                          np.array([r["bytes"] for r in coll]),
                                          np.array([r["latency_s"] for r in coll]))
            calibration["collective_alpha_us"] = {"nvlink": round(alpha * 1e6, 3)}
            calibration["collective_bus_gbyte_per_s"] = {"nvlink": round(bus / 1e9, 1)}
            calibration.setdefault("provenance", {})["collective.nvlink"] = (
                f"fit to charon-search profile NCCL on {torch.cuda.device_count()}x {device}, "
                f"{len(coll)} points, MAPE {mape:.1%}")
    if args.overlap:
        res = measure_overlap(timer)
        summary["overlap"] = res
        block = overlap_calibration(res, device=device)
        prov = {**calibration.get("provenance", {}), **block.pop("provenance")}
        calibration.update(block)
        calibration["provenance"] = prov
    pd.DataFrame(rows).to_parquet(out / "profile_rows.parquet", index=False)
    (out / "calibration.yaml").write_text(yaml.safe_dump({"calibration": calibration},
                                                         sort_keys=False))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"profiled {len(rows)} rows on {device} ({gpu}) in {summary['compute_wall_s']:.1f} s; "
          f"{len(errors)} shapes failed; wrote {out}", file=sys.stderr)
    return 0
