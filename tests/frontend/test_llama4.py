"""Llama 4's MoE layers trace as grouped GEMMs over the routed rows (``frontend._llama4``).

transformers' own ``Llama4TextMoe`` pushes every token through all experts (a batched matmul
over ``[experts, tokens, hidden]``); the traced graph must hold the top-1 routed work only, which
the checks below count in closed form from the config (hidden 5120, 40 query / 8 KV heads of 128,
experts and shared expert of intermediate 8192, top-1 routing).
"""

from __future__ import annotations

import pytest

from charon_search.catalog import load_model
from charon_search.frontend import trace_model
from charon_search.ir import OpKind, Role

H, INTER, Q, KV = 5120, 8192, 40 * 128, 8 * 128


def _linear_flops_per_token(g, kinds) -> float:
    return sum(n.flops(b=1, s=1, c=1) for n in g.nodes if n.kind in kinds)


@pytest.mark.slow
def test_scout_moe_block_prices_the_routed_rows_only() -> None:
    tm = trace_model("llama-4-scout-17b-16e", "prefill")
    g = tm.blocks["moe"].forward
    assert not any(n.kind == OpKind.BATCHED_GEMM for n in g.nodes)  # no dense all-expert bmm
    experts = [n for n in g.nodes if n.kind == OpKind.GROUPED_GEMM]
    assert {n.role for n in experts} == {Role.MOE_EXPERT}
    assert all(n.params["top_k"](b=1, s=1, c=1) == 1 for n in experts)
    # Routed experts: gate/up (5120 -> 2 x 8192) and down (8192 -> 5120) for 1 expert a token.
    assert _linear_flops_per_token(g, {OpKind.GROUPED_GEMM}) == 2 * 3 * H * INTER
    # Dense GEMMs: q, k, v, o, the router (16 logits) and the shared expert.
    dense = 2 * (H * Q + 2 * H * KV + Q * H + H * 16 + 3 * H * INTER)
    assert _linear_flops_per_token(g, {OpKind.GEMM}) == dense
    # Meta's "17B active": the 48 layers' GEMM FLOPs per token, plus the LM head's, are twice
    # the active parameters but the embedding table (a lookup, no GEMM).
    vocab = load_model("llama-4-scout-17b-16e").vocab_size
    active = (48 * (dense + 2 * 3 * H * INTER) + 2 * H * vocab) / 2 + H * vocab
    assert 17.0e9 < active < 17.3e9


@pytest.mark.slow
def test_scout_training_backward_doubles_the_routed_gemms() -> None:
    tm = trace_model("llama-4-scout-17b-16e", "train")
    blk = tm.blocks["moe"]
    fwd = _linear_flops_per_token(blk.forward, {OpKind.GROUPED_GEMM})
    bwd = _linear_flops_per_token(blk.backward, {OpKind.GROUPED_GEMM})
    assert fwd == 2 * 3 * H * INTER and bwd == 2 * fwd  # dgrad + wgrad


@pytest.mark.slow
def test_maverick_alternates_dense_and_moe_blocks() -> None:
    tm = trace_model("llama-4-maverick-17b-128e", "decode")
    assert set(tm.blocks) == {"embedding", "dense", "moe", "lm_head"}
    dense = _linear_flops_per_token(tm.blocks["dense"].forward, {OpKind.GEMM})
    # Dense layers: attention + one MLP of intermediate_size_mlp 16,384.
    assert dense == 2 * (H * Q + 2 * H * KV + Q * H + 3 * H * 16_384)
    moe = tm.blocks["moe"].forward
    assert _linear_flops_per_token(moe, {OpKind.GROUPED_GEMM}) == 2 * 3 * H * INTER
    assert {n.params["num_experts"](b=1, s=1, c=1)
            for n in moe.nodes if n.kind == OpKind.GROUPED_GEMM} == {128}
