"""Where one record's prediction comes from (``charon-search validate --explain ID``).

A validate table says *how far* a prediction is off; this says *what the simulator did* to get
it, so the next change has a mechanism to aim at:

- **training**: the critical rank's step split into compute, exposed communication per axis,
  pipeline bubble, overlap slowdown, optimizer and host time (they sum to the step), the
  share of operator time each cost source priced (measured profile, trained predictor,
  roofline, collective model), and the largest operators of one layer of each block type,
  forward and backward, with their cost source and the FLOP/s they reach.
- **serving**: the launch facts the engine profile set, the iterations of the measured window
  (prompt-carrying and decode-only: how many, how long, how many prompts and decodes each), the
  spread of the measured requests' TTFT, and the largest operators of the mean prompt
  iteration (at its tokens, with its prefill attention and the host floor of an iteration that
  replays no CUDA graph) and of one decode step at the window's mean decode batch, with their
  cost source.

>>> from charon_search.validation import load_files, default_files, select_records, to_case
>>> rec = select_records(load_files(default_files()), ids=["megatron_sc21_t1_1.7b"])[0]
>>> exp = explain_case(to_case(rec))  # doctest: +SKIP
>>> print(render_explanation(exp))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from charon_search.serving.backends import memory_knob
from charon_search.validation.predict import measured_skip, predicted_latencies
from charon_search.validation.translate import ServingCase, TrainingCase

__all__ = ["explain_case", "render_explanation"]

#: Prompt- and decode-step operators listed by ``render_explanation``.
TOP_OPS = 12


def explain_case(case: TrainingCase | ServingCase) -> dict[str, Any]:
    """The simulation behind ``case``'s prediction as a JSON-able dict (``kind`` training or
    serving; fields documented in the module docstring)."""
    if isinstance(case, TrainingCase):
        return _explain_training(case)
    return _explain_serving(case)


def _explain_training(case: TrainingCase) -> dict[str, Any]:
    from charon_search.training import simulate_training
    from charon_search.validation.runner import _layout_summary

    rep = simulate_training(case.model, case.cluster, case.layout, memory=False)
    b = rep.breakdown
    parts = {"compute_s": b.compute_s, "exposed_comm_s": b.exposed_comm_s,
             "pipeline_bubble_s": b.pipeline_bubble_s,
             "overlap_slowdown_s": b.overlap_slowdown_s, "optimizer_s": b.optimizer_s,
             "other_s": b.other_s}
    return {
        "kind": "training", "id": case.record.id, "cluster": case.cluster.name,
        "layout": _layout_summary(case), "step_time_s": rep.step_time_s, "mfu": rep.mfu,
        "hfu": rep.hfu, "num_micro_batches": rep.num_micro_batches, "breakdown": parts,
        "exposed_comm_by_kind_s": dict(b.exposed_comm_by_kind_s),
        "cost_sources": dict(rep.cost_sources), "measured": dict(case.record.measured),
        "layer_times_s": {k: dict(v) for k, v in rep.layer_times_s.items()},
        "block_ops": _block_ops(rep.timeline),
    }


def _block_ops(timeline: Any) -> list[dict[str, Any]]:
    """Per block type and pass, the ``TOP_OPS`` largest operators of one layer as priced
    (standalone seconds before overlap, cost source, and for a tensor-core operator the FLOP/s
    it reaches: the FLOPs it computes over its seconds, a causal attention's masked half of
    the score square left out as its kernel skips it) and the sum of all its operators."""
    from charon_search.cost.roofline import TENSOR_CORE_KINDS
    from charon_search.sim.costing import kernel_flops

    if timeline is None or not timeline.costed_graphs:
        return []
    b, s = timeline.block_shape
    out = []
    for block, graphs in timeline.costed_graphs.items():
        for label, cg in zip(("forward", "backward"), graphs, strict=True):
            if cg is None:
                continue
            rows = []
            for node, sec, src in zip(cg.graph.nodes, cg.durations_s, cg.provenance,
                                      strict=True):
                flops = kernel_flops(node, b, s, s) if node.kind in TENSOR_CORE_KINDS else 0.0
                rows.append({"name": node.name, "kind": str(node.kind), "source": src,
                             "seconds": float(sec),
                             "flops_per_s": flops / float(sec) if flops > 0 and sec > 0
                             else None})
            rows.sort(key=lambda r: -r["seconds"])
            out.append({"block": block, "pass": label,
                        "total_s": float(sum(r["seconds"] for r in rows)),
                        "ops": rows[:TOP_OPS]})
    return out


def _explain_serving(case: ServingCase) -> dict[str, Any]:
    from charon_search.serving.simulator import run_simulation

    cfg = case.config
    sim, rep = run_simulation(case.model, case.cluster, cfg, case.workload, keep_requests=True,
                              record_iterations=True)
    per = rep.per_request or {}
    rid = np.asarray(per.get("request_id", []), dtype=float)
    arrived = np.asarray(per.get("arrived_at_s", []), dtype=float)
    e2e = np.asarray(per.get("e2e_s", []), dtype=float)
    ttft = np.asarray(per.get("ttft_s", []), dtype=float)
    pred_ttft, pred_tpot = predicted_latencies(case, rep)
    keep = (rid >= measured_skip(case)) & np.isfinite(e2e)
    if not keep.any():
        keep = np.isfinite(e2e)
    t0 = float(arrived[keep].min()) if keep.any() else 0.0
    t1 = float((arrived + e2e)[keep].max()) if keep.any() else 0.0
    iters = [r for eng in sim.replicas for r in (eng.records or ())
             if t0 <= r.start_s < t1]
    groups: dict[str, dict[str, float]] = {}
    for label, sel in (("prompt", [r for r in iters if r.num_prefill]),
                       ("decode", [r for r in iters if not r.num_prefill])):
        if sel:
            groups[label] = {
                "count": len(sel),
                "mean_duration_s": float(np.mean([r.duration_s for r in sel])),
                "mean_prompts": float(np.mean([r.num_prefill for r in sel])),
                "mean_prompt_tokens": float(np.mean([r.prefill_tokens for r in sel])),
                "mean_decodes": float(np.mean([r.num_decode for r in sel])),
                "time_share": float(sum(r.duration_s for r in sel)
                                    / max(sum(r.duration_s for r in iters), 1e-30)),
            }
    decode_batch = max(1, round(groups["decode"]["mean_decodes"])) if "decode" in groups else 1
    # Disaggregated: the decode step is a decode-pool replica's (replica 0 is a prefill one).
    decoder = next((e for e in sim.replicas if e.role == "decode"), sim.replicas[0])
    cost = decoder.cost
    ops = (cost.linear_breakdown(decode_batch) if hasattr(cost, "linear_breakdown") else [])
    prompt_step = _prompt_step(groups.get("prompt"), sim.replicas[0])
    fin = ttft[keep & np.isfinite(ttft)]
    layout: dict[str, Any] = {"tp": cfg.tp, "pp": cfg.pp, "ep": cfg.ep}
    if cfg.disagg is not None:
        layout = {name: _pool_summary(pool, cfg.dp_attention) for name, pool in
                  (("prefill_pool", cfg.disagg.prefill), ("decode_pool", cfg.disagg.decode))}
        layout["disagg_handoff_s"] = sim.disagg_handoff_s
    return {
        "kind": "serving", "id": case.record.id, "cluster": case.cluster.name,
        "engine": {
            "engine": cfg.engine, "frontend": cfg.frontend or "own server", **layout,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_num_seqs": cfg.max_num_seqs, "chunked_prefill": cfg.chunked_prefill,
            "prefill_schedule": cfg.prefill_schedule,
            "overlap_scheduler": cfg.overlap_scheduler,
            "iteration_overhead_s": decoder.overhead_s,
            "prefill_iteration_overhead_s": sim.replicas[0].prefill_overhead_s,
            "frontend_latency_s": sim.frontend_s,
            "frontend_prompt_token_s": sim.frontend_token_s,
            "frontend_output_token_s": sim.frontend_output_token_s,
            "frontend_output_stream_s": sim.frontend_output_stream_s,
            "stream_interval": cfg.stream_interval,
        },
        "workload": {
            "concurrency": case.extra.get("concurrency"),
            "prompt_tokens": _bounds(case.workload.input_len),
            "output_tokens": _bounds(case.workload.output_len),
            # Server-side prompts / the row's nominal ones (a client's tokenizer mismatch).
            "prompt_scale": case.extra.get("prompt_scale", 1.0),
            "prompt_scale_why": case.extra.get("prompt_scale_why", ""),
        },
        "kv_cache": {
            # The engine's memory knob as the top-level configuration sizes its replicas.
            "memory": memory_knob(cfg, case.cluster.gpu),
            "capacity_tokens": rep.kv_capacity_tokens, "kv_dtype": sim.config.kv_dtype,
            "block_size": cfg.block_size, "utilization": rep.kv_utilization,
            "preemptions": rep.num_preemptions,
            # What the streams would hold at once at their full lengths, per (decode) replica.
            "full_length_demand_tokens": _full_length_demand(case, decoder, sim),
            # Windowed layers (kv_cache.KvWindow): the keys they keep of a request, at most.
            "window_tokens": rep.kv_window_tokens,
        },
        "window": {"start_s": t0, "end_s": t1, "requests": int(keep.sum()),
                   "iterations": len(iters)},
        "iterations": groups,
        "predicted": {"ttft_s": pred_ttft, "tpot_s": pred_tpot},
        "ttft_percentiles_s": ({f"p{q}": float(np.percentile(fin, q)) for q in (10, 50, 90)}
                               if fin.size else {}),
        "decode_step": _decode_step(cost, decode_batch, case, ops),
        "prompt_step": prompt_step,
        "measured": dict(case.record.measured),
    }


def _decode_step(cost: Any, batch: int, case: ServingCase,
                 ops: list[tuple[str, str, str, float]]) -> dict[str, Any]:
    """The decode step at ``batch`` requests: its token-linear ops and its attention over the
    workload's mean context (mean prompt plus half the mean output; None where the workload's
    lengths are not fixed or uniform)."""
    prompt, output = _bounds(case.workload.input_len), _bounds(case.workload.output_len)
    ctx = round(sum(prompt) / 2 + sum(output) / 4) if prompt and output else None
    attention = float(cost.decode_attention_s(batch, batch * ctx)) if ctx else None
    return {"batch": batch, "context_tokens": ctx, "attention_s": attention,
            **_ops_summary(ops)}


def _prompt_step(group: Mapping[str, float] | None, engine: Any) -> dict[str, Any] | None:
    """The mean prompt iteration of ``engine`` (a prefill-pool replica when disaggregated),
    costed op by op: its token-linear ops at the iteration's tokens (prompt chunks plus the
    decodes riding along; under attention DP each rank runs its share, ``rank_tokens``), the
    prefill attention of its mean chunk per prompt, and the host floor of an iteration that
    replays no CUDA graph (operators x the replica's host time per operator; within vLLM's
    piecewise graphs, its attention operators only). None when no prompt iteration ran or the
    cost model has no operator table."""
    cost = engine.cost
    if not group or not hasattr(cost, "linear_breakdown"):
        return None
    prompts = max(group["mean_prompts"], 1e-9)
    tokens = max(1, round(group["mean_prompt_tokens"] + group["mean_decodes"]))
    chunk = max(1, round(group["mean_prompt_tokens"] / prompts))
    # The prompts share one launch of each attention kernel (``prefill_attention_total_s``).
    k = max(1, round(prompts))
    attention = cost.prefill_attention_total_s([cost.prefill_attention_s(chunk, chunk)] * k)
    kernels = engine.host_kernels(tokens)
    return {"tokens": tokens, "rank_tokens": cost.rank_tokens(tokens),
            "prompts": group["mean_prompts"],
            **_ops_summary(cost.linear_breakdown(tokens)),
            "attention_s": float(attention * group["mean_prompts"] / k),
            "num_kernels": int(kernels), "piecewise": kernels < cost.num_kernels,
            "host_per_kernel_s": float(engine.launch_s)}


def _ops_summary(ops: list[tuple[str, str, str, float]]) -> dict[str, Any]:
    """The ``TOP_OPS`` largest of ``linear_breakdown``'s ops and the sum of all of them."""
    return {"ops": [{"name": n, "kind": k, "source": s, "seconds": t}
                    for n, k, s, t in ops[:TOP_OPS]],
            "linear_total_s": float(sum(t for *_, t in ops))}


