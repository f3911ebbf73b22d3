"""Trace a model and print one decoder block's operator table and whole-model totals.

Example:
    charon-search trace llama-3.1-70b --phase train --seq 8192 --mbs 1 --gpu h100-sxm-80gb

FLOPs and bytes come from the traced HF model (FakeTensors, no weights); times are the roofline
of each operator on ``--gpu`` (one GPU, no parallelism, operators run back to back).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from charon_search.cli._common import prepare_outputs
from charon_search.errors import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="catalog name, HF id, or path to a config.json")
    parser.add_argument("--phase", choices=("train", "prefill", "decode"), default="train")
    parser.add_argument("--seq", type=int, default=4096,
                        help="sequence length s (train/prefill); decode context if --ctx unset")
    parser.add_argument("--mbs", type=int, default=1, help="micro-batch size b")
    parser.add_argument("--ctx", type=int, default=None,
                        help="KV length c attention sees (decode; default --seq)")
    parser.add_argument("--gpu", default="h100-sxm-80gb", help="GPU for roofline times")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                        help="attention implementation to trace")
    parser.add_argument("--json", type=Path, default=None, help="write the result as JSON")
    parser.add_argument("--all-blocks", action="store_true",
                        help="print every block (embedding, LM head too), not only decoder ones")


def _point(args: argparse.Namespace) -> tuple[int, int, int]:
    for name in ("seq", "mbs"):
        v = getattr(args, name)
        if v < 1:
            raise ConfigError(f"`--{name}` must be >= 1, but got {v}")
    if args.ctx is not None and args.ctx < 1:
        raise ConfigError(f"`--ctx` must be >= 1, but got {args.ctx}")
    if args.phase == "decode":
        return args.mbs, 1, args.ctx if args.ctx is not None else args.seq
    if args.ctx is not None and (args.ctx != args.seq if args.phase == "train"
                                 else args.ctx < args.seq):
        need = "equal to --seq (a training sequence attends to itself)" if args.phase == "train" \
            else "at least --seq (the prompt's own keys, plus any cached prefix)"
        raise ConfigError(f"`--ctx` of phase {args.phase!r} must be {need}, but got "
                          f"--ctx {args.ctx} with --seq {args.seq}")
    return args.mbs, args.seq, args.ctx if args.ctx is not None else args.seq


def _fmt_params(params: Any, b: int, s: int, c: int) -> str:
    parts = []
    for k, v in params.items():
        x = v(b, s, c)
        parts.append(f"{k}={int(x) if float(x).is_integer() else round(x, 3)}")
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    from charon_search.catalog import load_model
    from charon_search.frontend import trace_model
    from charon_search.units import format_bytes, format_flops, format_seconds

    prepare_outputs(args, {"--json": "json"})
    b, s, c = _point(args)
    spec = load_model(args.model)
    gpu = _load_gpu(args.gpu)
    tm = trace_model(spec, phase=args.phase, dtype=args.dtype, attn_impl=args.attn)
    times = _times(tm, gpu, b, s, c)
    counts = tm.block_counts()
    shown = list(tm.blocks) if args.all_blocks else [t for t in spec.block_types]
    rows: list[dict[str, Any]] = []
    for name in shown:
        blk = tm.blocks[name]
        for graph in (blk.forward, blk.backward):
            if graph is None:
                continue
            ev = graph.evaluate(b, s, c)
            t = times.get(graph.name)
            for i, n in enumerate(graph.nodes):
                rows.append({
                    "block": name, "graph": graph.meta.get("graph", ""), "name": n.name,
                    "kind": str(n.kind), "role": n.role, "module_path": n.module_path,
                    "target": n.target, "dtype": n.dtype,
                    "params": {k: v(b, s, c) for k, v in n.params.items()},
                    "shape": _fmt_params(n.params, b, s, c),
                    "flops": float(ev.flops[i]), "bytes": float(ev.bytes[i]),
                    "time_s": float(t[i]) if t is not None else None,
                })
    total_flops = tm.total_flops(b, s, c)
    total_bytes = tm.total_bytes(b, s, c)
    total_time = None
    if gpu is not None:
        total_time = 0.0
        for name, blk in tm.blocks.items():
            for graph in (blk.forward, blk.backward):
                if graph is not None:
                    total_time += counts[name] * float(times[graph.name].sum())
    out = sys.stdout
    print(f"{spec.name}: {spec.num_params:,} params, {spec.num_layers} layers, phase "
          f"{args.phase}, b={b} s={s} c={c}, dtype {args.dtype}, attention {tm.attn_impl}"
          + (f", roofline on {gpu.name}" if gpu is not None else ""), file=out)
    header = f"{'block':8s} {'graph':4s} {'kind':13s} {'role':13s} {'op':34s} " \
             f"{'shape':44s} {'GFLOP':>10s} {'MB':>10s} {'time':>10s}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        tt = format_seconds(r["time_s"]) if r["time_s"] is not None else "-"
        op = (r["module_path"] + ":" if r["module_path"] else "") + r["name"]
        print(f"{r['block'][:8]:8s} {r['graph']:4s} {r['kind'][:13]:13s} {r['role'][:13]:13s} "
              f"{op[:34]:34s} {r['shape'][:44]:44s} {r['flops'] / 1e9:10.3f} "
              f"{r['bytes'] / 1e6:10.3f} {tt:>10s}", file=out)
    print("-" * len(header), file=out)
    per_block = ", ".join(f"{n}x{k}" for n, k in counts.items())
    print(f"whole model ({per_block}), one {args.phase} step "
          f"({'forward + backward' if args.phase == 'train' else 'forward'}): "
          f"{format_flops(total_flops)}, {format_bytes(total_bytes)} moved"
          + (f", roofline {format_seconds(total_time)} on one {gpu.name}"
             if total_time is not None else ""), file=out)
    if args.json is not None:
        doc = {
            "model": spec.name, "phase": args.phase, "params": int(spec.num_params),
            "active_params": int(spec.num_active_params),
            "totals": {"flops": total_flops, "bytes": total_bytes},
            "nodes": [{k: v for k, v in r.items() if k != "shape"} for r in rows],
        }
        try:
            args.json.write_text(json.dumps(doc, indent=1))
        except OSError as e:
            raise ConfigError(f"cannot write --json file {str(args.json)!r}: {e}") from e
    return 0


def _load_gpu(name: str) -> Any:
    try:
        from charon_search.hardware import load_gpu
    except ImportError:  # hardware package not available: print FLOPs/bytes only
        return None
    return load_gpu(name)


def _times(tm: Any, gpu: Any, b: int, s: int, c: int) -> dict[str, Any]:
    if gpu is None:
        return {}
    from charon_search.cost.roofline import roofline_times

    out = {}
    for blk in tm.blocks.values():
        for graph in (blk.forward, blk.backward):
            if graph is not None:
                out[graph.name] = roofline_times(graph, gpu, b, s, c)
    return out
