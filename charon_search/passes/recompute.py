"""Activation recompute: forward ops re-inserted at the start of the backward graph.

* ``selective`` (Korthikanti et al., arXiv 2205.05198, section 5): the attention core
  (role ``attn.core``: scores, softmax, dropout, context / the fused attention kernel).
* ``selective`` with ``selective_policy="op"`` (torchtitan's op-level selective activation
  checkpointing, ``_custom_policy`` in torchtitan ``parallelize_llama.py``, 2024): the outputs
  of matmuls, attention kernels and reduce-scatters are saved, except every second matmul
  (forward order); everything else (norms, RoPE, activations, elementwise ops, copies) and
  those matmuls are re-run.
* ``full``: the whole block forward, collectives included (Megatron ``--recompute-granularity
  full``).

The backward graph must carry its (already rewritten) forward graph in
``meta["forward_graph"]`` (``parallelize_block`` puts it there). Recomputed nodes get phase
``recompute``, fresh ids and fresh output tensors; backward readers of the original outputs
read the recomputed ones.
"""

from __future__ import annotations

from charon_search.errors import PassError
from charon_search.ir import Node, OpGraph, OpKind, Phase, Role
from charon_search.passes._rewrite import GraphBuilder
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before

__all__ = ["RecomputePass"]


_SAVED_KINDS = frozenset({OpKind.ATTENTION, OpKind.GROUPED_GEMM, OpKind.EMBEDDING})


def _op_sac(fwd: OpGraph) -> list[Node]:
    """torchtitan op-level SAC: recompute non-saved ops and every second (even) matmul."""
    out, mm = [], 0
    for n in fwd.nodes:
        if n.is_comm or n.kind in _SAVED_KINDS or n.target.startswith("pass:"):
            continue
        if n.kind == OpKind.GEMM:
            mm += 1
            if mm % 2:
                continue
        out.append(n)
    return out


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
        elif ctx.selective_policy == "op":
            chosen = _op_sac(fwd)
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
        # Tensors the passes inserted into the forward (collective / cast outputs) have ids of
        # the forward graph that may name a different tensor of the backward graph: such
        # forward tensors get fresh ids here. Saved activations (backward inputs) keep theirs.
        bwd_made = {t for n in graph.nodes for t in n.outputs}
        bwd_in = set(graph.inputs)
        relabel: dict[int, int] = {}

        def fwd_id(t: int) -> int:
            if t in bwd_made and t not in bwd_in:
                if t not in relabel:
                    relabel[t] = gb.new_tensor(fwd.tensors[t])
                return relabel[t]
            return t

        for n in chosen:
            outs = tuple(gb.new_tensor(fwd.tensors[t]) for t in n.outputs)
            new = n.replace(id=gb.fresh_id(), name=gb.unique_name(f"recompute_{n.name}"),
                            phase=Phase.RECOMPUTE, outputs=outs,
                            inputs=tuple(fwd_id(t) for t in n.inputs),
                            tags=n.tags | {"recompute"})
            gb.add(new)
            for old, t in zip(n.outputs, outs, strict=True):
                gb.rename[fwd_id(old)] = t
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
