"""A hand-built forward/backward OpGraph of one GPT-3 block with eager (unfused) attention.

It mirrors what PyTorch autograd saves for the Megatron GPT block of Korthikanti et al.
(arXiv 2205.05198, Sec. 4.1): LayerNorm inputs, the QKV GEMM input, Q/K/V, softmax output,
attention-dropout mask and output, the context, the output-projection dropout mask, the MLP
input, the GELU input and output, the MLP dropout mask - plus LayerNorm's per-row mean/rstd
(fp32), which the paper neglects. The liveness walk has to find these edges itself.
"""

from __future__ import annotations

from charon_search.ir import Node, OpGraph, OpKind, Phase, Poly, Role, TensorSpec, TracedBlock
from charon_search.ir.symbolic import sym

b, s, c = sym("b"), sym("s"), sym("c")


class _Builder:
    def __init__(self) -> None:
        self.tensors: dict[int, TensorSpec] = {}
        self.fwd: list[Node] = []
        self.bwd: list[Node] = []
        self._tid = 0
        self._nid = 0

    def t(self, *shape: Poly | int, dtype: str = "bf16") -> int:
        tid = self._tid
        self._tid += 1
        self.tensors[tid] = TensorSpec(
            id=tid, shape=tuple(x if isinstance(x, Poly) else Poly.const(x) for x in shape),
            dtype=dtype)
        return tid

    def op(self, kind: OpKind, role: str, ins: list[int], outs: list[int],
           phase: Phase = Phase.FORWARD) -> None:
        nbytes = Poly()
        for o in outs:
            nbytes = nbytes + self.tensors[o].nbytes
        node = Node(id=self._nid, name=f"n{self._nid}", kind=kind, role=role, phase=phase,
                    inputs=tuple(ins), outputs=tuple(outs), bytes_written=nbytes)
        self._nid += 1
        (self.fwd if phase == Phase.FORWARD else self.bwd).append(node)


