"""Trace a model and print one decoder block's operator table and whole-model totals.

Example:
    charon-search trace llama-3.1-70b --phase train --seq 8192 --mbs 1 --gpu h100-sxm-80gb

FLOPs and bytes come from the traced HF model (FakeTensors, no weights); times are the roofline
of each operator on ``--gpu`` (one GPU, no parallelism, operators run back to back).

The operator table shows the nodes as traced, which are upper bounds in four places: attention
counts the full ``s x c`` score square (no causal discount) and every layer's keys (sliding-
window and chunked layers too), a routed-expert grouped GEMM reads every expert's weights
whatever the token count, and the embedding lookup reads the whole table. The whole-model
totals apply the corrections the simulators do (``_step_graphs``) and also print the traced
sums.
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
    parser.add_argument("--phase", choices=("train", "prefill", "decode"), default="train",
                        help="train (forward + backward), prefill or decode forward "
                             "(default train)")
    parser.add_argument("--seq", type=int, default=4096,
                        help="sequence length s, tokens (train/prefill; decode context if --ctx "
                             "unset; default 4096)")
    parser.add_argument("--mbs", type=int, default=1,
                        help="micro-batch size b, sequences (default 1)")
    parser.add_argument("--ctx", type=int, default=None,
                        help="KV length c attention sees, tokens (decode; default --seq)")
    parser.add_argument("--gpu", default="h100-sxm-80gb",
                        help="GPU name or alias for the roofline times (default h100-sxm-80gb; "
                             "`charon-search catalog` lists them)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"),
                        help="activation and weight dtype of the trace (default bf16)")
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                        help="attention implementation to trace (default sdpa)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the operator rows and totals as JSON to this file")
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
    traced_flops = tm.total_flops(b, s, c)
    traced_bytes = tm.total_bytes(b, s, c)
    traced_time = None
    if gpu is not None:
        traced_time = 0.0
        for name, blk in tm.blocks.items():
            for graph in (blk.forward, blk.backward):
                if graph is not None:
                    traced_time += counts[name] * float(times[graph.name].sum())
    from charon_search.cost.roofline import roofline_times

    total_flops = total_bytes = 0.0
    total_time = 0.0 if gpu is not None else None
    for count, graph in _step_graphs(tm, spec, b, s, c):
        ev = graph.evaluate(b, s, c)
        total_flops += count * float(ev.flops.sum())
        total_bytes += count * float(ev.bytes.sum())
        if total_time is not None:
            total_time += count * float(roofline_times(graph, gpu, b, s, c).sum())
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
    print("  as the simulators cost a step: causal attention computes half its score square, "
          "sliding-window / chunked layers attend to their window, routed experts read the "
          "weights of the experts the tokens reach, the embedding reads the looked-up rows. "
          f"The rows above are as traced, upper bounds on these terms: "
          f"{format_flops(traced_flops)}, {format_bytes(traced_bytes)} moved"
          + (f", roofline {format_seconds(traced_time)}" if traced_time is not None else ""),
          file=out)
    if args.json is not None:
        doc = {
            "model": spec.name, "phase": args.phase, "params": int(spec.num_params),
            "active_params": int(spec.num_active_params),
            "totals": {"flops": total_flops, "bytes": total_bytes, "time_s": total_time},
            "traced_totals": {"flops": traced_flops, "bytes": traced_bytes,
                              "time_s": traced_time},
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


def _step_graphs(tm: Any, spec: Any, b: int, s: int, c: int) -> list[tuple[int, Any]]:
    """``(layers, graph)`` of one step at ``(b, s, c)``, with the corrections the simulators
    apply to the traced graphs (each by the function that applies it there):

    * sliding-window and chunked layers attend to their window's keys, without a causal mask
      (training's ``@sliding`` blocks: ``training.step.sliding_layer_types`` and
      ``_with_sliding``, here at ``c`` keys, so a decode step's window caps its cache reads);
    * a causal attention over its full score square computes half of it
      (``sim.costing.kernel_flops``, as the training simulator counts hardware FLOPs);
    * a routed-expert grouped GEMM reads the weights of the experts its ``tokens x top_k``
      rows reach, ``1 - e^(-r)`` of them (``cost.predictor.touched_expert_fraction``, as the
      cost predictor prices them);
    * the RoPE position tables count as precomputed (``serving._fusion._drop_rope_tables``;
      forward graphs). (The embedding lookup reads the looked-up rows and the token ids, not
      the table, as traced; a training backward writes the whole table's gradient.)

    Each corrected node holds its values at ``(b, s, c)`` as constants.
    """
    from charon_search.cost.predictor import touched_expert_fraction
    from charon_search.ir import OpKind, Poly, Role
    from charon_search.layout import Layout
    from charon_search.serving._fusion import _drop_rope_tables
    from charon_search.sim.costing import kernel_flops
    from charon_search.training.step import SLIDING_SUFFIX, _with_sliding, sliding_layer_types

    counts = dict(tm.block_counts())
    layer_types = sliding_layer_types(spec, Layout(seq_len=c))
    blocks = _with_sliding(dict(tm.blocks), layer_types, spec.sliding_window)
    for t in layer_types:
        if t.endswith(SLIDING_SUFFIX):
            counts[t] = counts.get(t, 0) + 1
            counts[t.removesuffix(SLIDING_SUFFIX)] -= 1
    attention = (OpKind.ATTENTION, OpKind.ATTENTION_BWD)
    out = []
    for name, count in counts.items():
        if count <= 0:
            continue
        blk = blocks[name]
        weights = set(blk.forward.param_tensors)
        for graph in (blk.forward, blk.backward):
            if graph is None:
                continue
            if graph is blk.forward:
                graph = _drop_rope_tables(graph)
            nodes = []
            for n in graph.nodes:
                if n.kind in attention and n.attended_c(c) == c:
                    # (a sparse attention past its top-k keys attends to that many per query,
                    # no causal square: left as traced)
                    n = n.replace(flops=Poly.const(kernel_flops(n, b, s, c)))
                elif (n.kind == OpKind.GROUPED_GEMM and str(n.role) == Role.MOE_EXPERT.value
                      and {"tokens", "top_k", "num_experts"} <= set(n.params)):
                    full = sum(float(graph.tensors[t].nbytes(b, s, c)) for t in n.inputs
                               if t in weights or t in graph.param_tensors)
                    touched = float(touched_expert_fraction(*(
                        float(n.params[k](b, s, c)) for k in ("tokens", "top_k", "num_experts"))))
                    n = n.replace(bytes_read=Poly.const(
                        float(n.bytes_read(b, s, c)) - full * (1.0 - touched)))
                nodes.append(n)
            out.append((count, graph.with_nodes(nodes)))
    return out
