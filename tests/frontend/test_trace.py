"""Tracing the debug models: structure, shapes, FLOPs, roles, saved activations, caching."""

from __future__ import annotations

import pickle

import pytest

from charon_search import frontend
from charon_search.catalog import load_model
from charon_search.errors import ConfigError, PassError
from charon_search.frontend import TracedModel, trace_model
from charon_search.frontend._symbolic import DimFitter
from charon_search.ir import OpKind, Phase, Poly, Role, check, sym

LINEAR_ROLES = {Role.ATTN_QKV, Role.ATTN_OUT, Role.MLP_IN, Role.MLP_OUT, Role.LM_HEAD,
                Role.MOE_ROUTER, Role.MOE_SHARED}


def _graphs(tm: TracedModel):
    for blk in tm.blocks.values():
        yield blk.forward
        if blk.backward is not None:
            yield blk.backward


def test_blocks_and_params(llama_train: TracedModel) -> None:
    spec = llama_train.spec
    assert set(llama_train.blocks) == {"embedding", "dense", "lm_head"}
    assert llama_train.block_counts() == {"embedding": 1, "lm_head": 1, "dense": 2}
    # embedding 256*64; layer: q 64*64, k/v 32*64 each, o 64*64, gate/up/down 3*64*160, 2 norms.
    layer = 64 * 64 * 2 + 32 * 64 * 2 + 3 * 64 * 160 + 2 * 64
    assert llama_train.blocks["dense"].num_params == layer
    assert llama_train.blocks["embedding"].num_params == 256 * 64
    assert llama_train.blocks["lm_head"].num_params == 64 + 256 * 64
    assert llama_train.num_params() == spec.num_params
    for g in _graphs(llama_train):
        check(g)


def test_dense_gemm_flops_are_exact(llama_train: TracedModel) -> None:
    """Forward GEMMs of a block = 2·T·(linear weights); backward = 2× that (dgrad + wgrad)."""
    blk = llama_train.blocks["dense"]
    linear = 64 * 64 * 2 + 32 * 64 * 2 + 3 * 64 * 160
    b, s = 3, 100
    for graph, factor in ((blk.forward, 2), (blk.backward, 4)):
        ev = graph.evaluate(b, s)
        gemm = sum(f for f, n in zip(ev.flops, graph.nodes, strict=True)
                   if n.kind == OpKind.GEMM)
        assert gemm == factor * b * s * linear
    attn = [n for n in blk.forward.nodes if n.kind == OpKind.ATTENTION]
    assert len(attn) == 1
    p = attn[0].params
    assert (p["heads"], p["kv_heads"], p["head_dim"], p["causal"]) == (4, 2, 16, 1)
    assert p["batch"] == sym("b") and p["q_len"] == sym("s") and p["kv_len"] == sym("c")
    # 4·b·h·s·c·d forward, 2.5× backward (torch.utils.flop_counter convention).
    assert attn[0].flops == 4 * 4 * 16 * sym("b") * sym("s") * sym("c")
    bwd = [n for n in blk.backward.nodes if n.kind == OpKind.ATTENTION_BWD]
    assert len(bwd) == 1 and bwd[0].flops == 2.5 * attn[0].flops


def test_gemm_params_use_tokens(llama_train: TracedModel) -> None:
    for n in llama_train.blocks["dense"].forward.nodes:
        if n.kind == OpKind.GEMM:
            assert n.params["m"] == sym("b") * sym("s"), n.name


def test_roles_on_every_gemm_fwd_and_bwd(llama_train: TracedModel, moe_train: TracedModel
                                         ) -> None:
    for tm in (llama_train, moe_train):
        for g in _graphs(tm):
            for n in g.nodes:
                if n.kind in (OpKind.GEMM, OpKind.GROUPED_GEMM):
                    assert n.role, (g.name, n.name)
                    assert n.role in LINEAR_ROLES or n.role == Role.MOE_EXPERT, (g.name, n.name)
                    assert n.module_path, (g.name, n.name)
    dense = llama_train.blocks["dense"]
    fwd_roles = {n.role for n in dense.forward.nodes}
    bwd_roles = {n.role for n in dense.backward.nodes}
    expected = {Role.ATTN_NORM, Role.ATTN_QKV, Role.ATTN_ROPE, Role.ATTN_CORE, Role.ATTN_OUT,
                Role.MLP_NORM, Role.MLP_IN, Role.MLP_ACT, Role.MLP_OUT, Role.RESIDUAL}
    assert expected <= fwd_roles
    assert expected - {Role.RESIDUAL} <= bwd_roles
    assert all(n.phase == Phase.BACKWARD for n in dense.backward.nodes)
    head = llama_train.blocks["lm_head"]
    assert {Role.FINAL_NORM, Role.LM_HEAD, Role.LOSS} <= {n.role for n in head.forward.nodes}