def gpt_block(h: int, a: int, ffn: int | None = None) -> TracedBlock:
    """One GPT block (pre-LN, GELU MLP, dropout everywhere) with its backward graph."""
    ffn = ffn or 4 * h
    g = _Builder()
    E, G, N, BG, SM = (OpKind.ELEMENTWISE, OpKind.GEMM, OpKind.NORM, OpKind.BATCHED_GEMM,
                       OpKind.SOFTMAX)
    # parameters
    w_ln1, w_q, w_k, w_v, w_o, w_ln2, w_1, w_2 = (
        g.t(h), g.t(h, h), g.t(h, h), g.t(h, h), g.t(h, h), g.t(h), g.t(h, ffn), g.t(ffn, h))
    params = (w_ln1, w_q, w_k, w_v, w_o, w_ln2, w_1, w_2)
    x = g.t(b, s, h)
    # forward
    y1, mu1, rs1 = g.t(b, s, h), g.t(b, s, dtype="fp32"), g.t(b, s, dtype="fp32")
    g.op(N, Role.ATTN_NORM, [x, w_ln1], [y1, mu1, rs1])
    q, k, v = g.t(b, s, h), g.t(b, s, h), g.t(b, s, h)
    for w, o in ((w_q, q), (w_k, k), (w_v, v)):
        g.op(G, Role.ATTN_QKV, [y1, w], [o])
    scores = g.t(b, a, s, c)
    g.op(BG, Role.ATTN_CORE, [q, k], [scores])
    scaled = g.t(b, a, s, c)
    g.op(E, Role.ATTN_CORE, [scores], [scaled])
    probs = g.t(b, a, s, c)
    g.op(SM, Role.ATTN_CORE, [scaled], [probs])
    dropped, amask = g.t(b, a, s, c), g.t(b, a, s, c, dtype="bool")
    g.op(E, Role.ATTN_CORE, [probs], [dropped, amask])
    ctx = g.t(b, s, h)
    g.op(BG, Role.ATTN_CORE, [dropped, v], [ctx])
    o = g.t(b, s, h)
    g.op(G, Role.ATTN_OUT, [ctx, w_o], [o])
    od, omask = g.t(b, s, h), g.t(b, s, h, dtype="bool")
    g.op(E, Role.ATTN_OUT, [o], [od, omask])
    r1 = g.t(b, s, h)
    g.op(E, Role.RESIDUAL, [x, od], [r1])
    y2, mu2, rs2 = g.t(b, s, h), g.t(b, s, dtype="fp32"), g.t(b, s, dtype="fp32")
    g.op(N, Role.MLP_NORM, [r1, w_ln2], [y2, mu2, rs2])
    f1 = g.t(b, s, ffn)
    g.op(G, Role.MLP_IN, [y2, w_1], [f1])
    act = g.t(b, s, ffn)
    g.op(E, Role.MLP_ACT, [f1], [act])
    f2 = g.t(b, s, h)
    g.op(G, Role.MLP_OUT, [act, w_2], [f2])
    f2d, m2 = g.t(b, s, h), g.t(b, s, h, dtype="bool")
    g.op(E, Role.MLP_OUT, [f2], [f2d, m2])
    out = g.t(b, s, h)
    g.op(E, Role.RESIDUAL, [r1, f2d], [out])
    saved = (x, mu1, rs1, y1, q, k, v, probs, amask, dropped, ctx, omask, r1, mu2, rs2, y2,
             f1, act, m2)

    # backward (reverse order, consuming the saved tensors)
    B = Phase.BACKWARD
    dout = g.t(b, s, h)
    d_f2 = g.t(b, s, h)
    g.op(E, Role.MLP_OUT, [dout, m2], [d_f2], B)
    d_act, d_w2 = g.t(b, s, ffn), g.t(ffn, h)
    g.op(G, Role.MLP_OUT, [d_f2, w_2], [d_act], B)
    g.op(G, Role.MLP_OUT, [d_f2, act], [d_w2], B)
    d_f1 = g.t(b, s, ffn)
    g.op(E, Role.MLP_ACT, [d_act, f1], [d_f1], B)
    d_y2, d_w1 = g.t(b, s, h), g.t(h, ffn)
    g.op(G, Role.MLP_IN, [d_f1, w_1], [d_y2], B)
    g.op(G, Role.MLP_IN, [d_f1, y2], [d_w1], B)
    d_r1n, d_wln2 = g.t(b, s, h), g.t(h)
    g.op(N, Role.MLP_NORM, [d_y2, r1, mu2, rs2, w_ln2], [d_r1n, d_wln2], B)
    d_r1 = g.t(b, s, h)
    g.op(E, Role.RESIDUAL, [dout, d_r1n], [d_r1], B)
    d_o = g.t(b, s, h)
    g.op(E, Role.ATTN_OUT, [d_r1, omask], [d_o], B)
    d_ctx, d_wo = g.t(b, s, h), g.t(h, h)
    g.op(G, Role.ATTN_OUT, [d_o, w_o], [d_ctx], B)
    g.op(G, Role.ATTN_OUT, [d_o, ctx], [d_wo], B)
    d_drop, d_v = g.t(b, a, s, c), g.t(b, s, h)
    g.op(BG, Role.ATTN_CORE, [d_ctx, v], [d_drop], B)
    g.op(BG, Role.ATTN_CORE, [d_ctx, dropped], [d_v], B)
    d_probs = g.t(b, a, s, c)
    g.op(E, Role.ATTN_CORE, [d_drop, amask], [d_probs], B)
    d_scaled = g.t(b, a, s, c)
    g.op(SM, Role.ATTN_CORE, [d_probs, probs], [d_scaled], B)
    d_scores = g.t(b, a, s, c)
    g.op(E, Role.ATTN_CORE, [d_scaled], [d_scores], B)
    d_q, d_k = g.t(b, s, h), g.t(b, s, h)
    g.op(BG, Role.ATTN_CORE, [d_scores, k], [d_q], B)
    g.op(BG, Role.ATTN_CORE, [d_scores, q], [d_k], B)
    d_y1 = g.t(b, s, h)
    dws = []
    for dt, w in ((d_q, w_q), (d_k, w_k), (d_v, w_v)):
        part, dw = g.t(b, s, h), g.t(h, h)
        g.op(G, Role.ATTN_QKV, [dt, w], [part], B)
        g.op(G, Role.ATTN_QKV, [dt, y1], [dw], B)
        dws.append((part, dw))
    g.op(E, Role.ATTN_QKV, [p for p, _ in dws], [d_y1], B)
    d_xn, d_wln1 = g.t(b, s, h), g.t(h)
    g.op(N, Role.ATTN_NORM, [d_y1, x, mu1, rs1, w_ln1], [d_xn, d_wln1], B)
    d_x = g.t(b, s, h)
    g.op(E, Role.RESIDUAL, [d_r1, d_xn], [d_x], B)

    fwd = OpGraph(name="gpt.fwd", nodes=tuple(g.fwd), tensors=dict(g.tensors),
                  inputs=(x, *params), outputs=(out, *saved), param_tensors=params)
    grads = (d_x, d_wln1, *(dw for _, dw in dws), d_wo, d_wln2, d_w1, d_w2)
    bwd = OpGraph(name="gpt.bwd", nodes=tuple(g.bwd), tensors=dict(g.tensors),
                  inputs=(*saved, dout, *params), outputs=grads, param_tensors=params)
    n_params = sum(int(g.tensors[p].numel.const_value()) for p in params)
    return TracedBlock(name="dense", forward=fwd, backward=bwd, saved=saved,
                       num_params=n_params)
