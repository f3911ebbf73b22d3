"""Context parallelism: every op runs on ``s/cp`` query tokens; attention exchanges K/V.

Algorithms (``PassContext.cp_algo``):

* ``ring`` - ring attention with zigzag load balancing for causal masks (each rank holds chunks
  ``i`` and ``2cp-1-i``, so every rank does 1/cp of the causal work). K/V chunks travel over
  ``cp-1`` P2P steps overlapped with the attention chunks (the comm node does not gate the
  attention; the layer's next op waits for it). Backward passes K/V and dK/dV (2x the bytes).
  ``cp_ring_impl="torch_traced"``: PyTorch's ``context_parallel`` (torch 2.5-2.7,
  ``torch/distributed/tensor/experimental/_attention.py``) as torch.compile traces it (torchtitan
  compiles each block, ``fullgraph=True``): the forward all-gathers K/V of all ranks once
  (``_RotateMethod.ALL_GATHER``, the default of ``_cp_options`` and of torchtitan's
  ``context_parallel_rotate_method``), the backward all-gathers them again and passes the dK/dV
  accumulators (fp32: ``_cp_options.convert_to_f32 = True``) to the next rank after each of
  the ``cp`` steps (``_AllToAllRotater``). Traced functional collectives are waited on right
  after they are issued (``_functional_collectives._maybe_wrap_tensor``: ``wait_tensor`` when
  tracing) and inductor does not move the waits by default
  (``reorder_for_compute_comm_overlap=False``), so none of them overlaps the attention kernels.
  Not modelled: the fp32 ``_SDPAMerger`` updates (inductor fuses them into a few memory-bound
  kernels, ~2 % of the attention time at 128k).
* ``cp_repeat_kv``: the model repeats K/V to the query-head count before SDPA (torchtitan's
  Llama ``repeat_kv``, 2024-25), so the exchanged K/V and dK/dV have ``heads`` heads.
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


def _kv_bytes(node: Node, dtype_bytes: float, *, full: bool, repeat: bool = False,
              dims: tuple[str, ...] = ("head_dim", "v_head_dim")) -> Poly:
    """K+V bytes of the local sequence chunk (``full``: of the whole context; ``repeat``: at
    the query-head count; ``dims``: which of K (``head_dim``) and V (``v_head_dim``))."""
    p = node.params
    tokens = p["kv_len"] if full else p["q_len"]
    width = sum((p[d] for d in dims), Poly())
    return p["batch"] * tokens * p["heads" if repeat else "kv_heads"] * width * dtype_bytes


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
            if algo == "ring" and ctx.cp_ring_impl == "torch_traced":
                self._torch_traced(gb, node, new, ctx, dtb, bwd)
            elif algo == "ring":
                nbytes = _kv_bytes(new, dtb, full=False, repeat=ctx.cp_repeat_kv) \
                    * (cp - 1) * (2 if bwd else 1)
                ring = gb.add_comm(OpKind.SEND_RECV, group="cp", group_size=cp, nbytes=nbytes,
                                   reads=node.inputs[1:3] or node.inputs, like=None, phase=ph,
                                   module_path=mp, name=f"cp_ring_{node.name}",
                                   rewire=False, tags=("overlap",))
                added = gb.add(new)
                # The attention's outputs are complete once the last K/V chunk has arrived.
                self._gate_outputs(gb, added, ring)
            elif algo == "allgather":
                nbytes = _kv_bytes(new, dtb, full=True, repeat=ctx.cp_repeat_kv)
                ag = gb.add_comm(OpKind.ALL_GATHER, group="cp", group_size=cp, nbytes=nbytes,
                                 reads=node.inputs[1:3] or node.inputs, like=None, phase=ph,
                                 module_path=mp, name=f"cp_all_gather_{node.name}",
                                 rewire=False)
                added = gb.add(new.replace(inputs=(*new.inputs, ag)))
                if bwd:
                    # dK and dV of the whole context go back to their owners, each at its
                    # own width (one output without the split: both).
                    outs = added.outputs[1:3]
                    grads = (list(zip(outs, (("head_dim",), ("v_head_dim",)), strict=False))
                             if outs else [(t, ("head_dim", "v_head_dim"))
                                           for t in added.outputs])
                    for t, dims in grads:
                        gb.add_comm(OpKind.REDUCE_SCATTER, group="cp", group_size=cp,
                                    nbytes=_kv_bytes(new, dtb, full=True,
                                                     repeat=ctx.cp_repeat_kv, dims=dims),
                                    reads=(t,), like=t, phase=ph,
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
    def _torch_traced(gb: GraphBuilder, node: Node, new: Node, ctx: PassContext, dtb: float,
                      bwd: bool) -> None:
        """PyTorch's ring attention traced by torch.compile (module docstring): exposed K/V
        all-gather before the kernel; after a backward kernel, ``cp`` fp32 dK/dV hops."""
        cp, mp, ph = ctx.cp, node.module_path, node.phase
        rep = ctx.cp_repeat_kv
        ag = gb.add_comm(OpKind.ALL_GATHER, group="cp", group_size=cp,
                         nbytes=_kv_bytes(new, dtb, full=False, repeat=rep) * cp,
                         reads=node.inputs[1:3] or node.inputs, like=None, phase=ph,
                         module_path=mp, name=f"cp_all_gather_{node.name}", rewire=False)
        added = gb.add(new.replace(inputs=(*new.inputs, ag)))
        if not bwd:
            return
        outs = added.outputs[1:3]
        for t, dim in zip(outs, ("head_dim", "v_head_dim"), strict=False):
            hops = _kv_bytes(new, DTYPE_BYTES["fp32"], full=False, repeat=rep, dims=(dim,))
            gb.add_comm(OpKind.SEND_RECV, group="cp", group_size=cp, nbytes=hops * cp,
                        reads=(t,), like=t, phase=ph, module_path=mp,
                        name=f"cp_dkv_ring_{node.name}")

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
