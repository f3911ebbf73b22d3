"""Every catalog model loads and traces (one block per layer type), in training mode; a
representative set also traces prefill and decode. The big catalog sweep is marked slow."""

from __future__ import annotations

import pytest

from charon_search.catalog import list_models, load_model
from charon_search.catalog.spec import is_linear_block, is_moe_block
from charon_search.frontend import trace_model
from charon_search.ir import OpKind, check

#: Traced in the fast test run (one per architecture family); the rest are `slow`.
FAST = {"debug-llama", "debug-moe", "debug-hybrid", "gpt-1.7b", "qwen3-30b-a3b",
        "deepseek-v3"}
INFERENCE = ["debug-llama", "debug-moe", "debug-hybrid", "gpt-1.7b", "deepseek-v3",
             "gpt-oss-120b", "mixtral-8x7b", "mpt-1b"]


def _check_traced(name: str, phase: str) -> None:
    spec = load_model(name)
    tm = trace_model(spec, phase)
    assert set(tm.blocks) == {"embedding", "lm_head", *spec.block_types}
    assert tm.num_params() == spec.num_params
    for blk in tm.blocks.values():
        for g in (blk.forward, blk.backward):
            if g is not None:
                check(g)
                for n in g.nodes:
                    if n.kind in (OpKind.GEMM, OpKind.GROUPED_GEMM):
                        assert n.role, (g.name, n.name)
    for t in spec.block_types:
        fwd = tm.blocks[t].forward
        kinds = {n.kind for n in fwd.nodes}
        assert OpKind.GEMM in kinds
        if is_linear_block(t):
            assert OpKind.LINEAR_ATTENTION in kinds and OpKind.ATTENTION not in kinds
        else:
            assert OpKind.ATTENTION in kinds or OpKind.BATCHED_GEMM in kinds
        if is_moe_block(t):
            assert OpKind.GROUPED_GEMM in kinds
        if phase == "train":
            assert tm.blocks[t].backward is not None and tm.blocks[t].saved
    b, s = 2, 256
    c = 1024 if phase == "decode" else None
    assert tm.total_flops(b, 1 if phase == "decode" else s, c) > 0


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in list_models()],
)
def test_catalog_model_traces_for_training(name: str) -> None:
    _check_traced(name, "train")


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in INFERENCE]
)
def test_inference_traces(name: str, phase: str) -> None:
    _check_traced(name, phase)


@pytest.mark.parametrize(
    "name", ["debug-llama", pytest.param("debug-moe", marks=pytest.mark.slow)]
)
def test_single_point_trace_equals_two_point_trace(name: str) -> None:
    """The default one-trace prime factorisation of dims gives the same graph as tracing at two
    points and fitting each dim across both."""
    from charon_search.frontend import _trace_uncached

    spec = load_model(name)
    one = _trace_uncached(spec, "train", "bf16", "sdpa")
    two = _trace_uncached(spec, "train", "bf16", "sdpa", num_points=2)
    for name, blk in one.blocks.items():
        other = two.blocks[name]
        for g1, g2 in ((blk.forward, other.forward), (blk.backward, other.backward)):
            assert len(g1.nodes) == len(g2.nodes)
            for n1, n2 in zip(g1.nodes, g2.nodes, strict=True):
                assert (n1.kind, n1.role, n1.flops, n1.bytes) == (
                    n2.kind, n2.role, n2.flops, n2.bytes), n1.name
                assert dict(n1.params) == dict(n2.params), n1.name


def test_deepseek_decode_uses_absorbed_mla() -> None:
    """Decode attends over the 576-wide latent cache with one KV head; nothing else grows with
    c except the attention and the one-token cache append (no per-step kv_b_proj re-expansion).
    """
    from charon_search.ir import Role, sym

    tm = trace_model("deepseek-v3", "decode")
    fwd = tm.blocks["moe"].forward
    attn = [n for n in fwd.nodes if n.kind == OpKind.ATTENTION]
    assert len(attn) == 1
    p = attn[0].params
    assert (p["heads"], p["kv_heads"], p["head_dim"], p["q_len"]) == (128, 1, 576, 1)
    assert p["kv_len"] == sym("c")
    for n in fwd.nodes:
        if n.flops.degree("c") or n.bytes.degree("c"):
            assert n is attn[0], n.name
    absorb = [n for n in fwd.nodes if n.kind == OpKind.BATCHED_GEMM]
    assert [(n.params["batch"], n.params["k"], n.params["n"]) for n in absorb] == [
        (128, 128, 512), (128, 512, 128)]
    assert all(n.role == Role.ATTN_CORE for n in absorb)


@pytest.mark.slow
def test_gpt_oss_sdpa_uses_fused_attention() -> None:
    tm = trace_model("gpt-oss-120b", "decode")
    assert tm.attn_impl == "sdpa"
    kinds = [n.kind for n in tm.blocks["moe"].forward.nodes]
    assert kinds.count(OpKind.ATTENTION) == 1 and OpKind.BATCHED_GEMM not in kinds
