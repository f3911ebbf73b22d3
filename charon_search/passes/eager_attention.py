"""Unfused ("eager") attention core, as Megatron-LM ran it before flash attention.

Megatron-LM's ``CoreAttention`` (Shoeybi et al. 2019; used by the SC21 runs, Narayanan et al.
arXiv 2104.04473, and by Korthikanti et al. arXiv 2205.05198, which predate ``--use-flash-attn``
of 2023) computes, per (micro-batch, head):

forward
    ``scores = Q K^T`` (``baddbmm``), ``FusedScaleMaskSoftmax`` over the full ``s x c`` score
    matrix (the causal kernel still reads and writes all of it), attention dropout (writes the
    probabilities and a 1-byte mask), ``context = P V`` (``bmm``);
backward
    ``dP = dO V^T``, ``dV = P^T dO``, dropout backward, softmax backward (reads ``y`` and
    ``dy``, writes ``dx``), ``dQ = dS K``, ``dK = dS^T Q``.

Unlike flash attention nothing skips the masked half and the ``s x c`` matrices go through HBM,
so the attention core is memory bound at long sequence and costs ~3x its flash counterpart at
s = 2048. Enable with ``Layout.attention_kernel = "eager"``; the pass replaces every fused
``attention`` / ``attention_bwd`` node (all keep role ``attn.core``, so selective recompute
re-runs the whole eager chain, as in Korthikanti et al. section 5).
"""

from __future__ import annotations

from charon_search.errors import PassError
from charon_search.ir import Node, OpGraph, OpKind, Poly
from charon_search.passes._rewrite import GraphBuilder, expand_nodes
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before

__all__ = ["ATTENTION_KERNELS", "EagerAttentionPass", "eager_attention_nodes"]

ATTENTION_KERNELS = ("flash", "flash2", "flash_triton", "eager")
"""``flash*``: one fused kernel (its generation only changes the cost, ``cost.attention_kernels``);
``eager``: Megatron's unfused core attention (this pass)."""
_BF16 = 2.0
_MASK = 1.0
#: FLOPs per score element of the fused scale-mask-softmax (scale, max, sub, exp, sum, div).
SOFTMAX_FLOPS_PER_ELEM = 5.0
SOFTMAX_BWD_FLOPS_PER_ELEM = 4.0
DROPOUT_FLOPS_PER_ELEM = 2.0


def _p(node: Node, name: str) -> Poly:
    v = node.params.get(name)
    if v is None:
        raise PassError(f"eager_attention: node {node.name!r} lacks param {name!r}")
    return v


def eager_attention_nodes(node: Node, gb: GraphBuilder) -> list[Node]:
    """The eager op chain replacing fused attention node ``node`` (its inputs feed the first
    op, its outputs come out of the last)."""
    bh = _p(node, "batch") * _p(node, "heads")
    q, kv = _p(node, "q_len"), _p(node, "kv_len")
    d, dv = _p(node, "head_dim"), _p(node, "v_head_dim")
    sc = bh * q * kv  # score-matrix elements
    bwd = node.kind == OpKind.ATTENTION_BWD
    steps: list[tuple[str, OpKind, dict[str, Poly], Poly, Poly, Poly]] = []

    def bmm(name: str, m: Poly, n: Poly, k: Poly) -> None:
        steps.append((name, OpKind.BATCHED_GEMM, {"batch": bh, "m": m, "n": n, "k": k},
                      bh * m * n * k * 2, bh * (m * k + k * n) * _BF16, bh * m * n * _BF16))

    def softmax(name: str, reads: float, flops: float) -> None:
        steps.append((name, OpKind.SOFTMAX, {"rows": bh * q, "cols": kv}, sc * flops,
                      sc * reads, sc * _BF16))

    def dropout(name: str, read: float, write: float) -> None:
        steps.append((name, OpKind.ELEMENTWISE, {"numel": sc}, sc * DROPOUT_FLOPS_PER_ELEM,
                      sc * read, sc * write))

    if not bwd:
        bmm("scores", q, kv, d)
        softmax("softmax", _BF16, SOFTMAX_FLOPS_PER_ELEM)
        dropout("dropout", _BF16, _BF16 + _MASK)
        bmm("context", q, dv, kv)
    else:
        bmm("grad_probs", q, kv, dv)
        bmm("grad_v", kv, dv, q)
        dropout("dropout_bwd", _BF16 + _MASK, _BF16)
        softmax("softmax_bwd", 2 * _BF16, SOFTMAX_BWD_FLOPS_PER_ELEM)
        bmm("grad_q", q, d, kv)
        bmm("grad_k", kv, d, q)
    out: list[Node] = []
    prev: tuple[int, ...] = tuple(node.inputs)
    for i, (name, kind, params, flops, br, bw) in enumerate(steps):
        last = i == len(steps) - 1
        outs = tuple(node.outputs) if last else (
            gb.new_tensor(shape=(bh, q, kv), dtype=node.dtype or "bf16"),)
        ins = prev if i == 0 else prev + (tuple(node.inputs) if kind == OpKind.BATCHED_GEMM
                                          else ())
        out.append(node.replace(
            id=gb.fresh_id(), name=gb.unique_name(f"{node.name}.{name}"), kind=kind,
            inputs=tuple(dict.fromkeys(ins)), outputs=outs, flops=flops, bytes_read=br,
            bytes_written=bw, params=params, target="pass:eager_attention",
            tags=node.tags | {"eager_attention"}))
        prev = outs
    return out


@PASSES.register("eager_attention")
class EagerAttentionPass(Pass):
    """Replace fused attention kernels with Megatron's unfused core attention."""

    name = "eager_attention"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.attention_kernel == "eager"

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        if not any(n.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD) for n in graph.nodes):
            return PassResult(graph, False)
        return PassResult(expand_nodes(graph, lambda node, gb: eager_attention_nodes(node, gb)
                                       if node.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD)
                                       else None), True)


must_run_before("fusion", "eager_attention")
for _after in ("tp", "cp", "recompute", "fp8"):
    must_run_before("eager_attention", _after)
