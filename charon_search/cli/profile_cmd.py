"""Measure op latencies (and collectives, overlap) on this machine's CUDA GPU.

Times the compute ops of a catalog model at the given points (and/or a standard shape grid)
with CUDA events (warm-up, repeats, median) and writes profile-DB rows
(``OUT/profile_rows.parquet``, ``cost.profile_db`` schema), ``--train-attention`` rows
(``OUT/train_attention.parquet``, the format ``sim.train_attention`` reads), a
``calibration.yaml`` block (collective α/β fitted to NCCL over the local GPUs, overlap
slowdown) and ``summary.json``. Rows are written as they are measured (``profile_rows.jsonl``
per shape; the other files atomically every few seconds and after each part), so a
``timeout`` or a failing later part keeps every finished row. Exit 1 when nothing was
measured; 143 when terminated (SIGTERM), after writing what was measured.
Example: ``charon-search profile --model llama-3.1-8b --points 1x4096,64x1:4096 --grid
--overlap --out prof/``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from charon_search.errors import ConfigError
from charon_search.profiling.runner import SDPA_BACKENDS, atomic_write

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=None,
                        help="catalog model whose traced shapes to time (repeatable)")
    parser.add_argument("--phase", default="prefill", choices=("train", "prefill", "decode"),
                        help="phase whose traced shapes --model times (default prefill)")
    parser.add_argument("--points", default="1x4096",
                        help="BxS[:C] points, comma separated: micro-batch B x S query "
                             "tokens, C the context length in tokens (default S), e.g. "
                             "64x1:4096 for decode (default 1x4096)")
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
                        help="profile-DB GPU key (default: from the CUDA device name; one "
                             "that names another GPU than the device is refused)")
    parser.add_argument("--force-gpu-name", action="store_true",
                        help="file the rows under --gpu-name even when the CUDA device is "
                             "another GPU (the rows' source says so)")
    parser.add_argument("--warm-l2", action="store_true",
                        help="reuse GEMM weights between calls (warm L2) instead of rotating "
                             "copies that span 2x the L2 (cold weights, as in a real model)")
    parser.add_argument("--repeats", type=int, default=10,
                        help="timed calls per shape; the median is kept (default 10)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed calls per shape before timing (default 3)")
    parser.add_argument("--out", required=True, help="output folder")


def _gpu_key(args: argparse.Namespace, device_name: str) -> str:
    """The profile-DB GPU key of this run: ``--gpu-name`` (normalized) or the key of the CUDA
    device's name. A ``--gpu-name`` that names another GPU than the one detected is refused
    (an H100's timings must never be filed as an H200's) unless ``--force-gpu-name``."""
    from charon_search.cost.profile_db import normalize_gpu

    detected = normalize_gpu(device_name)
    if not args.gpu_name:
        if detected is None:
            raise ConfigError(f"--gpu-name: cannot map CUDA device {device_name!r} to a GPU "
                              "key; pass --gpu-name")
        return detected
    key = normalize_gpu(args.gpu_name) or args.gpu_name
    if detected is not None and key != detected and not args.force_gpu_name:
        raise ConfigError(f"--gpu-name {args.gpu_name} ({key}) does not match the CUDA device "
                          f"{device_name!r} ({detected}); drop --gpu-name, or pass "
                          "--force-gpu-name to file the rows under it anyway")
    return key


class _Terminated(BaseException):
    """SIGTERM (``timeout``): unwind, write what was measured, exit 143."""


class _StickyCudaError(Exception):
    """The CUDA context no longer works (every later shape would fail): stop the run."""


class _RunOutput:
    """A profile run's files under ``out``, written as results come in.

    ``profile_rows.jsonl`` gets every shape's rows the moment they are timed (one JSON line per
    row, flushed: survives even SIGKILL). ``profile_rows.parquet`` (profile-DB rows),
    ``train_attention.parquet`` (``--train-attention``: the format ``sim.train_attention``
    reads), ``summary.json`` and ``calibration.yaml`` are rewritten atomically at most every
    ``flush_s`` seconds, at the end of each part and when the run ends or is terminated.
    """

    FILES = ("profile_rows.jsonl", "profile_rows.parquet", "train_attention.parquet",
             "summary.json", "calibration.yaml")

    def __init__(self, out: Path, summary: dict[str, Any], *, flush_s: float = 2.0) -> None:
        self.out, self.summary, self.flush_s = out, summary, flush_s
        self.tables: dict[str, list[dict[str, Any]]] = {"profile_rows": [],
                                                        "train_attention": []}
        self.calibration: dict[str, Any] = {}
        for name in self.FILES:  # an earlier run's files in this folder must not mix in
            (out / name).unlink(missing_ok=True)
        self._jsonl = (out / "profile_rows.jsonl").open("w")
        self._last = time.monotonic()

    @property
    def num_rows(self) -> int:
        return sum(len(rows) for rows in self.tables.values())

    def add(self, table: str, rows: list[dict[str, Any]]) -> None:
        self.tables[table] += rows
        for r in rows:
            self._jsonl.write(json.dumps({"table": table, **r}, default=str) + "\n")
        self._jsonl.flush()
        if time.monotonic() - self._last >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        import pandas as pd
        import yaml

        self.summary["num_rows"] = self.num_rows
        for table, rows in self.tables.items():
            if rows or table == "profile_rows":
                df = pd.DataFrame(rows)
                atomic_write(self.out / f"{table}.parquet",
                              lambda p, df=df: df.to_parquet(p, index=False))
        if self.calibration:
            text = yaml.safe_dump({"calibration": self.calibration}, sort_keys=False)
            atomic_write(self.out / "calibration.yaml", lambda p: p.write_text(text))
        text = json.dumps(self.summary, indent=1, default=str) + "\n"
        atomic_write(self.out / "summary.json", lambda p: p.write_text(text))
        self._last = time.monotonic()

    def close(self) -> None:
        self.flush()
        self._jsonl.close()


def run(args: argparse.Namespace) -> int:
    import pandas as pd  # noqa: F401 - imported before any GPU work: a missing one fails first
    import yaml  # noqa: F401

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
    from charon_search.profiling.runner import (
        db_rows_problems,
        default_source,
        train_attention_rows,
    )
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
    from charon_search.cost.profile_db import normalize_gpu

    if normalize_gpu(device) not in (None, gpu):  # --force-gpu-name: say so on every row
        source += f", filed as {gpu} by --force-gpu-name"
    errors: list[str] = []
    shapes = []
    for name in args.model or ():
        try:
            shapes += select_shapes(model_graphs(name, args.phase), points)
        except Exception as e:  # one model failing must not lose the rest of the run
            errors.append(f"model {name}: {type(e).__name__}: {e}")
    if args.grid:
        shapes += standard_grid()
    if args.fp8_gemm:
        shapes += fp8_training_gemm_grid()
    if args.gh100_crosscheck:
        shapes += gh100_crosscheck_grid()
    train_shapes = (training_attention_grid(head_dim=args.head_dim, v_head_dim=args.v_head_dim)
                    if args.train_attention else [])
    train_set = set(train_shapes)
    shapes = [s for s in dict.fromkeys(shapes) if s not in train_set]
    timer = CudaEventTimer(warmup=args.warmup, repeats=args.repeats, use_graphs=not args.eager,
                           sdpa_backend=args.sdpa_backend, cold_l2=not args.warm_l2)
    kernel = f"torch {torch.__version__}"
    if args.sdpa_backend != "default":
        kernel += f" sdpa:{args.sdpa_backend}"
    inner = getattr(timer, "inner", 10)
    summary: dict[str, Any] = {
        "status": "running", "device": device, "gpu": gpu, "source": source,
        "num_shapes": len(shapes) + len(train_shapes), "num_rows": 0, "errors": errors,
        "parts": {},
        "timing": (f"eager calls, median of {args.repeats}, {args.warmup} warm-up"
                   if args.eager else f"CUDA-graph replay of >= {inner} calls, median of "
                   f"{args.repeats}, {args.warmup} warm-up"),
        "l2": ("warm (--warm-l2)" if args.warm_l2 else
               "GEMM weights under 2x L2 rotated over copies spanning >= 2x L2 (cold)"),
        "sdpa_backend": args.sdpa_backend}
    output = _RunOutput(out, summary)

    def on_error(shape: Any, e: Exception) -> None:
        errors.append(f"{shape}: {type(e).__name__}: {e}")
        try:  # a sticky error (illegal address...) fails every later shape: stop instead
            torch.cuda.synchronize()
        except Exception as sticky:
            raise _StickyCudaError(f"CUDA context unusable after {shape.op_kind} "
                                   f"{shape.variant}: {type(sticky).__name__}: "
                                   f"{sticky}") from sticky

    def terminate(signum: int, frame: Any) -> None:
        raise _Terminated()

    try:
        old_handler = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread (embedded use): no handler
        old_handler = None
    status, rc = "complete", 0
    t0 = time.time()
    try:
        parts: dict[str, Any] = summary["parts"]
        for part, part_shapes, table in (("compute", shapes, "profile_rows"),
                                         ("train_attention", train_shapes, "train_attention")):
            if not part_shapes:
                continue
            before = len(errors)
            convert = train_attention_rows if table == "train_attention" else list
            got = profile_shapes(part_shapes, timer=timer, gpu=gpu, kernel=kernel,
                                 source=source, on_error=on_error,
                                 on_rows=lambda rows, t=table, c=convert: output.add(t, c(rows)))
            parts[part] = {"shapes": len(part_shapes), "rows": len(got),
                           "failed": len(errors) - before}
            summary["compute_wall_s"] = time.time() - t0
            summary["eager_fallbacks"] = timer.eager_fallbacks
            output.flush()
        if args.collectives:
            if torch.cuda.device_count() < 2:
                parts["collectives"] = f"skipped: {torch.cuda.device_count()} GPU visible"
                summary["collectives"] = parts["collectives"]
            else:
                try:
                    _collectives(args, output, measure_collectives, gpu=gpu, device=device,
                                 source=source)
                    parts["collectives"] = "ok"
                except Exception as e:
                    errors.append(f"collectives: {type(e).__name__}: {e}")
                    parts["collectives"] = "failed"
                output.flush()
        if args.overlap:
            try:
                res = measure_overlap(timer)
                summary["overlap"] = res
                block = overlap_calibration(res, device=device)
                cal = output.calibration
                prov = {**cal.get("provenance", {}), **block.pop("provenance")}
                cal.update(block)
                cal["provenance"] = prov
                parts["overlap"] = "ok"
            except Exception as e:  # e.g. Triton cannot JIT its copy kernel: keep the rows
                errors.append(f"overlap: {type(e).__name__}: {e}")
                parts["overlap"] = "failed"
            output.flush()
    except _StickyCudaError as e:
        errors.append(str(e))
        status, rc = f"aborted: {e}", 1
    except _Terminated:
        status, rc = "terminated (SIGTERM) before the end; the rows measured are kept", 143
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        summary["status"] = status
        summary.setdefault("compute_wall_s", time.time() - t0)
        problems = db_rows_problems(output.tables["profile_rows"])
        if problems:
            summary["db_problems"] = problems
        output.close()
    measured = output.num_rows + (1 if "overlap" in summary else 0) + (
        1 if summary["parts"].get("collectives") == "ok" else 0)
    print(f"profiled {output.num_rows} rows on {device} ({gpu}) in "
          f"{summary['compute_wall_s']:.1f} s; {len(errors)} failed; {status}; wrote {out}",
          file=sys.stderr)
    if problems:
        print("charon-search profile: error: profile_rows.parquet would not load as is: "
              + "; ".join(problems), file=sys.stderr)
        rc = rc or 1
    if measured == 0:
        print("charon-search profile: error: nothing was measured (every shape and part "
              "failed); see summary.json", file=sys.stderr)
        rc = rc or 1
    return rc


def _collectives(args: argparse.Namespace, output: _RunOutput, measure: Any, *, gpu: str,
                 device: str, source: str) -> None:
    import numpy as np
    import torch

    from charon_search.cost.nccl_fit import fit_points

    sizes = [2**i for i in range(12, 31, 2)]
    coll = measure(sizes, warmup=args.warmup, repeats=args.repeats)
    output.add("profile_rows", [{**r, "gpu": gpu, "kernel": f"nccl torch {torch.__version__}",
                                 "source": source} for r in coll])
    alpha, bus, mape = fit_points([r["op_kind"] for r in coll],
                                  np.array([r["group_size"] for r in coll]),
                                  np.array([r["bytes"] for r in coll]),
                                  np.array([r["latency_s"] for r in coll]))
    cal = output.calibration
    cal["collective_alpha_us"] = {"nvlink": round(alpha * 1e6, 3)}
    cal["collective_bus_gbyte_per_s"] = {"nvlink": round(bus / 1e9, 1)}
    cal.setdefault("provenance", {})["collective.nvlink"] = (
        f"fit to charon-search profile NCCL on {torch.cuda.device_count()}x {device}, "
        f"{len(coll)} points, MAPE {mape:.1%}")
