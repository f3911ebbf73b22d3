"""ZeRO-3 / FSDP inside the block graphs: per-layer parameter all-gather before the forward and
again before the backward, and a reduce-scatter of the gradients after the backward.

The all-gather has no data dependency, so the engine starts it as soon as the ``dp`` stream is
free, i.e. prefetched during the previous layer (``fsdp_prefetch``); without prefetch the
simulator chains it behind the previous layer (see ``sim.layer``). Message sizes: the gathered
bf16 parameters of the layer's TP/EP shard, and its fp32 gradients (torchtitan's default
``reduce_dtype=float32``). With HSDP the group is ``hsdp_shard`` ranks and the replica
all-reduce is issued once per step by the step simulator.

DDP and ZeRO-1/2 gradient traffic is once per step (after the last micro-batch), so it lives in
the step simulator (``sim.step``), not in the per-micro-batch block graphs.
"""

from __future__ import annotations

from charon_search.ir import DTYPE_BYTES, OpGraph, OpKind, Phase
from charon_search.layout import shard_groups
from charon_search.passes._rewrite import GraphBuilder, gemm_kind
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before
from charon_search.passes.params import local_params

__all__ = ["FullyShardedPass"]


@PASSES.register("fsdp")
class FullyShardedPass(Pass):
    name = "fsdp"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.zero_stage == 3 and ctx.phase == "train" and ctx.dp * ctx.cp > 1

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        backward = graph.meta.get("direction") == "backward"
        fwd = graph.meta.get("forward_graph", graph) if backward else graph
        lp = local_params(fwd, tp=ctx.tp, ep=ctx.ep)
        if lp.numel <= 0:
            return PassResult(graph, False)
        # Dense weights over dp·cp ranks, routed experts over the expert-data-parallel group
        # (``layout.shard_groups``, the memory model's rule). The ``axis:`` tag names the mesh
        # axis whose rank spacing prices each collective.
        dense, expert = shard_groups(dp=ctx.dp, cp=ctx.cp, ep=ctx.ep, hsdp_shard=ctx.hsdp_shard)
        shards = [(lp.dense_numel, dense, "dpcp"), (lp.expert_numel, expert, "edp")]
        shards = [(numel, group, axis) for numel, group, axis in shards
                  if numel > 0 and group > 1]
        if not shards:
            return PassResult(graph, False)
        gb = GraphBuilder(graph)
        gathers = tuple(gb.add_comm(
            OpKind.ALL_GATHER, group="dp", group_size=group,
            nbytes=numel * DTYPE_BYTES[ctx.param_gather_dtype], reads=(), like=None,
            phase=Phase.BACKWARD if backward else Phase.FORWARD, module_path="",
            name="fsdp_all_gather_bwd" if backward else "fsdp_all_gather", rewire=False,
            tags=("fsdp", f"axis:{axis}")) for numel, group, axis in shards)
        params = set(graph.param_tensors) | set(fwd.param_tensors)
        grads: list[int] = []
        for n in graph.nodes:
            if any(t in params for t in n.inputs):
                n = n.replace(inputs=(*n.inputs, *gathers))
            added = gb.add(n)
            if backward and n.kind in (OpKind.GEMM, OpKind.GROUPED_GEMM) and (
                    gemm_kind(n) == "wgrad" or n.kind == OpKind.GROUPED_GEMM):
                grads.extend(added.outputs)
        if backward:
            for numel, group, axis in shards:
                gb.add_comm(OpKind.REDUCE_SCATTER, group="dp", group_size=group,
                            nbytes=numel * DTYPE_BYTES[ctx.grad_reduce_dtype],
                            reads=tuple(grads), like=None, phase=Phase.BACKWARD,
                            name="fsdp_reduce_scatter", rewire=False,
                            tags=("fsdp", f"axis:{axis}"))
                # FSDP2 reduce-scatters on its own stream, so the next layer's all-gather
                # (prefetch) does not queue behind this layer's gradients.
                gb.nodes[-1] = gb.nodes[-1].replace(stream="comm_dp_rs")
        return PassResult(gb.finish(), True)


for _before in ("tp", "cp", "ep", "recompute", "fusion", "fp8"):
    must_run_before(_before, "fsdp")
