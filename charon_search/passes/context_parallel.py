"""Context parallelism: every op runs on ``s/cp`` query tokens; attention exchanges K/V.

Algorithms (``PassContext.cp_algo``):

* ``ring`` - ring attention with zigzag load balancing for causal masks (each rank holds chunks
  ``i`` and ``2cp-1-i``, so every rank does 1/cp of the causal work). K/V chunks travel over
  ``cp-1`` P2P steps overlapped with the attention chunks (the comm node does not gate the
  attention; the layer's next op waits for it). Backward passes K/V and dK/dV (2x the bytes).
* ``allgather`` - Llama 3 style (arXiv 2407.21783, section 3.3.2): all-gather K/V before
  attention, reduce-scatter dK/dV after its backward (K/V re-gathered for the backward).
* ``ulysses`` - DeepSpeed-Ulysses (arXiv 2309.14509): all-to-all from sequence to head sharding
  before attention and back after it.

Runs after TP/EP so the collectives those passes inserted are scaled to ``s/cp`` too.
"""

from __future__ import annotations

from charon_search.ir import DTYPE_BYTES, Node, OpGraph, OpKind, Phase, Poly, sym
from charon_search.passes._rewrite import GraphBuilder, scale_node, subs_node
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before

__all__ = ["ContextParallelPass"]

_ATTN = (OpKind.ATTENTION, OpKind.ATTENTION_BWD)


def _kv_bytes(node: Node, dtype_bytes: float, *, full: bool) -> Poly:
    """K+V bytes of the local sequence chunk (``full``: of the whole context)."""
    p = node.params
    tokens = p["kv_len"] if full else p["q_len"]
    return p["batch"] * tokens * p["kv_heads"] * (p["head_dim"] + p["v_head_dim"]) * dtype_bytes


def _ulysses_bytes(node: Node, dtype_bytes: float) -> tuple[Poly, Poly]:
    """(q+k+v, o) bytes of the local sequence chunk; ``node`` holds cp-th of the heads over the
    full sequence, which is the same element count."""
    p = node.params
    tok = p["batch"] * p["q_len"] * dtype_bytes
    qkv = tok * (p["heads"] * p["head_dim"] + p["kv_heads"] * (p["head_dim"] + p["v_head_dim"]))
    return qkv, tok * p["heads"] * p["v_head_dim"]


@PASSES.register("cp")
class ContextParallelPass(Pass):
    name = "cp"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.cp > 1

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        cp, algo = ctx.cp, ctx.cp_algo
        dtb = DTYPE_BYTES[ctx.act_dtype]
        gb = GraphBuilder(graph)
        s_local = sym("s") / cp
        for node in graph.nodes:
            if node.kind in _ATTN and algo == "ulysses":
                # Full sequence, cp-th of the heads: the all-to-alls reshard around the kernel.
                new = scale_node(node, cp)
            else:
                new = subs_node(node, s=s_local)
            if node.kind not in _ATTN:
                gb.add(new)
                continue
            bwd = node.kind == OpKind.ATTENTION_BWD
            mp, ph = node.module_path, node.phase
            if algo == "ring":
                nbytes = _kv_bytes(new, dtb, full=False) * (cp - 1) * (2 if bwd else 1)
                ring = gb.add_comm(OpKind.SEND_RECV, group="cp", group_size=cp, nbytes=nbytes,
                                   reads=node.inputs[1:3] or node.inputs, like=None, phase=ph,
                                   module_path=mp, name=f"cp_ring_{node.name}",
                                   rewire=False, tags=("overlap",))
                added = gb.add(new)
                # The attention's outputs are complete once the last K/V chunk has arrived.
                self._gate_outputs(gb, added, ring)
            elif algo == "allgather":
                nbytes = _kv_bytes(new, dtb, full=True)
                ag = gb.add_comm(OpKind.ALL_GATHER, group="cp", group_size=cp, nbytes=nbytes,
                                 reads=node.inputs[1:3] or node.inputs, like=None, phase=ph,
                                 module_path=mp, name=f"cp_all_gather_{node.name}",
                                 rewire=False)
                added = gb.add(new.replace(inputs=(*new.inputs, ag)))
                if bwd:
                    for t in added.outputs[1:3] or added.outputs:
                        gb.add_comm(OpKind.REDUCE_SCATTER, group="cp", group_size=cp,
                                    nbytes=nbytes, reads=(t,), like=t, phase=ph,
                                    module_path=mp, name=f"cp_reduce_scatter_{node.name}")
            else:  # ulysses: fwd moves q,k,v in and o out; bwd moves do in and dq,dk,dv out
                qkv, o = _ulysses_bytes(new, dtb)
                before = gb.add_comm(OpKind.ALL_TO_ALL, group="cp", group_size=cp,
                                     nbytes=o if bwd else qkv, reads=node.inputs, like=None,
                                     phase=ph, module_path=mp, name=f"cp_a2a_in_{node.name}",
                                     rewire=False)
                added = gb.add(new.replace(inputs=(*new.inputs, before)))
                for t in added.outputs[:1]:
                    gb.add_comm(OpKind.ALL_TO_ALL, group="cp", group_size=cp,
                                nbytes=qkv if bwd else o, reads=(t,), like=t,
                                phase=ph, module_path=mp, name=f"cp_a2a_out_{node.name}")
        return PassResult(gb.finish(meta={"cp": cp, "cp_algo": algo}), True)

    @staticmethod
    def _gate_outputs(gb: GraphBuilder, node: Node, comm_out: int) -> None:
        """Make readers of ``node``'s outputs also wait for ``comm_out`` (a zero-cost join)."""
        for t in node.outputs[:1]:
            spec = gb.tensors[t]
            joined = gb.new_tensor(spec)
            gb.nodes.append(Node(
                id=gb.fresh_id(), name=gb.unique_name(f"cp_join_{node.name}"),
                kind=OpKind.OTHER, target="pass:cp", module_path=node.module_path,
                role=node.role,
                phase=node.phase if node.phase != Phase.OPTIMIZER else Phase.FORWARD,
                inputs=(t, comm_out), outputs=(joined,)))
            gb.rename[t] = joined


for _before in ("tp", "ep", "fusion", "fp8"):
    must_run_before(_before, "cp")
