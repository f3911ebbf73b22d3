"""``simulate_training``: frontend -> passes -> cost -> engine -> ``StepReport``.

Hierarchical simulation (see ``sim.layer`` and ``sim.pipeline``):

1. each block type's per-rank forward / backward graph (after the passes) is laid on the
   compute and comm streams -> first-layer and steady-state costs per micro-batch;
2. the pipeline schedule runs (rank, micro-batch, chunk, F/B/W) units whose costs are the sums
   over the chunk's layers, with P2P hand-offs between ranks;
3. after each rank's last backward of a chunk, its gradient buckets (one per layer) are reduced
   over DP on the ``dp`` stream, overlapped with the remaining backward work; with tied input
   and output embeddings on two pipeline ranks, those two then all-reduce the word embedding's
   gradient; then the optimizer step (memory bound over the local parameter shard) and, for
   ZeRO-1/2, the parameter all-gather.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from charon_search.cost.collectives import rank_domains
from charon_search.errors import ConfigError
from charon_search.hardware.spec import ClusterSpec
from charon_search.ir import DTYPE_BYTES, Node, OpGraph, OpKind, Phase, Poly, Role
from charon_search.layout import Layout, as_layout, check_layout_on_cluster
from charon_search.passes import (
    ParallelBlock,
    PassContext,
    local_params,
    parallelize_block,
)
from charon_search.sim.costing import CostedGraph, GraphCoster, axis_strides
from charon_search.sim.layer import LayerCost, UnitCost, layer_cost
from charon_search.sim.pipeline import PipelineResult, run_pipeline
from charon_search.training.report import StepBreakdown, StepReport

__all__ = ["StepTimeline", "ep_distinct_ranks", "simulate_training", "stage_layers",
           "validate_layout"]

#: Gradient-norm clipping reads every fp32 gradient once before the update (Megatron
#: ``--clip-grad 1.0`` and torchtitan ``max_norm 1.0`` are the defaults; the norm's scalar
#: all-reduce is negligible).
CLIP_GRAD_BYTES_PER_PARAM = 4.0
#: Adam bytes per local parameter and step: read fp32 master, m, v and the fp32 main grad
#: (16 B), write master, m, v (12 B) and the bf16 model copy (2 B) (Megatron mixed precision),
#: plus the gradient-norm read.
ADAM_BYTES_PER_PARAM = 30.0 + CLIP_GRAD_BYTES_PER_PARAM
SGD_BYTES_PER_PARAM = 14.0 + CLIP_GRAD_BYTES_PER_PARAM
#: Of those, bytes written per parameter (Adam: master, m, v, bf16 copy; SGD: master, copy).
OPT_WRITE_BYTES = {"adam": 14.0, "sgd": 6.0}

_CACHE_LOCK = threading.Lock()
_PAR_CACHE: OrderedDict[tuple, dict[str, ParallelBlock]] = OrderedDict()
_LAYER_CACHE: OrderedDict[tuple, tuple[Any, tuple[LayerCost, LayerCost | None, CostedGraph,
                                                   CostedGraph | None]]] = OrderedDict()
_CACHE_SIZE = 256


@dataclass(kw_only=True)
class StepTimeline:
    """Everything needed to draw the step (``sim.trace.chrome_trace``)."""

    pipeline: PipelineResult
    dp_intervals: list[tuple[int, str, float, float]]
    """(rank, name, start, end) of gradient-sync collectives."""
    tail_intervals: list[tuple[int, str, str, float, float]]
    """(rank, stream, name, start, end): optimizer and parameter all-gather."""
    layer_costs: dict[str, tuple[LayerCost, LayerCost | None]]
    stage_blocks: list[list[list[str]]]
    """[rank][chunk] -> block names of the chunk's layers (embedding / lm_head included)."""
    costed_graphs: dict[str, tuple[CostedGraph, CostedGraph | None]] = field(
        default_factory=dict)
    """Block name -> its forward and backward graphs priced op by op (standalone seconds and
    cost source per node), at ``block_shape``."""
    block_shape: tuple[float, float] = (0.0, 0.0)
    """``(micro-batch size, sequence length)`` the block graphs were priced at (the graphs'
    own passes divide the sequence by CP and the hidden sizes by TP)."""


def _resolve(model: Any, cluster: Any) -> tuple[Any, ClusterSpec]:
    if isinstance(model, str):
        from charon_search.catalog import load_model
        model = load_model(model)
    if isinstance(cluster, str):
        from charon_search.hardware import load_cluster
        cluster = load_cluster(cluster)
    return model, cluster


