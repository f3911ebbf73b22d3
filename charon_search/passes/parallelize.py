"""Apply the pass pipeline to traced blocks: ``parallelize_block`` (training) and
``parallelize_inference`` (serving)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from charon_search.errors import ConfigError
from charon_search.ir import OpGraph, TracedBlock
from charon_search.passes.base import PASSES, PassContext, PassManager

if TYPE_CHECKING:
    pass

__all__ = ["DEFAULT_PASSES", "ParallelBlock", "parallelize_block", "parallelize_inference"]

#: The default pipeline (the manager orders it by the declared constraints).
DEFAULT_PASSES: tuple[str, ...] = (
    "fusion", "eager_attention", "eager_norm", "mla_rope", "fused_loss", "fp8", "tp", "ep", "cp",
    "recompute", "fsdp", "grad_accum", "async_tp", "moe_overlap",
)


@dataclass(frozen=True, kw_only=True)
class ParallelBlock:
    """One block after the passes: the per-rank forward (and backward) graph."""

    name: str
    forward: OpGraph
    backward: OpGraph | None = None


#: Overlap rewrites the backward's ``forward_graph`` is taken before (``parallelize_block``):
#: async TP's matmul chunks and the MoE all-to-all overlap's quarters.
_OVERLAP_PASSES: tuple[str, ...] = ("async_tp", "moe_overlap")


def _manager(names: Sequence[str] | None, debug: bool) -> PassManager:
    chosen = [n for n in (DEFAULT_PASSES if names is None else names) if n in PASSES]
    return PassManager(passes=chosen, debug=debug)


def parallelize_block(block: TracedBlock, ctx: PassContext,
                      passes: Sequence[str] | None = None) -> ParallelBlock:
    """Run the pass pipeline over a traced block's forward, then its backward graph.

    The backward sees the rewritten forward in ``meta["forward_graph"]`` (recompute and FSDP
    use it) and the forward's TP-sharded tensor ids (saved activations keep their sharding).
    That forward is taken before ``async_tp``: the recompute policy picks ops of the program as
    traced (torch.compile applies the checkpoint policy when it traces and partitions the
    block, and the micro-pipeline TP pass rewrites the forward and the backward graphs after
    that, ``torch/_inductor/fx_passes/micro_pipeline_tp.py``), and ``async_tp`` then
    pipelines the backward's own collectives, re-run gathers included.
    """
    pm = _manager(passes, ctx.debug)
    fwd_in = block.forward.with_nodes(block.forward.nodes,
                                      meta={**block.forward.meta, "direction": "forward"})
    fwd = pm.run(fwd_in, ctx, snapshot_before=_OVERLAP_PASSES)
    # the graph before the first overlap rewrite that ran (snapshots keep the run order)
    fwd_traced = next(iter(pm.snapshots.values()), fwd)
    bwd = None
    if block.backward is not None:
        meta: dict[str, Any] = {**block.backward.meta, "direction": "backward",
                                "forward_graph": fwd_traced,
                                "tp_sharded_inputs": fwd.meta.get("tp_sharded_inputs", ())}
        bwd_in = block.backward.with_nodes(block.backward.nodes, meta=meta)
        bwd = pm.run(bwd_in, ctx)
        bwd = bwd.with_nodes(bwd.nodes, meta={k: v for k, v in bwd.meta.items()
                                               if k != "forward_graph"})
    return ParallelBlock(name=block.name, forward=fwd, backward=bwd)


def parallelize_inference(traced_model: Any, *, tp: int = 1, ep: int = 1, pp: int = 1,
                          sequence_parallel: bool = False,
                          passes: Sequence[str] | None = None,
                          ep_dispatch_bytes: float = 0.0) -> dict[str, OpGraph]:
    """TP/EP-shard the forward graphs of a traced prefill or decode model (for serving).

    Args:
        traced_model: ``frontend.trace_model(spec, phase="prefill"|"decode")`` output (any
            object with ``.blocks: Mapping[str, TracedBlock]``).
        tp: tensor-parallel degree (Megatron column/row sharding; heads and KV heads ÷ tp).
        ep: expert-parallel degree (dispatch/combine all-to-alls around the expert GEMMs).
        pp: pipeline degree. Blocks are per layer, so PP does not change them; the caller
            puts ``num_layers / pp`` layers on each stage and adds the stage hand-off.
        sequence_parallel: all-gather / reduce-scatter instead of all-reduce.
        ep_dispatch_bytes: bytes per value the EP dispatches move (0: the activation's dtype;
            ``PassContext.ep_dispatch_bytes``).

    Returns:
        ``{block name: per-rank forward OpGraph}`` with comm nodes (``group`` ``tp``/``ep``,
        ``params["bytes"]`` = message bytes per rank, ``params["group_size"]``). Price comm
        nodes with ``cost.collectives.collective_time(kind, bytes, group_size, cluster,
        stride=...)`` (TP stride 1) and compute nodes with the cost model.

    Example:
        >>> tm = trace_model(load_model("llama-3.1-8b"), phase="decode")  # doctest: +SKIP
        >>> graphs = parallelize_inference(tm, tp=4)  # doctest: +SKIP
    """
    if pp < 1 or tp < 1 or ep < 1:
        raise ConfigError(f"`tp, ep, pp >= 1` must hold, but got (tp={tp}, ep={ep}, pp={pp})")
    spec = getattr(traced_model, "spec", None)
    if spec is not None:
        if spec.num_attention_heads % tp:
            raise ConfigError(f"`tp` must divide num_attention_heads, but got "
                              f"(tp={tp}, num_attention_heads={spec.num_attention_heads})")
        if ep > 1 and (not spec.is_moe or spec.num_experts % ep):
            raise ConfigError(f"`ep` must divide num_experts of a MoE model, but got "
                              f"(ep={ep}, num_experts={spec.num_experts})")
    phase = getattr(traced_model, "phase", "prefill")
    ctx = PassContext(phase=phase if phase != "train" else "prefill", tp=tp, ep=ep,
                      dp=max(ep, 1), sequence_parallel=sequence_parallel and tp > 1,
                      recompute="none", ep_dispatch_bytes=ep_dispatch_bytes)
    blocks: Mapping[str, TracedBlock] = traced_model.blocks
    names = [n for n in (DEFAULT_PASSES if passes is None else passes)
             if n not in ("recompute", "fsdp", "grad_accum")]
    return {name: parallelize_block(TracedBlock(name=b.name, forward=b.forward), ctx,
                                    names).forward for name, b in blocks.items()}
