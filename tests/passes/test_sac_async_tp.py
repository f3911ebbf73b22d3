"""torchtitan op-level SAC with sequence parallelism: the recompute policy picks the matmuls of
the traced program (async TP pipelines the backward afterwards), and torchtitan of 2025 re-runs
the attention output's reduce-scatter (``passes.recompute``, ``passes.overlap``)."""

from __future__ import annotations

import re

import pytest

from charon_search.ir import OpKind, Phase
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block

B, S = 2, 128
TP = 4


def _block(**kw: object):
    ctx = PassContext(recompute="selective", selective_policy="op", tp=TP,
                      sequence_parallel=True, debug=True, **kw)
    return parallelize_block(synthetic_block("dense"), ctx)


def _recomputed(g, kind: OpKind) -> list:
    return [n for n in g.nodes if n.phase == Phase.RECOMPUTE and n.kind == kind]


def test_op_sac_under_async_tp_recomputes_the_traced_matmuls_once() -> None:
    """SAC's every-second-matmul rule counts the matmuls of the traced layer (q, k, v, o,
    gate, up, down: k, o and up are re-run), not async TP's per-chunk GEMMs, and no op is
    split twice: the recomputed GEMM FLOPs are those of vanilla TP, the recomputed gathers
    are pipelined in ``tp`` chunks of 1/tp of the bytes."""
    plain, asy = _block(), _block(async_tp=True)
    flops = [sum(n.flops(B, S) for n in _recomputed(pb.backward, OpKind.GEMM))
             for pb in (plain, asy)]
    assert flops[1] == pytest.approx(flops[0]) and flops[0] > 0
    assert not [n for n in asy.backward.nodes if re.search(r"_chunk\d+_chunk\d+", n.name)]
    whole = _recomputed(plain.backward, OpKind.ALL_GATHER)
    chunks = _recomputed(asy.backward, OpKind.ALL_GATHER)
    assert len(whole) == 2 and len(chunks) == 2 * TP  # attention and MLP inputs
    assert sum(n.params["bytes"](B, S) for n in chunks) == pytest.approx(
        sum(n.params["bytes"](B, S) for n in whole))


@pytest.mark.parametrize("async_tp", [False, True])
def test_op_sac_without_saved_reduce_scatter_reruns_the_attention_output_one(
        async_tp: bool) -> None:
    """torchtitan 2025 (reduce_scatter_tensor not in the save list): of the two reduce-scatters
    of a layer only the attention output's is needed by the backward (its sum with the residual
    feeds the MLP norm); it is re-run with the bytes of the forward's, b·s·h·2 bytes."""
    saved = _block(async_tp=async_tp)
    rerun = _block(async_tp=async_tp, sac_saves_reduce_scatter=False)
    assert not _recomputed(saved.backward, OpKind.REDUCE_SCATTER)
    rs = _recomputed(rerun.backward, OpKind.REDUCE_SCATTER)
    assert len(rs) == (TP if async_tp else 1)
    # the attention output's (the first of the layer's two), with its bytes: b*s*h*2
    fwd_rs = next(n for n in rerun.forward.nodes
                  if n.kind == OpKind.REDUCE_SCATTER and n.group == "tp"
                  and n.name.endswith(("_attn", "_attn_chunk0")))
    per = fwd_rs.params["bytes"](B, S)
    assert per == pytest.approx(B * S * 256 * 2 / (TP if async_tp else 1))
    assert sum(n.params["bytes"](B, S) for n in rs) == pytest.approx(B * S * 256 * 2)
    assert all("residual_attn" in n.name for n in rs)