def validate_layout(spec: Any, layout: Layout, num_gpus: int | None) -> list[str]:
    """``Layout.validate_for`` plus the simulator's rules; returns warnings."""
    layout.validate_for(spec, num_gpus)
    warnings: list[str] = []
    m = layout.num_micro_batches
    if layout.schedule == "interleaved-1f1b" and m % layout.pp:
        raise ConfigError(f"`num_micro_batches % pp == 0` must hold for interleaved-1f1b, but "
                          f"got (num_micro_batches={m}, pp={layout.pp})")
    if layout.schedule == "dualpipe" and (m % 2 or layout.pp % 2):
        raise ConfigError(f"dualpipe needs an even pp and an even number of micro-batches, but "
                          f"got (pp={layout.pp}, num_micro_batches={m})")
    if layout.cp_algo == "ulysses" and layout.cp > 1 and (
            spec.num_attention_heads % (layout.tp * layout.cp)):
        raise ConfigError(f"ulysses `tp * cp` must divide num_attention_heads, but got "
                          f"(tp={layout.tp}, cp={layout.cp}, "
                          f"num_attention_heads={spec.num_attention_heads})")
    if getattr(layout, "attention_kernel", "flash") == "eager" and layout.cp > 1:
        raise ConfigError(f"attention_kernel 'eager' cannot be context-parallel (the CP passes "
                          f"split fused attention kernels), but got (cp={layout.cp})")
    chunks = layout.pp * (2 if layout.schedule == "dualpipe" else layout.vpp)
    if layout.schedule == "dualpipe" and spec.num_layers < layout.pp:
        raise ConfigError(f"`pp <= num_layers` must hold, but got (pp={layout.pp}, "
                          f"num_layers={spec.num_layers})")
    if layout.pp > 1 and m < layout.pp:
        warnings.append(f"only {m} micro-batches for {layout.pp} pipeline ranks: the bubble "
                        "dominates")
    if spec.max_context and layout.seq_len > spec.max_context:
        warnings.append(f"seq_len {layout.seq_len:,} exceeds {spec.name}'s context of "
                        f"{spec.max_context:,} tokens (max_position_embeddings): the step is "
                        "costed as traced, but the model was not trained for that length")
    if spec.is_moe and layout.tp > 1 and not layout.sequence_parallel:
        warnings.append("MoE with tp > 1 and no sequence parallelism: routed experts run "
                        "redundantly on every TP rank (Megatron requires SP here)")
    del chunks
    return warnings


def stage_layers(layer_types: tuple[str, ...], num_chunks: int) -> list[list[str]]:
    """Split the decoder layers over ``num_chunks`` virtual stages.

    Even split; when ``num_chunks`` does not divide the layers, the extra layers go to the
    middle stages first, so the first and last stages (which also hold the embedding and the
    LM head) get fewer (the uneven-first/last partition).
    """
    n = len(layer_types)
    base, extra = divmod(n, num_chunks)
    order = [*list(range(1, num_chunks - 1)), 0, num_chunks - 1] if num_chunks > 2 else \
        list(range(num_chunks))
    counts = [base] * num_chunks
    for i in order[:extra]:
        counts[i] += 1
    out, k = [], 0
    for cnt in counts:
        out.append(list(layer_types[k:k + cnt]))
        k += cnt
    return out


#: Block-type suffix of the sliding-window variant of a block (``sliding_layer_types``).
SLIDING_SUFFIX = "@sliding"


def sliding_layer_types(spec: Any, layout: Layout) -> tuple[str, ...]:
    """The model's per-layer block types, ``<type>@sliding`` for the layers whose attention
    uses a sliding window of ``spec.sliding_window`` keys (``ModelSpec.sliding_layers``).

    Only when the window is shorter than the sequence and without context parallelism (whose
    ring would move only the window's keys; not modelled): otherwise the plain types. The step
    time and hardware FLOPs (HFU) follow the windows; model FLOPs (MFU) keep the PaLM
    convention's full causal attention in every layer."""
    types = tuple(spec.layer_types) or ("dense",) * spec.num_layers
    flags = spec.sliding_layers
    if not flags or layout.cp > 1 or layout.seq_len <= spec.sliding_window:
        return types
    return tuple(f"{t}{SLIDING_SUFFIX}" if slides else t
                 for t, slides in zip(types, flags, strict=True))


def _with_sliding(blocks: dict[str, ParallelBlock], layer_types: tuple[str, ...],
                  window: int) -> dict[str, ParallelBlock]:
    """``blocks`` plus the ``@sliding`` variants ``layer_types`` names: every attention node
    (forward, recomputed forward, backward) scores each query against ``window`` keys with no
    causal mask (a query past the first ``window`` positions sees exactly the window; the
    first ``window`` queries of a sequence, fewer, are a rounding at training lengths)."""
    wanted = {t for t in layer_types if t.endswith(SLIDING_SUFFIX)} - set(blocks)
    if not wanted:
        return blocks
    from charon_search.passes._rewrite import subs_node

    def window_node(n: Node) -> Node:
        n = subs_node(n, c=float(window))  # kv_len, FLOPs and bytes at the window's keys
        return n.replace(params={**n.params, "causal": Poly.const(0.0)})

    def windowed(g: OpGraph | None) -> OpGraph | None:
        if g is None:
            return None
        return g.with_nodes([window_node(n) if n.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD)
                             else n for n in g.nodes])

    out = dict(blocks)
    for name in sorted(wanted):
        base = blocks[name.removesuffix(SLIDING_SUFFIX)]
        out[name] = ParallelBlock(name=name, forward=windowed(base.forward),
                                  backward=windowed(base.backward))
    return out


def layout_stage_layers(layer_types: tuple[str, ...], pp_layout: str) -> list[list[str]]:
    """Split the decoder layers over the virtual stages of a ``Layout.pp_layout``: each ``t``
    takes the next layer in order (the embedding and LM head go where ``stage_layers``'s
    callers put them, the first and last stage, as the layout requires)."""
    from charon_search.layout import pp_layout_stages

    out, k = [], 0
    for stage in pp_layout_stages(pp_layout):
        cnt = stage.count("t")
        out.append(list(layer_types[k:k + cnt]))
        k += cnt
    if k != len(layer_types):
        raise ConfigError(f"`pp_layout` must place every decoder layer ({len(layer_types)}), "
                          f"but {pp_layout!r} places {k}")
    return out


