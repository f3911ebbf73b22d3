"""The eager -> flash fusion gives the attention backward the forward's shape (issue 8)."""

from __future__ import annotations

from charon_search.frontend import trace_model
from charon_search.ir import ATTENTION_BWD_FLOP_RATIO, OpKind
from charon_search.passes import PassContext, parallelize_block


def test_fused_attention_backward_has_the_forward_shape() -> None:
    # MPT's HF attention is eager (bmm, softmax, bmm): the fusion pass turns it into one flash
    # kernel. The backward's first batched GEMMs are dV = P^T dO (k = s) and dP = dO V^T, so
    # reading (q_len, kv_len, head_dim) off them gave kv_len = head_dim = 128 and
    # head_dim = s, which priced the MPT attention backward ~5x too slow.
    traced = trace_model("mpt-1b", phase="train", dtype="bf16")
    pb = parallelize_block(traced.blocks["dense"], PassContext())
    b, s = 2.0, 2048.0
    fwd = [n for n in pb.forward.nodes if n.kind == OpKind.ATTENTION]
    bwd = [n for n in pb.backward.nodes if n.kind == OpKind.ATTENTION_BWD]
    assert len(fwd) == 1 and len(bwd) == 1
    want = {k: v(b, s, s) for k, v in fwd[0].params.items()}
    got = {k: v(b, s, s) for k, v in bwd[0].params.items()}
    assert got == want
    assert (got["q_len"], got["kv_len"], got["head_dim"]) == (s, s, 128.0)  # mpt-1b: d_head 128
    assert bwd[0].flops(b, s, s) == ATTENTION_BWD_FLOP_RATIO * fwd[0].flops(b, s, s)