def test_rmsnorm_chain_is_one_norm_node(llama_train: TracedModel) -> None:
    norms = [n for n in llama_train.blocks["dense"].forward.nodes if n.kind == OpKind.NORM]
    assert [n.module_path for n in norms] == ["input_layernorm", "post_attention_layernorm"]
    assert all(n.params["cols"] == 64 for n in norms)
    assert all(n.params["rows"] == sym("b") * sym("s") for n in norms)


def test_saved_activations_are_forward_outputs(llama_train: TracedModel) -> None:
    blk = llama_train.blocks["dense"]
    assert blk.saved
    assert set(blk.saved) <= set(blk.forward.outputs)
    assert set(blk.saved) <= set(blk.backward.inputs)
    assert not set(blk.saved) & set(blk.forward.param_tensors)
    # Forward and backward share tensor ids: every saved id has the same spec in both.
    for t in blk.saved:
        assert blk.forward.tensors[t] == blk.backward.tensors[t]
    # Saved bytes are linear in b*s (sdpa: no s^2 term).
    saved = blk.saved_bytes()
    assert saved.degree("s") == 1 and saved.degree("b") == 1


def test_moe_block(moe_train: TracedModel) -> None:
    spec = moe_train.spec
    assert set(moe_train.blocks) == {"embedding", "dense", "moe", "lm_head"}
    fwd = moe_train.blocks["moe"].forward
    grouped = [n for n in fwd.nodes if n.kind == OpKind.GROUPED_GEMM]
    assert len(grouped) == 2
    for n in grouped:
        assert n.role == Role.MOE_EXPERT
        assert n.params["tokens"] == sym("b") * sym("s")
        assert n.params["top_k"] == spec.num_experts_per_token
        assert n.params["num_experts"] == spec.num_experts
    # gate_up: [T·k, 64] x [64, 2·32]; down: [T·k, 32] x [32, 64].
    k = spec.num_experts_per_token
    assert grouped[0].flops == 2 * k * 64 * 64 * sym("b") * sym("s")
    assert grouped[1].flops == 2 * k * 32 * 64 * sym("b") * sym("s")
    roles = {n.role for n in fwd.nodes}
    assert {Role.MOE_ROUTER, Role.MOE_DISPATCH, Role.MOE_EXPERT, Role.MOE_COMBINE} <= roles
    assert any(n.kind == OpKind.MOE_ROUTING for n in fwd.nodes)
    bwd_grouped = [n for n in moe_train.blocks["moe"].backward.nodes
                   if n.kind == OpKind.GROUPED_GEMM]
    assert len(bwd_grouped) == 4 and all(n.role == Role.MOE_EXPERT for n in bwd_grouped)
    assert moe_train.num_params() == spec.num_params


def test_decode_scales_with_context(llama_decode: TracedModel) -> None:
    blk = llama_decode.blocks["dense"]
    assert blk.backward is None and blk.saved == ()
    attn = [n for n in blk.forward.nodes if n.kind == OpKind.ATTENTION]
    assert len(attn) == 1
    p = attn[0].params
    assert p["q_len"] == 1 and p["kv_len"] == sym("c") and p["causal"] == 0
    f1 = llama_decode.total_flops(4, 1, 1000)
    f2 = llama_decode.total_flops(4, 1, 2000)
    attn_flops = 2 * 4 * 4 * 16 * 2  # per layer per unit c at b=4: 2·b·h·(d + d_v)
    assert f2 - f1 == pytest.approx(1000 * attn_flops * 2)  # 2 layers
    # The KV cache append writes one token, not the whole cache.
    appends = [n for n in blk.forward.nodes if "kv_append" in n.tags]
    assert len(appends) == 2
    for n in appends:
        assert n.bytes_written.degree("c") == 0 and n.bytes_read.degree("c") == 0
    gemms = [n for n in blk.forward.nodes if n.kind == OpKind.GEMM]
    assert all(n.params["m"] == sym("b") for n in gemms)


def test_prefill_lm_head_on_last_token() -> None:
    tm = trace_model("debug-llama", "prefill")
    head = [n for n in tm.blocks["lm_head"].forward.nodes if n.role == Role.LM_HEAD]
    assert len(head) == 1 and head[0].kind == OpKind.GEMM
    assert head[0].params["m"] == sym("b") and head[0].params["n"] == 256


def test_eager_attention_is_unfused() -> None:
    tm = trace_model("debug-llama", "train", attn_impl="eager")
    fwd = tm.blocks["dense"].forward
    kinds = [n.kind for n in fwd.nodes if n.role == Role.ATTN_CORE]
    assert OpKind.ATTENTION not in kinds
    assert kinds.count(OpKind.BATCHED_GEMM) == 2 and OpKind.SOFTMAX in kinds
    scores = next(n for n in fwd.nodes if n.kind == OpKind.SOFTMAX)
    assert scores.params["cols"] == sym("s")
    assert tm.blocks["dense"].saved_bytes().degree("s") == 2  # the s×s probabilities