def _ep_a2a_byte_scale(spec: Any, cluster: ClusterSpec, layout: Layout,
                       strides: dict[str, int]) -> float:
    """Bytes a deduplicating EP dispatch/combine moves on its bottleneck tier, over the routed
    bytes (``tokens * top_k`` rows), for ``Layout.ep_node_dedup``; 1 otherwise.

    DeepEP-style kernels (DeepEP, Megatron-Core's flex dispatcher with DeepEP or HybridEP; the
    DeepSeek-V3 report sec. 3.2.2) send a token once per target node over the scale-out network
    and once per target rank over NVLink, however many of its experts that node or rank holds.

    - EP group across nodes: the scale-out tier bounds the all-to-all. Group-limited routing
      (HF config ``n_group`` expert groups, of which a token uses ``topk_group``; DeepSeek-V3
      report sec. 2.1.2: "each token will be sent to at most 4 nodes") with whole groups on
      each node sends a token to at most ``min(topk_group, nodes)`` nodes:
      ``min(topk_group, nodes) / top_k`` of the per-expert bytes.
    - EP group inside one NVLink domain: the expected number of distinct ranks a token's
      ``top_k`` experts live on, over ``top_k`` (``ep_distinct_ranks``).
    """
    if not getattr(layout, "ep_node_dedup", False) or layout.ep <= 1:
        return 1.0
    hf = dict(getattr(spec, "hf_config", {}) or {})
    n_group, topk_group = int(hf.get("n_group") or 0), int(hf.get("topk_group") or 0)
    top_k = int(getattr(spec, "num_experts_per_token", 0) or 0)
    experts = int(getattr(spec, "num_experts", 0) or 0)
    if not (top_k and experts):
        return 1.0
    node = rank_domains(cluster, layout.num_gpus)[0]  # the job's ranks per NVLink domain
    span = layout.ep * strides.get("ep", 1)
    if span <= node:
        return min(1.0, ep_distinct_ranks(experts, top_k, layout.ep, n_group, topk_group)
                   / top_k)
    if not (n_group and topk_group) or span % node:
        return 1.0
    nodes = span // node
    if n_group % nodes:
        return 1.0  # groups straddle nodes: no per-node bound
    return min(1.0, min(topk_group, nodes) / top_k)