def _full_length_demand(case: ServingCase, decoder: Any, sim: Any) -> int | None:
    """Tokens a (decode) replica would hold if its share of the closed-loop streams were all at
    their longest prompt + output at once, counted like the capacity (a token in every KV
    layer; windowed layers hold only a window's worth of a stream); None: an open-loop
    workload, or lognormal lengths (``LengthDistribution.longest``)."""
    wl = case.workload
    if not getattr(wl, "closed_loop", False):
        return None
    longest = [wl.input_len.longest, wl.output_len.longest]
    if None in longest:
        return None
    replicas = sum(1 for e in sim.replicas if e.role == decoder.role)
    pool = decoder.pool
    per_stream = (pool.pages_for(sum(longest)) * pool.block_size // pool.pages_per_block
                  if pool.window else sum(longest))  # type: ignore[arg-type]
    return -(-wl.concurrency // max(replicas, 1)) * per_stream


def _pool_summary(pool: Any, dp_attention: bool) -> str:
    """``<replicas> x tp<t> pp<p> ep<e>`` (+ ``attention-DP``) of a disaggregated pool
    (``dp_attention``: the configuration's, for a pool that does not set its own)."""
    adp = " attention-DP" if (pool.dp_attention if pool.dp_attention is not None
                              else dp_attention) else ""
    return f"{pool.num_replicas} x tp{pool.tp} pp{pool.pp} ep{pool.ep}{adp}"


def _bounds(dist: Any) -> list[int] | None:
    """``[low, high]`` tokens of a fixed or uniform workload length (None for other kinds)."""
    if dist.kind == "uniform":
        return [int(dist.low), int(dist.high)]
    if dist.kind == "empirical" and dist.values:
        return [min(dist.values), max(dist.values)]
    return [int(dist.value)] * 2 if dist.kind == "fixed" else None


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f} ms"


