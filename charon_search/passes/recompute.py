"""Activation recompute: forward ops re-inserted at the start of the backward graph.

* ``selective`` (Korthikanti et al., arXiv 2205.05198, section 5): the attention core
  (role ``attn.core``: scores, softmax, dropout, context / the fused attention kernel).
* ``full``: the whole block forward, collectives included (Megatron ``--recompute-granularity
  full``).

The backward graph must carry its (already rewritten) forward graph in
``meta["forward_graph"]`` (``parallelize_block`` puts it there). Recomputed nodes get phase
``recompute``, fresh ids and fresh output tensors; backward readers of the original outputs
read the recomputed ones.
"""

from __future__ import annotations

from charon_search.errors import PassError
from charon_search.ir import OpGraph, Phase, Role
from charon_search.passes._rewrite import GraphBuilder
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before

__all__ = ["RecomputePass"]


@PASSES.register("recompute")
class RecomputePass(Pass):
    name = "recompute"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.recompute != "none" and ctx.phase == "train"

    def requires(self, graph: OpGraph, ctx: PassContext) -> None:
        if graph.meta.get("direction", "backward") == "forward":
            return
        if "forward_graph" not in graph.meta:
            raise PassError(f"recompute: backward graph {graph.name!r} lacks "
                            "meta['forward_graph']")

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        if graph.meta.get("direction", "backward") == "forward":
            return PassResult(graph, False)
        fwd: OpGraph = graph.meta["forward_graph"]
        if ctx.recompute == "full":
            chosen = list(fwd.nodes)
        else:
            chosen = [n for n in fwd.nodes if n.role == Role.ATTN_CORE]
        if not chosen:
            return PassResult(graph, False)
        gb = GraphBuilder(graph)
        # Fresh ids must not collide with the forward graph either.
        fid, ftid = fwd.next_ids()
        gb.next_node_id = max(gb.next_node_id, fid)
        gb.next_tensor_id = max(gb.next_tensor_id, ftid)
        gb.names |= {n.name for n in fwd.nodes}
        for t, spec in fwd.tensors.items():
            gb.tensors.setdefault(t, spec)
        for n in chosen:
            outs = tuple(gb.new_tensor(fwd.tensors[t]) for t in n.outputs)
            new = n.replace(id=gb.fresh_id(), name=gb.unique_name(f"recompute_{n.name}"),
                            phase=Phase.RECOMPUTE, outputs=outs,
                            tags=n.tags | {"recompute"})
            gb.add(new)
            for old, t in zip(n.outputs, outs, strict=True):
                gb.rename[old] = t
        for n in graph.nodes:
            gb.add(n)
        # Recomputed nodes read forward tensors: make them visible as graph inputs.
        produced = {t for n in gb.nodes for t in n.outputs}
        extra = tuple(sorted({t for n in gb.nodes for t in n.inputs
                              if t not in produced and t not in graph.inputs}))
        out = gb.finish()
        out = out.with_nodes(out.nodes, inputs=graph.inputs + extra)
        return PassResult(out, True)


for _before in ("tp", "cp", "ep", "fusion", "fp8"):
    must_run_before(_before, "recompute")
