"""PyTorch ``context_parallel`` traced by torch.compile (torchtitan CP records, issue 8)."""

from __future__ import annotations

import pytest

from charon_search.ir import OpKind
from charon_search.layout import Layout
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block

B, S, CP = 2.0, 4096.0, 4
HEADS, KV_HEADS, HD = 8, 4, 32  # synthetic_block defaults: hidden 256, 8 heads, 4 KV heads


def _block(**kw):
    ctx = PassContext(cp=CP, recompute="none", debug=True, **kw)
    return parallelize_block(synthetic_block("dense"), ctx)


def _comm(graph, kind):
    return [n for n in graph.nodes if n.kind == kind and n.group == "cp"]


@pytest.mark.parametrize("repeat, heads", [(True, HEADS), (False, KV_HEADS)])
def test_kv_all_gather_before_each_kernel_and_fp32_dkv_hops(repeat: bool, heads: int) -> None:
    pb = _block(cp_ring_impl="torch_traced", cp_repeat_kv=repeat)
    local = B * S / CP
    for graph in (pb.forward, pb.backward):
        (ag,) = _comm(graph, OpKind.ALL_GATHER)
        # K and V of all cp ranks, bf16, at the exchanged head count
        assert ag.params["bytes"](B, S, S) == pytest.approx(local * heads * 2 * HD * 2 * CP)
        assert "overlap" not in ag.tags
        attn = next(n for n in graph.nodes if n.kind in (OpKind.ATTENTION,
                                                          OpKind.ATTENTION_BWD))
        assert ag.outputs[0] in attn.inputs  # the kernel waits for the gather
    hops = _comm(pb.backward, OpKind.SEND_RECV)
    assert len(hops) == 2  # dK and dV
    for n in hops:
        # one fp32 accumulator per ring step, cp steps
        assert n.params["bytes"](B, S, S) == pytest.approx(local * heads * HD * 4 * CP)
        assert "overlap" not in n.tags
    assert not _comm(pb.forward, OpKind.SEND_RECV)


def test_overlapped_ring_is_unchanged_by_default() -> None:
    pb = _block()
    (ring,) = _comm(pb.forward, OpKind.SEND_RECV)
    assert "overlap" in ring.tags
    assert ring.params["bytes"](B, S, S) == pytest.approx(
        B * S / CP * KV_HEADS * 2 * HD * 2 * (CP - 1))
    assert not _comm(pb.forward, OpKind.ALL_GATHER)


def test_ring_impl_is_validated() -> None:
    with pytest.raises(Exception, match="cp_ring_impl"):
        Layout(cp_ring_impl="nccl")