def ep_distinct_ranks(experts: int, top_k: int, ep: int, n_group: int = 0,
                      topk_group: int = 0) -> float:
    """Expected number of distinct EP ranks that hold a token's ``top_k`` experts.

    ``experts`` are split evenly over ``ep`` ranks in order (rank r holds experts
    ``r*e .. r*e+e-1``, ``e = experts / ep``), the router picks ``topk_group`` of ``n_group``
    equal expert groups uniformly (``n_group = 0``: no group limit; groups that do not hold
    whole ranks' experts, or ranks whole groups, are treated as no limit) and then ``top_k``
    distinct experts uniformly among the chosen groups' ones: ``ep * P(a rank holds at least
    one)``. Closed form (hypergeometric over the groups a rank holds); no fitted value.
    """
    if experts <= 0 or top_k <= 0 or ep <= 1 or experts % ep:
        return float(min(top_k, max(ep, 1)))
    e = experts // ep
    if (not (n_group and topk_group) or experts % n_group or topk_group >= n_group
            or ((experts // n_group) % e and e % (experts // n_group))):
        # no group limit, or groups not aligned to ranks: the router's choice among all
        n_group, topk_group = 1, 1
    per_group = experts // n_group
    cand = topk_group * per_group  # experts of the chosen groups
    k = min(top_k, cand)

    def none_of(m: int) -> float:  # P(none of k draws among cand lands in m given experts)
        return math.comb(cand - m, k) / math.comb(cand, k) if cand - m >= k else 0.0

    if e <= per_group:
        # The rank's experts lie in one group, chosen with probability topk_group / n_group.
        p_none = 1 - topk_group / n_group + topk_group / n_group * none_of(e)
    else:
        h = e // per_group  # whole groups on the rank
        p_none = sum(math.comb(h, j) * math.comb(n_group - h, topk_group - j)
                     / math.comb(n_group, topk_group) * none_of(j * per_group)
                     for j in range(0, min(h, topk_group) + 1))
    return ep * (1 - p_none)


#: Blocks outside the checkpointed transformer layers: activation checkpointing wraps each
#: transformer layer only (Megatron ``TransformerBlock._checkpointed_forward`` over its layers,
#: the output layer and loss outside it; torchtitan ``apply_ac`` over ``model.layers``;
#: Composer / llm-foundry over the ``MPTBlock`` modules), so the embedding and the LM head with
#: its loss are never re-run, whatever the recompute mode.
UNCHECKPOINTED_BLOCKS = frozenset({"embedding", "lm_head"})


def _block_ctx(name: str, ctx: PassContext) -> PassContext:
    """The pass context of block ``name``: no recompute outside the transformer layers."""
    if name in UNCHECKPOINTED_BLOCKS and ctx.recompute != "none":
        return replace(ctx, recompute="none")
    return ctx


def _parallel_blocks(traced: Any, ctx: PassContext, key: tuple) -> dict[str, ParallelBlock]:
    with _CACHE_LOCK:
        hit = _PAR_CACHE.get(key)
        if hit is not None:
            _PAR_CACHE.move_to_end(key)
            return hit
    out = {name: parallelize_block(b, _block_ctx(name, ctx)) for name, b in traced.blocks.items()}
    with _CACHE_LOCK:
        _PAR_CACHE[key] = out
        while len(_PAR_CACHE) > _CACHE_SIZE:
            _PAR_CACHE.popitem(last=False)
    return out


def _traced_key(spec: Any, traced: Any) -> tuple:
    """Structural identity of a traced model (``trace_model`` may return equal copies)."""
    return (spec.name, getattr(traced, "phase", "train"), tuple(
        (name, len(blk.forward.nodes), len(blk.backward.nodes) if blk.backward else 0,
         blk.num_params)
        for name, blk in traced.blocks.items()))


def _layer_costs(pb: ParallelBlock, coster: GraphCoster, b: float, s: float, cluster: ClusterSpec,
                 layout: Layout, key: tuple, cost_model: Any
                 ) -> tuple[LayerCost, LayerCost | None, CostedGraph, CostedGraph | None]:
    with _CACHE_LOCK:
        hit = _LAYER_CACHE.get(key)
        if hit is not None and hit[0] is cost_model:
            _LAYER_CACHE.move_to_end(key)
            return hit[1]
    cal = cluster.calibration
    kw: dict[str, Any] = dict(compute_slowdown=cal.overlap_compute_slowdown,
                              comm_slowdown=cal.overlap_comm_slowdown,
                              fsdp_prefetch=layout.fsdp_prefetch,
                              fsdp_backward_prefetch=layout.fsdp_backward_prefetch)
    cf = coster.cost(pb.forward, b, s)
    fwd = layer_cost(cf, flops=pb.forward.total_flops(b, s), **kw)
    bwd = cb = None
    if pb.backward is not None:
        cb = coster.cost(pb.backward, b, s)
        bwd = layer_cost(cb, flops=pb.backward.total_flops(b, s), **kw)
    out = (fwd, bwd, cf, cb)
    with _CACHE_LOCK:
        _LAYER_CACHE[key] = (cost_model, out)
        while len(_LAYER_CACHE) > _CACHE_SIZE:
            _LAYER_CACHE.popitem(last=False)
    return out


def _model_flops_per_seq(traced: Any, spec: Any, s: float) -> float:
    """PaLM-convention model FLOPs of one sequence (see ``FLOPS_CONVENTION``)."""
    counts = {t: spec.num_layers_of(t) for t in spec.block_types}
    total = 0.0
    for name, blk in traced.blocks.items():
        mult = counts.get(name, 1)
        fwd = 0.0
        for n in blk.forward.nodes:
            if n.kind in (OpKind.GEMM, OpKind.GROUPED_GEMM):
                fwd += n.flops(1, s, s)
            elif n.kind == OpKind.ATTENTION:
                p = {k: v(1, s, s) for k, v in n.params.items()}
                fwd += 2 * p["batch"] * p["heads"] * p["q_len"] * p["kv_len"] * (
                    p["head_dim"] + p["v_head_dim"])
        total += 3 * fwd * mult
    return total


def _optimizer_node(numel: float, optimizer: str) -> OpGraph:
    per = ADAM_BYTES_PER_PARAM if optimizer == "adam" else SGD_BYTES_PER_PARAM
    node = Node(id=0, name="optimizer_step", kind=OpKind.OPTIMIZER, target="training",
                module_path="optimizer", role=Role.OPTIMIZER, phase=Phase.OPTIMIZER,
                flops=Poly.const(10 * numel),
                bytes_read=Poly.const(numel * (per - OPT_WRITE_BYTES[optimizer])),
                bytes_written=Poly.const(numel * OPT_WRITE_BYTES[optimizer]),
                params={"numel": Poly.const(numel)}, dtype="fp32")
    return OpGraph(name="optimizer", nodes=(node,), tensors={})


def _stage_imbalance_s(pipe: PipelineResult, bubble: float, *, schedule: str, p: int,
                       m: int, v: int, unit: Any, p2p_s: float, split_w: bool,
                       pair_overlap: bool, p2p_blocking: bool = False) -> float:
    """How much longer the pipeline runs because its stages cost unequal time.

    The same schedule is run again with every rank at the ranks' mean cost of each unit
    (chunk, F/B/W): the same work, evenly split. The difference of the two pipelines' makespans
    is what unequal stages (an embedding or LM-head stage, uneven layer counts, dense first
    layers) cost, within the critical rank's ``bubble``."""
    if p <= 1 or bubble <= 0:
        return 0.0
    kinds = sorted({(u.op.chunk, u.op.kind) for u in pipe.units})
    mean: dict[tuple[int, str], UnitCost] = {}
    for c, kind in kinds:
        parts = [unit(r, c, kind) for r in range(p)]
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        mean[(c, kind)] = total.scaled(1.0 / p)
    even = run_pipeline(schedule=schedule, p=p, m=m, v=v, cost=lambda r, c, k: mean[(c, k)],
                        p2p_s=p2p_s, split_w=split_w, pair_overlap=pair_overlap,
                        p2p_blocking=p2p_blocking)
    return min(max(max(pipe.rank_end_s) - max(even.rank_end_s), 0.0), bubble)


def simulate_training(model: Any, cluster: Any, layout: Layout | Mapping[str, Any], *,
                      num_gpus: int | None = None, cost_model: Any = None, traced: Any = None,
                      memory: bool = True, memory_options: Any = None) -> StepReport:
    """Simulate one training step.

    Args:
        model: ``ModelSpec`` or catalog name.
        cluster: ``ClusterSpec`` or cluster name.
        layout: the parallel layout and batch: a ``Layout``, or a mapping of its fields
            (``Layout.from_dict``: unknown keys and wrong kinds raise ``ConfigError``).
        num_gpus: checked against ``tp·pp·dp·cp`` when given.
        cost_model: object with ``cost_graph(graph, b, s, c)`` (default: the cluster's
            ``FusedCostModel``).
        traced: a ``TracedModel`` (default: ``frontend.trace_model(spec, "train")``, cached).
        memory: attach ``memory.memory_report(...)`` (skip it for timing-only sweeps).
        memory_options: the framework conventions of that report (``memory.report.
            MemoryOptions``; default: framework-neutral, ``frameworks.framework_layout`` gives a
            framework's).

    Example:
        >>> r = simulate_training("llama-3.1-8b", "h100-sxm-8gpu",  # doctest: +SKIP
        ...                       Layout(tp=8, global_batch_size=8, seq_len=8192))
        >>> r.step_time_s, r.mfu  # doctest: +SKIP
    """
    spec, cl = _resolve(model, cluster)
    layout = as_layout(layout, hint=" (simulate_training takes model, cluster, layout)")
    warnings = validate_layout(spec, layout, num_gpus)
    check_layout_on_cluster(layout, cl)
    if traced is None:
        from charon_search.frontend import trace_model
        dtype = "fp16" if layout.precision == "fp16" else "bf16"
        traced = trace_model(spec, phase="train", dtype=dtype)
    if cost_model is None:
        from charon_search.cost.selector import default_cost_model
        cost_model = default_cost_model(cl)
    L = layout
    p, m = L.pp, L.num_micro_batches
    dual = L.schedule == "dualpipe"
    v = 2 if dual else L.vpp
    b, s = float(L.micro_batch_size), float(L.seq_len)
    # ZeRO-3 under a pipeline gathers and reduce-scatters once per step, not per micro-batch:
    # torchtitan keeps the gathered parameters after the forward when pipelining
    # (``apply_fsdp``: ``reshard_after_forward = not pp_enabled``, "to avoid per-microbatch
    # all-gathers"), and PyTorch's pipelining runs every micro-batch's backward of an FSDP stage
    # with ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)``, then
    # reduce-scatters once after the last backward (``torch/distributed/pipelining/stage.py``,
    # ``backward_maybe_with_nosync`` and ``perform_reduce_grad``). The block graphs then carry
    # no FSDP traffic; the step charges one reduce-scatter per layer (as for ZeRO-2 under a
    # pipeline) and one parameter all-gather, overlapped with the first forward.
    fsdp_once = L.zero_stage == 3 and p > 1
    graph_zero = {"zero_stage": 2} if fsdp_once else {}
    ctx = PassContext.from_layout(L, **graph_zero)
    tkey = _traced_key(spec, traced)
    blocks = _parallel_blocks(traced, ctx, (tkey, ctx.key()))
    # Megatron --recompute-num-layers: only that many layers per chunk use full recompute.
    partial_rc = L.recompute == "full" and L.recompute_num_layers > 0
    plain_ctx = ctx if not partial_rc else PassContext.from_layout(L, recompute="none",
                                                                   **graph_zero)
    plain_blocks = blocks if not partial_rc else _parallel_blocks(
        traced, plain_ctx, (tkey, plain_ctx.key()))
    # Sliding-window attention layers (gpt-oss: every other layer, 128 keys) run their own
    # block variant whose attention scores each query against the window only.
    layer_types = sliding_layer_types(spec, L)
    blocks = _with_sliding(blocks, layer_types, spec.sliding_window)
    plain_blocks = _with_sliding(plain_blocks, layer_types, spec.sliding_window)
    sizes = {"tp": L.tp, "cp": L.cp, "dp": L.dp, "pp": L.pp, "ep": L.ep}
    strides = axis_strides(L.rank_order, sizes)
    # Gradients of dense weights are reduced over the dp·cp ranks holding the same shard.
    strides["dpcp"] = min(strides["cp"], strides["dp"]) if L.cp > 1 else strides["dp"]
    # HSDP: replicas of a shard group sit hsdp_shard DP ranks apart.
    strides["dp_rep"] = strides["dp"] * max(L.hsdp_shard, 1)
    # EP takes ep consecutive dp·cp ranks, so the ranks holding the same experts (the
    # expert-data-parallel group, dp·cp/ep of them) sit ep of those ranks apart.
    strides["edp"] = strides["dpcp"] * L.ep
    # The first and the last pipeline stage (tied embeddings' gradient all-reduce).
    strides["pp_ends"] = strides["pp"] * max(L.pp - 1, 1)
    concurrent = {ax: max(strides[ax], 1) for ax in strides}
    concurrent["pp_ends"] = max(strides["pp"], 1)  # one pair per pipeline, as for the sends
    world = L.tp * L.cp * L.dp * L.pp  # the slowest group of each axis is priced
    coster = GraphCoster(cl, cost_model, strides=strides, concurrent_groups=concurrent,
                         world_size=world,
                         attention_kernel=getattr(L, "attention_kernel", "flash"),
                         ep_a2a_scale=_ep_a2a_byte_scale(spec, cl, L, strides),
                         fp8_gemm_kernel=getattr(L, "fp8_gemm_kernel", "cutlass"))
    # Same-named clusters may differ (recalibrated copies): key on their content.
    cl_key = (cl.name, cl.gpu.name, cl.gpu.sustained_clock_ratio, coster.fp8_gemm_kernel,
              getattr(cl.gpu, "attention_kernel_gen", 2), coster.ep_a2a_scale,
              repr(cl.tiers),
              repr(cl.calibration))
    costs: dict[str, tuple[LayerCost, LayerCost | None]] = {}
    plain_costs: dict[str, tuple[LayerCost, LayerCost | None]] = {}
    costed: dict[str, tuple[CostedGraph, CostedGraph | None]] = {}
    for target, bset, c_ in ((costs, blocks, ctx), (plain_costs, plain_blocks, plain_ctx)):
        if target is plain_costs and not partial_rc:
            break
        for name, pb in bset.items():
            key = (tkey, c_.key(), name, b, s, cl_key, id(cost_model), tuple(
                sorted(strides.items())), world, L.fsdp_prefetch, L.fsdp_backward_prefetch)
            fl, bl, cf, cb = _layer_costs(pb, coster, b, s, cl, L, key, cost_model)
            target[name] = (fl, bl)
            if target is costs:
                costed[name] = (cf, cb)

    # ---------------------------------------------------------------- stage partition
    missing = sorted(set(layer_types) - set(blocks))
    if missing:
        raise ConfigError(f"traced model lacks blocks {missing}; has {sorted(blocks)}")
    nvs = p * v if not dual else p
    parts = (layout_stage_layers(layer_types, L.pp_layout) if L.pp_layout
             else stage_layers(layer_types, nvs))
    if dual:
        # rank r: chunk 0 = stage r, chunk 1 = stage p-1-r (parameters held twice).
        stage_blocks = [[list(parts[r]), list(parts[p - 1 - r])] for r in range(p)]
        first_pos = {(0, 0), (p - 1, 1)}
        last_pos = {(p - 1, 0), (0, 1)}
    else:
        stage_blocks = [[list(parts[c * p + r]) for c in range(v)] for r in range(p)]
        first_pos, last_pos = {(0, 0)}, {(p - 1, v - 1)}
    for r in range(p):
        for c in range(v):
            if (r, c) in first_pos and "embedding" in blocks:
                stage_blocks[r][c].insert(0, "embedding")
            if (r, c) in last_pos and "lm_head" in blocks:
                stage_blocks[r][c].append("lm_head")

    split_w = L.schedule in ("zero-bubble", "dualpipe")

    def unit(r: int, c: int, kind: str) -> UnitCost:
        counts: dict[str, int] = {}
        for name in stage_blocks[r][c]:
            counts[name] = counts.get(name, 0) + 1
        total = UnitCost()
        quota = L.recompute_num_layers if partial_rc else None
        for name, n in counts.items():
            fl, bl = costs[name]
            if kind == "F":
                total = total + fl.layers(n)
                continue
            if bl is None:
                continue
            if quota is None or name in ("embedding", "lm_head"):
                total = total + bl.layers(n)
                continue
            n_rc = min(n, quota)
            quota -= n_rc
            plain_bl = plain_costs[name][1]
            total = total + bl.layers(n_rc) + (plain_bl.layers(n - n_rc) if plain_bl else
                                                UnitCost())
        if split_w and kind in ("B", "W"):
            w = total.wgrad_s
            if kind == "W":
                return UnitCost(duration_s=w, compute_s=w, wgrad_s=w)
            return UnitCost(duration_s=max(total.duration_s - w, 0.0),
                            compute_s=max(total.compute_s - w, 0.0),
                            slowdown_s=total.slowdown_s, exposed_comm_s=total.exposed_comm_s,
                            hw_flops=total.hw_flops)
        return total

    act_bytes = b * s * spec.hidden_size * DTYPE_BYTES["bf16"] / L.cp / (
        L.tp if L.sequence_parallel else 1)
    # One stage-to-stage hop; the group size is the pipeline's p stages (a send/recv prices one
    # pair, the slowest hop between adjacent stages of the job).
    p2p_s = 0.0
    if p > 1 and L.pp_scatter_gather and L.tp > 1 and not L.sequence_parallel:
        # Megatron-LM's scatter/gather: 1/tp of the activation over the network, then an
        # all-gather inside the receiving stage's TP group (charged with the transfer).
        p2p_s = (coster.collective("send_recv", act_bytes / L.tp, p, "pp")[0]
                 + coster.collective("all_gather", act_bytes, L.tp, "tp")[0])
    elif p > 1:
        p2p_s = coster.collective("send_recv", act_bytes, p, "pp")[0]
    pipe = run_pipeline(schedule=L.schedule, p=p, m=m, v=v, cost=unit, p2p_s=p2p_s,
                        split_w=split_w,
                        pair_overlap=dual and L.moe_a2a_overlap,
                        p2p_blocking=L.pp_p2p_blocking)

    # ---------------------------------------------------------------- DP sync, optimizer
    dp_cp = L.dp * L.cp
    grad_b = DTYPE_BYTES[ctx.grad_reduce_dtype]
    cal = cl.calibration
    dp_intervals: list[tuple[int, str, float, float]] = []
    tail_intervals: list[tuple[int, str, str, float, float]] = []
    rank_step: list[float] = []
    rank_parts: list[dict[str, float]] = []
    lp_cache: dict[str, Any] = {}

    def lp(name: str) -> Any:
        if name not in lp_cache:
            base = name.removesuffix(SLIDING_SUFFIX)
            lp_cache[name] = local_params(traced.blocks[base].forward, tp=L.tp, ep=L.ep)
        return lp_cache[name]

    # Dense and expert states shard as the memory model shards them (``Layout.shard_groups``).
    dense_group, expert_group = L.shard_groups
    replicas = dp_cp // dense_group
    # HSDP replicates expert shards across the replica groups as it does dense ones.
    expert_replicas = max(dp_cp // L.ep // expert_group, 1)
    # ZeRO-2 keeps only its shard of the gradients, so without a pipeline every micro-batch's
    # backward reduce-scatters them (DeepSpeed stage 2, FSDP2 SHARD_GRAD_OP), not just the last
    # one. Under a pipeline (torchtitan, Llama 3's FSDP: "accumulate gradients in FP32 ... over
    # multiple micro-batches and also reduce-scatter gradients in FP32", arXiv 2407.21783
    # Sec. 3.3.4) the micro-batches accumulate unsharded gradients, as the memory model holds
    # them (``MemoryOptions.fsdp_no_sync_accumulation``), and reduce-scatter once.
    syncs = m if L.zero_stage == 2 and p == 1 else 1
    first_bwd: dict[tuple[int, int], float] = {}
    # (time the data-parallel sync ends, dense and expert parameters, DP overlap slowdown,
    # exposed DP sync) of each rank
    synced: list[tuple[float, float, float, float, float]] = []
    for u in pipe.units:
        if u.op.kind in ("B", "W"):
            key = (u.rank, u.op.chunk)
            first_bwd[key] = min(first_bwd.get(key, u.end_s), u.end_s)
    for r in range(p):
        rank_end = pipe.rank_end_s[r]
        dp_free = early_free = 0.0
        dense_numel = expert_numel = 0.0
        # (ready, seconds, name, chunk, FSDP tail) of every gradient bucket of the rank, over
        # all of its chunks.
        buckets: list[tuple[float, float, str, int, bool]] = []
        for c in range(v):
            names = stage_blocks[r][c]
            start, end = pipe.last_backward.get((r, c), (rank_end, rank_end))
            nl = max(len(names), 1)
            for i, name in enumerate(reversed(names)):
                prm = lp(name)
                dense_numel += prm.dense_numel
                expert_numel += prm.expert_numel
                ready = (start + (end - start) * (i + 1) / nl if L.dp_overlap_grad_reduce
                         else rank_end)
                t = 0.0
                if L.zero_stage != 3 or fsdp_once:
                    kind = "all_reduce" if L.zero_stage == 0 else "reduce_scatter"
                    t += coster.collective(kind, prm.dense_numel * grad_b, dense_group, "dpcp")[0]
                    t += coster.collective(kind, prm.expert_numel * grad_b, expert_group,
                                           "edp")[0]
                if L.zero_stage and replicas > 1:
                    t += coster.collective("all_reduce",
                                           prm.dense_numel * grad_b / dense_group,
                                           replicas, "dp_rep")[0]
                if L.zero_stage and expert_replicas > 1 and prm.expert_numel > 0:
                    t += coster.collective("all_reduce",
                                           prm.expert_numel * grad_b / expert_group,
                                           expert_replicas, "dp_rep")[0]
                if i == nl - 1 and names:
                    # ZeRO-3: the reduce-scatter of the chunk's last layer in backward order,
                    # issued after its final backward op, which the layer costs leave to the
                    # next layer (``LayerCost.dp_tail``): nothing follows it here. FSDP2's
                    # post-backward callback waits for it before the optimizer step.
                    bl = costs[name][1]
                    run = next((k for k, nm in enumerate(names) if nm != name), len(names))
                    tail = bl.dp_tail(run) if bl is not None else 0.0
                    if tail > 0:
                        buckets.append((end, tail, f"grad_sync_tail.{name}", c, True))
                if t > 0:
                    buckets.append((ready, t, name, c, False))
        # Megatron launches a chunk's bucket syncs when its last backward produces them, on one
        # DP communicator: they queue in the order they become ready, not in chunk order
        # (interleaved 1F1B and DualPipe finish chunk 0 last).
        buckets.sort(key=lambda bk: bk[0])
        for ready, t, name, c, is_tail in buckets:
            if is_tail:
                st = max(dp_free, ready)
                dp_free = st + t
                dp_intervals.append((r, name, st, dp_free))
                continue
            early_end = 0.0
            if syncs > 1:
                # The earlier micro-batches' reduce-scatters run behind the backward
                # passes that follow theirs, in a chain of their own.
                st = max(early_free, first_bwd.get((r, c), ready))
                early_free = early_end = st + (syncs - 1) * t
                dp_intervals.append((r, f"grad_sync_early.{name}", st, early_end))
            st = max(dp_free, ready, early_end)
            dp_free = st + t
            dp_intervals.append((r, f"grad_sync.{name}", st, dp_free))
        overlap = sum(max(0.0, min(e, rank_end) - s0) for rr, _, s0, e in dp_intervals
                      if rr == r)
        dp_slow = overlap * (cal.overlap_compute_slowdown - 1.0)
        exposed_dp = max(dp_free - rank_end, 0.0)
        synced.append((rank_end + dp_slow + exposed_dp, dense_numel, expert_numel, dp_slow,
                       exposed_dp))
    # Tied input and output embeddings on two pipeline ranks (Megatron ``finalize_model_grads``
    # -> ``_allreduce_word_embedding_grads``, after the data-parallel sync; DeepSpeed's
    # ``TiedLayerSpec`` alike): the first and the last stage all-reduce the word embedding's
    # gradient (their vocab shard, V x h / tp) before either can step its optimizer.
    tied_s = 0.0
    ends = (0, p - 1)
    tied_idle = [0.0] * p
    if (spec.tie_word_embeddings and p > 1 and not dual and "embedding" in stage_blocks[0][0]
            and "lm_head" in stage_blocks[p - 1][v - 1]):
        # (ZeRO-2/3 keep only their data-parallel shard of the gradient to all-reduce)
        shard = dense_group if L.zero_stage >= 2 else 1
        tied_s = coster.collective("all_reduce", spec.vocab_size * spec.hidden_size / L.tp
                                   * grad_b / shard, 2, "pp_ends")[0]
        start = max(synced[r][0] for r in ends)
        for r in ends:
            # the rank that finished first idles until the other can start the all-reduce
            tied_idle[r] = start - synced[r][0]
            synced[r] = (start + tied_s, *synced[r][1:])
            tail_intervals.append((r, "comm_tied", "tied_embedding_grad_all_reduce", start,
                                   start + tied_s))
    for r in range(p):
        t, dense_numel, expert_numel, dp_slow, exposed_dp = synced[r]
        sharded = L.zero_stage >= 1
        opt_numel = (dense_numel / dense_group + expert_numel / expert_group if sharded
                     else dense_numel + expert_numel)
        opt_s = float(coster.cost(_optimizer_node(opt_numel, L.optimizer), 1, 1)
                      .durations_s.sum()) if opt_numel > 0 else 0.0
        tail_intervals.append((r, "compute", "optimizer_step", t, t + opt_s))
        t += opt_s
        ag_exposed = 0.0
        if (L.zero_stage in (1, 2) or fsdp_once) and (dense_group > 1 or expert_group > 1):
            ag = (coster.collective("all_gather", dense_numel * DTYPE_BYTES["bf16"], dense_group,
                                    "dpcp")[0]
                  + coster.collective("all_gather", expert_numel * DTYPE_BYTES["bf16"],
                                      expert_group, "edp")[0])
            # Megatron's --overlap-param-gather hides it behind the next step's first forward
            # (pipelined FSDP: the first micro-batch's forward gathers, prefetching layers).
            first_f = unit(r, 0, "F").duration_s if L.fsdp_prefetch else 0.0
            ag_exposed = max(ag - first_f, 0.0)
            tail_intervals.append((r, "comm_dp", "param_all_gather", t, t + ag))
        t += ag_exposed + cal.iteration_cpu_overhead_s
        rank_step.append(t)
        rank_parts.append({"dp_slow": dp_slow, "exposed_dp": exposed_dp, "opt": opt_s,
                           "ag": ag_exposed, "tied": tied_s if r in ends else 0.0,
                           "tied_idle": tied_idle[r]})
    step = max(rank_step)
    crit = rank_step.index(step)

    # ---------------------------------------------------------------- breakdown and FLOPs
    mine = [u for u in pipe.units if u.rank == crit]
    busy = sum(u.end_s - u.start_s for u in mine)
    comp = sum(u.cost.compute_s for u in mine)
    slow = sum(u.cost.slowdown_s for u in mine) + rank_parts[crit]["dp_slow"]
    by_kind: dict[str, float] = {}
    for u in mine:
        for g, val in u.cost.exposed_comm_s:
            by_kind[g] = by_kind.get(g, 0.0) + val
    by_kind["dp"] = by_kind.get("dp", 0.0) + rank_parts[crit]["exposed_dp"]
    if rank_parts[crit]["ag"] > 0:
        by_kind["dp_param_gather"] = rank_parts[crit]["ag"]
    if rank_parts[crit]["tied"] > 0:
        by_kind["pp_tied_embedding"] = rank_parts[crit]["tied"]
    unit_exposed = sum(sum(v for _, v in u.cost.exposed_comm_s) for u in mine)
    # Unit durations may differ from their parts by overlap rounding; keep the sum exact.
    comp += max(busy - comp - sum(u.cost.slowdown_s for u in mine) - unit_exposed, 0.0)
    bubble = pipe.rank_end_s[crit] - busy + rank_parts[crit]["tied_idle"]
    imbalance = _stage_imbalance_s(pipe, bubble, schedule=L.schedule, p=p, m=m, v=v,
                                   unit=unit, p2p_s=p2p_s, split_w=split_w,
                                   pair_overlap=dual and L.moe_a2a_overlap,
                                   p2p_blocking=L.pp_p2p_blocking)
    breakdown = StepBreakdown(
        compute_s=comp, exposed_comm_s=sum(by_kind.values()),
        exposed_comm_by_kind_s={k: v for k, v in sorted(by_kind.items()) if v > 0},
        pipeline_bubble_s=max(bubble, 0.0), stage_imbalance_s=imbalance,
        overlap_slowdown_s=slow,
        optimizer_s=rank_parts[crit]["opt"], other_s=cal.iteration_cpu_overhead_s)
    replicas = L.tp * L.cp * L.dp
    hw_flops = sum(u.cost.hw_flops for u in pipe.units) * replicas
    model_flops = _model_flops_per_seq(traced, spec, s) * L.global_batch_size
    peak = cl.gpu.peak_flops("bf16")
    n = L.num_gpus
    tokens = L.global_batch_size * L.seq_len

    # ---------------------------------------------------------------- provenance shares
    counts = {t: layer_types.count(t) for t in set(layer_types)}
    prov_s: dict[str, float] = {}
    for name, (cf, cb) in costed.items():
        mult = counts.get(name, 1) * m
        for cg in (cf, cb):
            if cg is None:
                continue
            for d, pv in zip(cg.durations_s, cg.provenance, strict=True):
                prov_s[pv or "other"] = prov_s.get(pv or "other", 0.0) + float(d) * mult
    tot = sum(prov_s.values()) or 1.0
    sources = {k: v / tot for k, v in sorted(prov_s.items())}

    mem = None
    try:
        if memory:
            from charon_search.memory import memory_report
            mem = memory_report(spec, L, cl, options=memory_options).to_dict()
    except ImportError:
        warnings.append("memory model not importable; StepReport.memory is None")
    except Exception as e:
        warnings.append(f"memory model failed: {type(e).__name__}: {e}")

    timeline = StepTimeline(pipeline=pipe, dp_intervals=dp_intervals,
                            tail_intervals=tail_intervals, layer_costs=costs,
                            stage_blocks=stage_blocks, costed_graphs=costed,
                            block_shape=(b, s))
    return StepReport(
        model=spec.name, cluster=cl.name, num_gpus=n, layout=L.to_dict(), step_time_s=step,
        tokens_per_step=tokens, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / n,
        model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops,
        mfu=model_flops / (step * n * peak), hfu=hw_flops / (step * n * peak),
        breakdown=breakdown, stage_times_s=tuple(pipe.rank_end_s),
        stage_busy_s=tuple(sum(u.end_s - u.start_s for u in pipe.units if u.rank == r)
                           for r in range(p)),
        micro_batches_in_flight=tuple(pipe.max_in_flight), num_micro_batches=m,
        cost_sources=sources,
        layer_times_s={name: {"forward_s": fl.period.duration_s,
                              "backward_s": bl.period.duration_s if bl is not None else 0.0}
                       for name, (fl, bl) in costs.items()},
        warnings=tuple(warnings), memory=mem, timeline=timeline)