def render_explanation(exp: Mapping[str, Any]) -> str:
    """Plain-text rendering of ``explain_case``'s dict."""
    lines = [f"explain {exp['id']} ({exp['kind']}, cluster {exp['cluster']})"]
    meas = ", ".join(f"{k} {v:.4g}" for k, v in exp["measured"].items())
    if exp["kind"] == "training":
        lines += [f"  layout {exp['layout']}",
                  f"  step {exp['step_time_s']:.4f} s, {exp['num_micro_batches']} micro-batches "
                  f"(simulator MFU {exp['mfu']:.3f} / HFU {exp['hfu']:.3f}, PaLM FLOPs; the "
                  "validate table counts the record's own convention)",
                  f"  measured: {meas}", "  step breakdown (sums to the step):"]
        step = exp["step_time_s"] or 1.0
        for k, v in exp["breakdown"].items():
            lines.append(f"    {k:<20s} {v:10.4f} s  {100 * v / step:5.1f} %")
        for k, v in exp["exposed_comm_by_kind_s"].items():
            lines.append(f"      exposed {k:<12s} {v:10.4f} s")
        lines.append("  operator time by cost source: " + ", ".join(
            f"{k} {100 * v:.1f} %" for k, v in sorted(exp["cost_sources"].items(),
                                                       key=lambda kv: -kv[1])))
        layers = ", ".join(f"{k} {1e3 * v['forward_s']:.2f} + {1e3 * v['backward_s']:.2f} ms"
                           for k, v in exp.get("layer_times_s", {}).items())
        lines.append("  one layer in a chain, forward + backward (with recompute): " + layers)
        for blk in exp.get("block_ops", []):
            lines.append(f"  {blk['block']} {blk['pass']}, one layer: operators sum to "
                         f"{_ms(blk['total_s'])} before overlap; largest:")
            lines += [line + (f"  ({op['flops_per_s'] / 1e12:.0f} TFLOP/s)"
                              if op["flops_per_s"] else "")
                      for line, op in zip(_op_lines(blk["ops"]), blk["ops"], strict=True)]
        return "\n".join(lines)
    eng = exp["engine"]
    lines.append("  engine: " + ", ".join(
        f"{k} {v * 1e6:.2f} us/token" if k in ("frontend_prompt_token_s",
                                                "frontend_output_token_s") else
        f"{k} {v * 1e6:.0f} us/stream" if k == "frontend_output_stream_s" else
        f"{k} {_ms(v) if k.endswith('_s') else v}" for k, v in eng.items()))
    pred = exp["predicted"]
    lines.append(f"  predicted TTFT {_ms(pred['ttft_s'])}, TPOT {_ms(pred['tpot_s'])};  "
                 f"measured: {meas}")
    interval = int(eng.get("stream_interval") or 1)
    if interval > 1 and pred["tpot_s"]:
        # ServingConfig.stream_interval: the first chunk waits for the interval-th token, one
        # mean token gap (about the TPOT) after another.
        lines.append(f"  first chunk carries token {interval} (stream_interval, an empirical "
                     f"rule): about {interval - 1} x TPOT = "
                     f"{_ms((interval - 1) * pred['tpot_s'])} of the TTFT")
    if exp["ttft_percentiles_s"]:
        lines.append("  measured-window TTFT spread: " + ", ".join(
            f"{k} {_ms(v)}" for k, v in exp["ttft_percentiles_s"].items()))
    wl = exp.get("workload")
    if wl:
        scale = wl.get("prompt_scale", 1.0)
        lines.append(
            "  workload: " + (f"closed loop of {wl['concurrency']} streams, "
                              if wl.get("concurrency") else "")
            + ("prompts {}..{} tokens".format(*wl["prompt_tokens"])
               if wl["prompt_tokens"] else "prompt lengths drawn from a distribution")
            + (f" ({wl['prompt_scale_why']})" if scale != 1.0 else "")
            + (", outputs {}..{} tokens".format(*wl["output_tokens"])
               if wl["output_tokens"] else ""))
    kv = exp["kv_cache"]
    demand = kv["full_length_demand_tokens"]
    lines.append(f"  KV cache: {kv['capacity_tokens']:,} tokens per replica ({kv['memory']}, "
                 f"{kv['kv_dtype']}, "
                 f"blocks of {kv['block_size']}), {100 * kv['utilization']:.1f} % used on "
                 f"average, {kv['preemptions']} preemptions"
                 + (f"; sliding-window layers keep at most {kv['window_tokens']:,} tokens of "
                    "a stream" if kv.get("window_tokens") else "")
                 + (f"; streams at full length would hold {demand:,}" if demand else ""))
    w = exp["window"]
    lines.append(f"  window {w['start_s']:.3f}-{w['end_s']:.3f} s: {w['requests']} requests, "
                 f"{w['iterations']} iterations")
    for label, g in exp["iterations"].items():
        lines.append(f"    {label:<6s} x{g['count']:<6d} mean {_ms(g['mean_duration_s'])}, "
                     f"{g['mean_prompts']:.2f} prompts ({g['mean_prompt_tokens']:.0f} tokens) + "
                     f"{g['mean_decodes']:.1f} decodes, {100 * g['time_share']:.1f} % of the time")
    ps = exp.get("prompt_step")
    if ps:
        what = ("attention operators outside the piecewise graphs" if ps.get("piecewise")
                else "operators")
        lines.append(
            f"  prompt step at {ps['tokens']} tokens"
            + (f", {ps['rank_tokens']} per attention-DP rank"
               if ps["rank_tokens"] != ps["tokens"] else "")
            + f" ({ps['prompts']:.2f} prompts): token-linear "
            f"ops {_ms(ps['linear_total_s'])}, prefill attention {_ms(ps['attention_s'])}, host "
            f"floor {_ms(ps['num_kernels'] * ps['host_per_kernel_s'])} ({ps['num_kernels']} "
            f"{what} x {1e6 * ps['host_per_kernel_s']:.0f} us); largest:")
        lines += _op_lines(ps["ops"])
    ds = exp["decode_step"]
    attention = (f", attention {_ms(ds['attention_s'])} at {ds['context_tokens']} keys a "
                 f"request ({exp['kv_cache']['kv_dtype']} cache)"
                 if ds.get("attention_s") is not None else " (attention aside)")
    lines.append(f"  decode step at batch {ds['batch']}: token-linear ops "
                 f"{_ms(ds['linear_total_s'])} (LM head aside){attention}; largest:")
    lines += _op_lines(ds["ops"])
    return "\n".join(lines)


def _op_lines(ops: list[Mapping[str, Any]]) -> list[str]:
    return [f"    {_ms(op['seconds']):>12s}  {op['kind']:<14s} {op['source']:<10s} {op['name']}"
            for op in ops]
