"""Activation memory by liveness against Korthikanti et al. (arXiv 2205.05198).

The closed forms are the paper's Sec. 4 equations (1)-(5) for one transformer layer in 16-bit
with eager attention and dropout: ``sbh(34 + 5as/h)`` without parallelism,
``sbh(34/t + 5as/(ht))`` with tensor + sequence parallelism, ``sbh(10 + 24/t + 5as/(ht))`` with
tensor parallelism alone, and ``34 sbh / t`` with selective recompute (Sec. 5, Table 2).
"""

from __future__ import annotations

import pytest

from charon_search.memory import ShardingPoint, block_activations

from .conftest import GPT3_A, GPT3_H

S, B = 2048, 1


def _paper(t: int, sp: bool, selective: bool = False) -> float:
    sbh, a, s, h = S * B * GPT3_H, GPT3_A, S, GPT3_H
    if selective:
        return sbh * 34 / t
    if sp or t == 1:
        return sbh * (34 / t + 5 * a * s / (h * t))
    return sbh * (10 + 24 / t + 5 * a * s / (h * t))


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (8, False), (8, True), (4, True)])
def test_saved_bytes_match_korthikanti(gpt3_block, tp: int, sp: bool) -> None:
    ev = block_activations(gpt3_block).evaluate(
        ShardingPoint(b=B, s=S, c=S, tp=tp, sequence_parallel=sp))
    assert ev["saved"] == pytest.approx(_paper(tp, sp), rel=0.05)


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (8, True)])
def test_selective_recompute_drops_attention_core(gpt3_block, tp: int, sp: bool) -> None:
    ev = block_activations(gpt3_block).evaluate(
        ShardingPoint(b=B, s=S, c=S, tp=tp, sequence_parallel=sp))
    kept = ev["selective_saved"]
    assert kept == pytest.approx(_paper(tp, sp, selective=True), rel=0.05)
    # The dropped part is exactly the 5as^2b score-sized tensors (softmax out, mask, dropout).
    assert ev["saved_core"] == pytest.approx(5 * GPT3_A * S * S * B / tp, rel=1e-9)


def test_full_recompute_keeps_block_input(gpt3_block) -> None:
    ev = block_activations(gpt3_block).evaluate(ShardingPoint(b=B, s=S, c=S, tp=8,
                                                              sequence_parallel=True))
    assert ev["block_input"] == pytest.approx(2 * S * B * GPT3_H / 8)


def test_context_parallel_divides_sequence(gpt3_block) -> None:
    blk = block_activations(gpt3_block)
    full = blk.evaluate(ShardingPoint(b=B, s=S, c=S))
    cp2 = blk.evaluate(ShardingPoint(b=B, s=S / 2, c=S / 2))  # ring: local q and kv chunks
    linear = 34 * S * B * GPT3_H
    assert cp2["saved"] == pytest.approx(linear / 2 + (full["saved"] - linear) / 4, rel=1e-3)


def test_transient_peaks_exceed_nothing_saved_in_forward(gpt3_block) -> None:
    ev = block_activations(gpt3_block).evaluate(ShardingPoint(b=B, s=S, c=S))
    # Forward peak holds everything saved plus the live non-saved tensors (>= saved);
    # backward peak holds the saved set plus the score-sized gradients (> saved).
    assert ev["fwd_peak"] >= ev["saved"]
    score = 2 * GPT3_A * S * S * B
    assert ev["bwd_peak"] >= ev["saved"] + score


def test_views_alias_their_input() -> None:
    from charon_search.ir import Node, OpGraph, OpKind, Poly, Role, TensorSpec, TracedBlock, sym

    b, s = sym("b"), sym("s")
    ts = {i: TensorSpec(id=i, shape=(b, s, Poly.const(64)), dtype="bf16") for i in range(4)}
    nodes = (
        Node(id=0, name="mm", kind=OpKind.GEMM, role=Role.MLP_IN, inputs=(0,), outputs=(1,),
             bytes_written=ts[1].nbytes),
        Node(id=1, name="view", kind=OpKind.OTHER, role=Role.MLP_IN, inputs=(1,), outputs=(2,)),
        Node(id=2, name="act", kind=OpKind.ELEMENTWISE, role=Role.MLP_ACT, inputs=(2,),
             outputs=(3,), bytes_written=ts[3].nbytes),
    )
    g = OpGraph(name="f", nodes=nodes, tensors=ts, inputs=(0,), outputs=(3, 2))
    blk = block_activations(TracedBlock(name="dense", forward=g, saved=(2,)))
    ev = blk.evaluate(ShardingPoint(b=1, s=10, c=10, tp=2))
    # Saving the view saves its base (the GEMM output, tp-sharded) once: 10 * 64 * 2 / 2 bytes.
    assert ev["saved"] == pytest.approx(640)
    # Peak at the GEMM: its input (1280 B, seq class, freed after its last use) + its output;
    # the view adds nothing.
    assert ev["fwd_peak"] == pytest.approx(1280 + 640)