def test_no_retrace_on_cache_hit(llama_train: TracedModel) -> None:
    before = frontend.TRACE_CALLS
    again = trace_model("debug-llama", "train")
    assert again.blocks is llama_train.blocks
    assert again.total_flops(7, 333) != llama_train.total_flops(2, 64)
    # Drop the in-memory copy: the disk cache serves it, still without a trace.
    frontend.clear_memory_cache()
    from_disk = trace_model(load_model("debug-llama"), "train")
    assert frontend.TRACE_CALLS == before
    assert from_disk.total_flops(5, 77) == pytest.approx(llama_train.total_flops(5, 77))


def test_traced_model_pickles(moe_train: TracedModel) -> None:
    clone = pickle.loads(pickle.dumps(moe_train))
    assert clone.total_flops(2, 33) == pytest.approx(moe_train.total_flops(2, 33))


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="phase"):
        trace_model("debug-llama", "backward")
    with pytest.raises(ConfigError, match="dtype"):
        trace_model("debug-llama", "train", dtype="int3")
    with pytest.raises(ConfigError, match="attn_impl"):
        trace_model("debug-llama", "train", attn_impl="flash9")


def test_dim_fitter() -> None:
    b, s, c = sym("b"), sym("s"), sym("c")
    two = DimFitter(({"b": 3, "s": 13, "c": 13}, {"b": 5, "s": 17, "c": 17}), ("b", "s"))
    assert two.fit(64, 64) == Poly.const(64)
    assert two.fit(3 * 13, 5 * 17) == b * s
    assert two.fit(4 * 3 * 13 * 13, 4 * 5 * 17 * 17) == 4 * b * s * s
    assert two.fit(14, 18) == s + 1
    with pytest.raises(PassError):
        two.fit(10, 11)
    # One point at primes that divide no model constant: factorisation.
    one = DimFitter(({"b": 10007, "s": 1, "c": 113},), ("b", "c"))
    assert one.fit(128256) == Poly.const(128256)
    assert one.fit(8 * 10007) == 8 * b
    assert one.fit(112) == c - 1
    assert one.fit(32 * 10007 * 113) == 32 * b * c


def test_trace_points_avoid_config_factors() -> None:
    from charon_search.frontend._symbolic import trace_points

    (p,) = trace_points("train", 1, {"hidden_size": 97 * 64, "n": [89 * 3]})
    assert p["s"] == 83 and p["c"] == 83 and p["b"] == 10007
    (d,) = trace_points("decode", 1, {"vocab_size": 113 * 1000})
    assert d["s"] == 1 and d["c"] == 109


def _loss_nodes(tm: TracedModel) -> dict[str, object]:
    lm = tm.blocks["lm_head"]
    return {n.name: n for g in (lm.forward, lm.backward) for n in g.nodes
            if n.kind in (OpKind.SOFTMAX, OpKind.REDUCTION)}


@pytest.mark.parametrize(("vocab", "passes"), [(256, 1), (32768, 3)])
def test_cross_entropy_bytes_follow_the_aten_kernels(vocab: int, passes: int) -> None:
    """The LM head's loss: ``nll_loss_forward`` reads one log-probability per row (and the
    targets), not the [rows, vocab] tensor; ``nll_loss_backward`` writes the zero-filled input
    gradient without reading ``self``. ATen's row softmax reads a row once while it fits in
    registers (< 10,240 elements) or 48 KiB of shared memory, three times otherwise (max, sum of
    exponentials, write), and its backward reads the gradient twice."""
    from charon_search.catalog import spec_from_config

    base = load_model("debug-llama")
    tm = trace_model(spec_from_config(f"debug-llama-v{vocab}",
                                      dict(base.hf_config, vocab_size=vocab)), "train")
    nodes = _loss_nodes(tm)
    rows = 1 * 128  # b = 1, s = 128
    logits = rows * vocab * 4  # fp32 log-probabilities
    assert nodes["nll_loss_forward"].bytes_read(1, 128) == rows * 4 + rows * 8
    bwd = nodes["nll_loss_backward"]
    assert bwd.bytes_read(1, 128) == rows * 8 + 4 + 4  # targets, grad, total weight
    assert bwd.bytes_written(1, 128) == logits
    assert nodes["_log_softmax"].bytes_read(1, 128) == passes * logits
    assert nodes["_log_softmax"].bytes_written(1, 128) == logits
    # backward: the gradient read once for its row sum (long rows: once more) and the output
    assert nodes["_log_softmax_backward_data"].bytes_read(1, 128) == (
        (2 if passes == 3 else 1) * logits + logits)
