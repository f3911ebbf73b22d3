"""Hand-built transformer block graphs with the structure the frontend traces.

For tests and benchmarks that must not depend on torch tracing: a Llama-style dense block
(RMSNorm, q/k/v/o projections, RoPE, causal flash attention, SwiGLU MLP), an optional MoE block
(router, dispatch, grouped expert GEMMs, combine, shared expert), embedding and LM-head blocks,
each with forward and backward graphs that follow the frontend's conventions (GEMM params m,n,k
with m = b*s; backward dgrad ``[tokens, out] x [out, in]``, wgrad ``[out, tokens] x [tokens, in]``;
attention params per the full model). FLOPs: 2mnk per GEMM, causal attention
2·b·H·s·c·(d_qk + d_v)/2 forward and ``ATTENTION_BWD_FLOP_RATIO`` (2.5) x that backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from charon_search.ir import (
    ATTENTION_BWD_FLOP_RATIO,
    DTYPE_BYTES,
    Node,
    OpGraph,
    OpKind,
    Phase,
    Poly,
    Role,
    TensorSpec,
    TracedBlock,
    sym,
)
from charon_search.ir.symbolic import as_poly

__all__ = ["SyntheticModel", "synthetic_block", "synthetic_model"]

b, s, c = sym("b"), sym("s"), sym("c")
BS = b * s


@dataclass
class _G:
    name: str
    phase: Phase
    dtype: str = "bf16"
    nodes: list[Node] = field(default_factory=list)
    tensors: dict[int, TensorSpec] = field(default_factory=dict)
    inputs: list[int] = field(default_factory=list)
    params: list[int] = field(default_factory=list)
    next_t: list[int] = field(default_factory=lambda: [0])

    def t(self, *shape: Poly | float, dtype: str | None = None) -> int:
        tid = self.next_t[0]
        self.next_t[0] += 1
        self.tensors[tid] = TensorSpec(id=tid, shape=tuple(as_poly(x) for x in shape),
                                       dtype=dtype or self.dtype)
        return tid

    def inp(self, *shape: Poly | float, param: bool = False) -> int:
        tid = self.t(*shape)
        self.inputs.append(tid)
        if param:
            self.params.append(tid)
        return tid

    def op(self, kind: OpKind, name: str, role: str, ins: tuple[int, ...],
           outs: tuple[int, ...], flops: Poly | float, **params: Poly | float) -> Node:
        nb = sum((self.tensors[t].nbytes for t in ins), Poly())
        wb = sum((self.tensors[t].nbytes for t in outs), Poly())
        node = Node(id=len(self.nodes) + 1000 * (self.phase != Phase.FORWARD), name=name,
                    kind=kind, module_path=name.rsplit(".", 1)[0] if "." in name else name,
                    role=role, phase=self.phase, inputs=ins, outputs=outs, flops=as_poly(flops),
                    bytes_read=nb, bytes_written=wb,
                    params={k: as_poly(v) for k, v in params.items()}, dtype=self.dtype)
        self.nodes.append(node)
        return node

    def gemm(self, name: str, role: str, x: int, w: int, m: Poly | float, n: Poly | float,
             k: Poly | float, out_shape: tuple[Poly | float, ...]) -> int:
        y = self.t(*out_shape)
        self.op(OpKind.GEMM, name, role, (x, w), (y,), 2 * as_poly(m) * n * k, m=m, n=n, k=k)
        return y

    def graph(self, outputs: tuple[int, ...], meta: dict) -> OpGraph:
        return OpGraph(name=self.name, nodes=tuple(self.nodes), tensors=dict(self.tensors),
                       inputs=tuple(self.inputs), outputs=outputs,
                       param_tensors=tuple(self.params), meta=meta)


@dataclass(frozen=True, kw_only=True)
class SyntheticModel:
    """Stand-in for ``frontend.TracedModel``: ``spec``, ``phase`` and ``blocks``."""

    spec: object
    phase: str
    blocks: dict[str, TracedBlock]


def _attn_params(heads: int, kv: int, hd: int) -> dict[str, Poly | float]:
    return dict(batch=b, heads=heads, kv_heads=kv, q_len=s, kv_len=c, head_dim=hd,
                v_head_dim=hd, causal=1)


def synthetic_block(kind: str = "dense", *, hidden: int = 256, heads: int = 8,
                    kv_heads: int = 4, ffn: int = 512, vocab: int = 1024, num_experts: int = 8,
                    top_k: int = 2, moe_ffn: int = 128, shared_experts: int = 1,
                    train: bool = True) -> TracedBlock:
    """One traced-like block: ``dense``, ``moe``, ``embedding`` or ``lm_head``."""
    h, hd = hidden, hidden // heads
    meta = {"layer_type": kind, "phase": "train" if train else "prefill"}
    shared_t = [0]
    f = _G(kind + ".fwd", Phase.FORWARD, next_t=shared_t)
    saved: list[int] = []
    if kind == "embedding":
        ids = f.inp(b, s)
        w = f.inp(vocab, h, param=True)
        y = f.t(b, s, h)
        f.op(OpKind.EMBEDDING, "embed_tokens", Role.EMBED, (ids, w), (y,), 0, tokens=BS,
             hidden=h, vocab=vocab)
        fwd = f.graph((y,), meta)
        bk = _G(kind + ".bwd", Phase.BACKWARD, next_t=shared_t)
        bk.tensors.update(f.tensors)
        dy = bk.inp(b, s, h)
        bk.inputs.append(ids)
        dw = bk.t(vocab, h)
        bk.op(OpKind.EMBEDDING, "embed_tokens.bwd", Role.EMBED, (dy, ids), (dw,), BS * h,
              tokens=BS, hidden=h, vocab=vocab)
        bwd = bk.graph((dw,), meta)
        return TracedBlock(name=kind, forward=fwd, backward=bwd if train else None,
                           num_params=vocab * h)
    if kind == "lm_head":
        x = f.inp(b, s, h)
        wn = f.inp(h, param=True)
        w = f.inp(vocab, h, param=True)
        xn = f.t(b, s, h)
        f.op(OpKind.NORM, "norm", Role.FINAL_NORM, (x, wn), (xn,), 4 * BS * h, rows=BS, cols=h)
        logits = f.gemm("lm_head", Role.LM_HEAD, xn, w, BS, vocab, h, (b, s, vocab))
        loss = f.t(1, dtype="fp32")
        f.op(OpKind.SOFTMAX, "loss", Role.LOSS, (logits,), (loss,), 5 * BS * vocab, rows=BS,
             cols=vocab)
        saved = [x, xn, logits]
        fwd = f.graph((loss, *saved), meta)
        bk = _G(kind + ".bwd", Phase.BACKWARD, next_t=shared_t)
        bk.inputs += saved
        bk.tensors.update(f.tensors)
        dlog = bk.t(b, s, vocab)
        bk.op(OpKind.SOFTMAX, "loss.bwd", Role.LOSS, (logits,), (dlog,), 3 * BS * vocab,
              rows=BS, cols=vocab)
        dxn = bk.gemm("lm_head.dgrad", Role.LM_HEAD, dlog, w, BS, h, vocab, (b, s, h))
        dw = bk.gemm("lm_head.wgrad", Role.LM_HEAD, dlog, xn, vocab, h, BS, (vocab, h))
        dx = bk.t(b, s, h)
        bk.op(OpKind.NORM, "norm.bwd", Role.FINAL_NORM, (dxn, x), (dx,), 8 * BS * h, rows=BS,
              cols=h)
        bk.inputs += [w]
        bk.params += [w]
        bwd = bk.graph((dx, dw), meta)
        return TracedBlock(name=kind, forward=fwd, backward=bwd if train else None,
                           saved=tuple(saved), num_params=vocab * h + h)

    # ---------------------------------------------------------------- decoder layer forward
    x = f.inp(b, s, h)
    w_n1, w_q, w_k, w_v, w_o, w_n2 = (f.inp(*sh, param=True) for sh in (
        (h,), (heads * hd, h), (kv_heads * hd, h), (kv_heads * hd, h), (h, heads * hd), (h,)))
    n1 = f.t(b, s, h)
    f.op(OpKind.NORM, "input_layernorm", Role.ATTN_NORM, (x, w_n1), (n1,), 4 * BS * h,
         rows=BS, cols=h)
    q = f.gemm("self_attn.q_proj", Role.ATTN_QKV, n1, w_q, BS, heads * hd, h, (b, s, heads * hd))
    k = f.gemm("self_attn.k_proj", Role.ATTN_QKV, n1, w_k, BS, kv_heads * hd, h,
               (b, s, kv_heads * hd))
    v = f.gemm("self_attn.v_proj", Role.ATTN_QKV, n1, w_v, BS, kv_heads * hd, h,
               (b, s, kv_heads * hd))
    qr, kr = f.t(b, s, heads * hd), f.t(b, s, kv_heads * hd)
    f.op(OpKind.ELEMENTWISE, "self_attn.rotary", Role.ATTN_ROPE, (q, k), (qr, kr),
         6 * BS * (heads + kv_heads) * hd, numel=BS * (heads + kv_heads) * hd)
    o = f.t(b, s, heads * hd)
    attn_flops = 2 * b * heads * s * c * (2 * hd) / 2
    f.op(OpKind.ATTENTION, "self_attn.attn", Role.ATTN_CORE, (qr, kr, v), (o,), attn_flops,
         **_attn_params(heads, kv_heads, hd))
    ao = f.gemm("self_attn.o_proj", Role.ATTN_OUT, o, w_o, BS, h, heads * hd, (b, s, h))
    h1 = f.t(b, s, h)
    f.op(OpKind.ELEMENTWISE, "residual_attn", Role.RESIDUAL, (x, ao), (h1,), BS * h, numel=BS * h)
    n2 = f.t(b, s, h)
    f.op(OpKind.NORM, "post_attention_layernorm", Role.MLP_NORM, (h1, w_n2), (n2,), 4 * BS * h,
         rows=BS, cols=h)
    saved = [x, n1, qr, kr, v, o, h1, n2]
    mlp_saved, mlp_out, num_params = _mlp_forward(
        f, kind, n2, h, ffn, num_experts, top_k, moe_ffn, shared_experts)
    saved += mlp_saved
    y = f.t(b, s, h)
    f.op(OpKind.ELEMENTWISE, "residual_mlp", Role.RESIDUAL, (h1, mlp_out), (y,), BS * h,
         numel=BS * h)
    fwd = f.graph((y, *saved), meta)
    num_params += 2 * h + (heads * hd * h) * 2 + 2 * kv_heads * hd * h
    if not train:
        return TracedBlock(name=kind, forward=fwd, num_params=num_params)

    # ---------------------------------------------------------------- decoder layer backward
    bk = _G(kind + ".bwd", Phase.BACKWARD, next_t=shared_t)
    bk.tensors.update(f.tensors)
    dy = bk.inp(b, s, h)
    bk.inputs += [*saved, w_q, w_k, w_v, w_o, w_n1, w_n2]
    bk.params += [w_q, w_k, w_v, w_o, w_n1, w_n2]
    grads: list[int] = []
    dn2 = _mlp_backward(bk, kind, dy, n2, mlp_saved, h, ffn, num_experts, top_k, moe_ffn,
                        shared_experts, grads, f)
    dh1n = bk.t(b, s, h)
    bk.op(OpKind.NORM, "post_attention_layernorm.bwd", Role.MLP_NORM, (dn2, h1), (dh1n,),
          8 * BS * h, rows=BS, cols=h)
    dh1 = bk.t(b, s, h)
    bk.op(OpKind.ELEMENTWISE, "residual_mlp.bwd", Role.RESIDUAL, (dy, dh1n), (dh1,), BS * h,
          numel=BS * h)
    do = bk.gemm("self_attn.o_proj.dgrad", Role.ATTN_OUT, dh1, w_o, BS, heads * hd, h,
                 (b, s, heads * hd))
    grads.append(bk.gemm("self_attn.o_proj.wgrad", Role.ATTN_OUT, dh1, o, h, heads * hd, BS,
                         (h, heads * hd)))
    dqr, dkr, dv = bk.t(b, s, heads * hd), bk.t(b, s, kv_heads * hd), bk.t(b, s, kv_heads * hd)
    bk.op(OpKind.ATTENTION_BWD, "self_attn.attn.bwd", Role.ATTN_CORE, (do, qr, kr, v, o),
          (dqr, dkr, dv), ATTENTION_BWD_FLOP_RATIO * attn_flops,
          **_attn_params(heads, kv_heads, hd))
    dq, dk = bk.t(b, s, heads * hd), bk.t(b, s, kv_heads * hd)
    bk.op(OpKind.ELEMENTWISE, "self_attn.rotary.bwd", Role.ATTN_ROPE, (dqr, dkr), (dq, dk),
          6 * BS * (heads + kv_heads) * hd, numel=BS * (heads + kv_heads) * hd)
    parts = []
    for nm, dt, w, width in (("q_proj", dq, w_q, heads * hd), ("k_proj", dk, w_k, kv_heads * hd),
                             ("v_proj", dv, w_v, kv_heads * hd)):
        parts.append(bk.gemm(f"self_attn.{nm}.dgrad", Role.ATTN_QKV, dt, w, BS, h, width,
                             (b, s, h)))
        grads.append(bk.gemm(f"self_attn.{nm}.wgrad", Role.ATTN_QKV, dt, n1, width, h, BS,
                             (width, h)))
    acc = _sum(bk, parts, "self_attn.grad_sum", h)
    dxn = bk.t(b, s, h)
    bk.op(OpKind.NORM, "input_layernorm.bwd", Role.ATTN_NORM, (acc, x), (dxn,), 8 * BS * h,
          rows=BS, cols=h)
    dx = bk.t(b, s, h)
    bk.op(OpKind.ELEMENTWISE, "residual_attn.bwd", Role.RESIDUAL, (dh1, dxn), (dx,), BS * h,
          numel=BS * h)
    bwd = bk.graph((dx, *grads), meta)
    return TracedBlock(name=kind, forward=fwd, backward=bwd, saved=tuple(saved),
                       num_params=num_params)


def _sum(g: _G, parts: list[int], name: str, h: int) -> int:
    acc = parts[0]
    for i, p in enumerate(parts[1:]):
        out = g.t(b, s, h)
        g.op(OpKind.ELEMENTWISE, f"{name}{i}", "", (acc, p), (out,), BS * h, numel=BS * h)
        acc = out
    return acc


def _mlp_forward(f: _G, kind: str, n2: int, h: int, ffn: int, num_experts: int, top_k: int,
                 moe_ffn: int, shared: int) -> tuple[list[int], int, int]:
    if kind == "dense":
        wg, wu, wd = f.inp(ffn, h, param=True), f.inp(ffn, h, param=True), f.inp(h, ffn,
                                                                              param=True)
        g = f.gemm("mlp.gate_proj", Role.MLP_IN, n2, wg, BS, ffn, h, (b, s, ffn))
        u = f.gemm("mlp.up_proj", Role.MLP_IN, n2, wu, BS, ffn, h, (b, s, ffn))
        a = f.t(b, s, ffn)
        f.op(OpKind.ELEMENTWISE, "mlp.act_fn", Role.MLP_ACT, (g, u), (a,), 5 * BS * ffn,
             numel=BS * ffn)
        d = f.gemm("mlp.down_proj", Role.MLP_OUT, a, wd, BS, h, ffn, (b, s, h))
        f.meta_w = (wg, wu, wd)  # type: ignore[attr-defined]
        return [g, u, a], d, 3 * ffn * h
    # MoE: router, dispatch, grouped expert GEMMs, combine, shared expert.
    E, K, F = num_experts, top_k, moe_ffn
    wr = f.inp(E, h, param=True)
    we1, we2 = f.inp(E, 2 * F, h, param=True), f.inp(E, h, F, param=True)
    logits = f.gemm("mlp.gate", Role.MOE_ROUTER, n2, wr, BS, E, h, (b, s, E))
    idx = f.t(b, s, K)
    f.op(OpKind.MOE_ROUTING, "mlp.topk", Role.MOE_ROUTER, (logits,), (idx,), BS * E,
         tokens=BS, num_experts=E, top_k=K)
    perm = f.t(b * s * K, h)
    f.op(OpKind.COPY, "mlp.dispatch", Role.MOE_DISPATCH, (n2, idx), (perm,), 0, numel=BS * K * h)
    e1 = f.t(b * s * K, 2 * F)
    f.op(OpKind.GROUPED_GEMM, "mlp.experts.gate_up", Role.MOE_EXPERT, (perm, we1), (e1,),
         2 * BS * K * 2 * F * h, tokens=BS, top_k=K, num_experts=E, n=2 * F, k=h)
    ea = f.t(b * s * K, F)
    f.op(OpKind.ELEMENTWISE, "mlp.experts.act", Role.MOE_EXPERT, (e1,), (ea,), 5 * BS * K * F,
         numel=BS * K * F)
    e2 = f.t(b * s * K, h)
    f.op(OpKind.GROUPED_GEMM, "mlp.experts.down", Role.MOE_EXPERT, (ea, we2), (e2,),
         2 * BS * K * F * h, tokens=BS, top_k=K, num_experts=E, n=h, k=F)
    comb = f.t(b, s, h)
    f.op(OpKind.COPY, "mlp.combine", Role.MOE_COMBINE, (e2, idx), (comb,), BS * K * h,
         numel=BS * K * h)
    saved = [logits, idx, perm, e1, ea]
    out = comb
    nparams = E * h + E * 3 * F * h
    if shared:
        SF = F * shared
        ws1, ws2 = f.inp(2 * SF, h, param=True), f.inp(h, SF, param=True)
        s1 = f.gemm("mlp.shared_experts.gate_up", Role.MOE_SHARED, n2, ws1, BS, 2 * SF, h,
                    (b, s, 2 * SF))
        sa = f.t(b, s, SF)
        f.op(OpKind.ELEMENTWISE, "mlp.shared_experts.act", Role.MOE_SHARED, (s1,), (sa,),
             5 * BS * SF, numel=BS * SF)
        s2 = f.gemm("mlp.shared_experts.down", Role.MOE_SHARED, sa, ws2, BS, h, SF, (b, s, h))
        out = f.t(b, s, h)
        f.op(OpKind.ELEMENTWISE, "mlp.shared_add", Role.MOE_COMBINE, (comb, s2), (out,), BS * h,
             numel=BS * h)
        saved += [s1, sa]
        nparams += 3 * SF * h
    f.meta_w = (wr, we1, we2) + ((ws1, ws2) if shared else ())  # type: ignore[attr-defined]
    return saved, out, nparams


def _mlp_backward(bk: _G, kind: str, dy: int, n2: int, saved: list[int], h: int, ffn: int,
                  num_experts: int, top_k: int, moe_ffn: int, shared: int, grads: list[int],
                  f: _G) -> int:
    ws = f.meta_w  # type: ignore[attr-defined]
    bk.inputs += list(ws)
    bk.params += list(ws)
    if kind == "dense":
        g, u, a = saved
        wg, wu, wd = ws
        da = bk.gemm("mlp.down_proj.dgrad", Role.MLP_OUT, dy, wd, BS, ffn, h, (b, s, ffn))
        grads.append(bk.gemm("mlp.down_proj.wgrad", Role.MLP_OUT, dy, a, h, ffn, BS, (h, ffn)))
        dg, du = bk.t(b, s, ffn), bk.t(b, s, ffn)
        bk.op(OpKind.ELEMENTWISE, "mlp.act_fn.bwd", Role.MLP_ACT, (da, g, u), (dg, du),
              8 * BS * ffn, numel=BS * ffn)
        parts = []
        for nm, dt, w in (("gate_proj", dg, wg), ("up_proj", du, wu)):
            parts.append(bk.gemm(f"mlp.{nm}.dgrad", Role.MLP_IN, dt, w, BS, h, ffn, (b, s, h)))
            grads.append(bk.gemm(f"mlp.{nm}.wgrad", Role.MLP_IN, dt, n2, ffn, h, BS, (ffn, h)))
        return _sum(bk, parts, "mlp.grad_sum", h)
    E, K, F = num_experts, top_k, moe_ffn
    logits, idx, perm, e1, ea = saved[:5]
    wr, we1, we2 = ws[:3]
    de2 = bk.t(b * s * K, h)
    bk.op(OpKind.COPY, "mlp.combine.bwd", Role.MOE_COMBINE, (dy, idx), (de2,), BS * K * h,
          numel=BS * K * h)
    dea = bk.t(b * s * K, F)
    bk.op(OpKind.GROUPED_GEMM, "mlp.experts.down.dgrad", Role.MOE_EXPERT, (de2, we2), (dea,),
          2 * BS * K * F * h, tokens=BS, top_k=K, num_experts=E, n=F, k=h)
    dw2 = bk.t(E, h, F)
    bk.op(OpKind.GROUPED_GEMM, "mlp.experts.down.wgrad", Role.MOE_EXPERT, (de2, ea), (dw2,),
          2 * BS * K * F * h, tokens=BS, top_k=K, num_experts=E, n=F, k=h)
    de1 = bk.t(b * s * K, 2 * F)
    bk.op(OpKind.ELEMENTWISE, "mlp.experts.act.bwd", Role.MOE_EXPERT, (dea, e1), (de1,),
          8 * BS * K * F, numel=BS * K * F)
    dperm = bk.t(b * s * K, h)
    bk.op(OpKind.GROUPED_GEMM, "mlp.experts.gate_up.dgrad", Role.MOE_EXPERT, (de1, we1),
          (dperm,), 2 * BS * K * 2 * F * h, tokens=BS, top_k=K, num_experts=E, n=h, k=2 * F)
    dw1 = bk.t(E, 2 * F, h)
    bk.op(OpKind.GROUPED_GEMM, "mlp.experts.gate_up.wgrad", Role.MOE_EXPERT, (de1, perm),
          (dw1,), 2 * BS * K * 2 * F * h, tokens=BS, top_k=K, num_experts=E, n=h, k=2 * F)
    grads += [dw1, dw2]
    dn2r = bk.t(b, s, h)
    bk.op(OpKind.COPY, "mlp.dispatch.bwd", Role.MOE_DISPATCH, (dperm, idx), (dn2r,), BS * K * h,
          numel=BS * K * h)
    dlog = bk.t(b, s, E)
    bk.op(OpKind.MOE_ROUTING, "mlp.topk.bwd", Role.MOE_ROUTER, (dy, logits), (dlog,), BS * E,
          tokens=BS, num_experts=E, top_k=K)
    dn2g = bk.gemm("mlp.gate.dgrad", Role.MOE_ROUTER, dlog, wr, BS, h, E, (b, s, h))
    grads.append(bk.gemm("mlp.gate.wgrad", Role.MOE_ROUTER, dlog, n2, E, h, BS, (E, h)))
    parts = [dn2r, dn2g]
    if shared:
        s1, sa = saved[5:7]
        ws1, ws2 = ws[3:5]
        SF = F * shared
        dsa = bk.gemm("mlp.shared_experts.down.dgrad", Role.MOE_SHARED, dy, ws2, BS, SF, h,
                      (b, s, SF))
        grads.append(bk.gemm("mlp.shared_experts.down.wgrad", Role.MOE_SHARED, dy, sa, h, SF,
                             BS, (h, SF)))
        ds1 = bk.t(b, s, 2 * SF)
        bk.op(OpKind.ELEMENTWISE, "mlp.shared_experts.act.bwd", Role.MOE_SHARED, (dsa, s1),
              (ds1,), 8 * BS * SF, numel=BS * SF)
        parts.append(bk.gemm("mlp.shared_experts.gate_up.dgrad", Role.MOE_SHARED, ds1, ws1, BS,
                             h, 2 * SF, (b, s, h)))
        grads.append(bk.gemm("mlp.shared_experts.gate_up.wgrad", Role.MOE_SHARED, ds1, n2,
                             2 * SF, h, BS, (2 * SF, h)))
    return _sum(bk, parts, "mlp.grad_sum", h)


def synthetic_model(spec: object = None, *, layer_types: tuple[str, ...] = ("dense",),
                    train: bool = True, **dims: int) -> SyntheticModel:
    """Embedding, one block per distinct layer type, and the LM head."""
    blocks = {"embedding": synthetic_block("embedding", train=train, **dims)}
    for lt in dict.fromkeys(layer_types):
        blocks[lt] = synthetic_block(lt, train=train, **dims)
    blocks["lm_head"] = synthetic_block("lm_head", train=train, **dims)
    return SyntheticModel(spec=spec, phase="train" if train else "prefill", blocks=blocks)


_ = DTYPE_BYTES
