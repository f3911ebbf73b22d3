"""Frontend fixes of the second frontend review: DeepSeek-V2 decode, attention nodes traced
through a mask, the latent cache read once, K/V heads replicated under TP, cache keys, and
models whose forward cannot be traced.

Every number is a closed form of the config's shapes (b requests, s queries, c keys)."""

from __future__ import annotations

import dataclasses

import pytest

from charon_search.catalog import ModelSpec, spec_from_config
from charon_search.cost.selector import _family
from charon_search.errors import ConfigError
from charon_search.frontend import _cache_key, trace_model
from charon_search.ir import OpKind
from charon_search.passes.parallelize import parallelize_inference
from charon_search.sim.costing import kernel_flops

# DeepSeek-V2-Lite's layout at toy size (model_type deepseek_v2: one complex ``freqs_cis``
# RoPE tensor, no query LoRA, a dense first layer, 2 shared experts).
DSV2 = {"model_type": "deepseek_v2", "hidden_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 512,
        "vocab_size": 1000, "max_position_embeddings": 4096, "kv_lora_rank": 64,
        "q_lora_rank": None, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
        "n_shared_experts": 2, "first_k_dense_replace": 1, "topk_method": "greedy",
        "n_group": 1, "topk_group": 1}
LATENT = 64 + 16  # kv_lora_rank + qk_rope_head_dim: one cached latent token

# tiiuae/falcon-40b config.json shapes: 128 query heads, 8 KV heads of 64.
FALCON_40B = {"model_type": "falcon", "alibi": False, "bias": False, "hidden_size": 8192,
              "new_decoder_architecture": True, "num_attention_heads": 128, "num_kv_heads": 8,
              "num_hidden_layers": 60, "parallel_attn": True, "vocab_size": 65024}


def _attention(graph):
    hits = [n for n in graph.nodes if n.kind == OpKind.ATTENTION]
    assert len(hits) == 1, [n.name for n in hits]
    return hits[0]


def _params(node, b, s, c):
    return {k: float(v(b, s, c)) for k, v in node.params.items()}


@pytest.fixture(scope="module")
def dsv2() -> ModelSpec:
    return spec_from_config("dsv2-toy", DSV2)


# ---------------------------------------------------------------------------- F2, F8
def test_deepseek_v2_decodes_with_its_complex_rope(dsv2: ModelSpec) -> None:
    """Absorbed MLA over the latent cache: 8 query heads, one 80-wide KV head; FLOPs
    2·b·h·c·(80 + 80) (V passed 80 wide, documented); the latent, K and V at once, read once:
    b·c·80·2 B plus the queries b·h·80·2 B."""
    tm = trace_model(dsv2, "decode")
    b, c = 8, 4096
    for block in ("dense", "moe"):
        node = _attention(tm.blocks[block].forward)
        p = _params(node, b, 1, c)
        assert (p["heads"], p["kv_heads"], p["q_len"], p["head_dim"]) == (8, 1, 1, LATENT)
        assert node.flops(b, 1, c) == 2 * b * 8 * c * (LATENT + LATENT)
        assert node.bytes_read(b, 1, c) == b * c * LATENT * 2 + b * 8 * LATENT * 2


def test_deepseek_v3_latent_is_read_once() -> None:
    """DeepSeek-V3 decode, b = 8, c = 4,096: latent 8 x 4096 x 576 x 2 B = 37.75 MB read once,
    plus 8 x 128 x 576 x 2 B of queries (was 2 x 37.75 MB + queries)."""
    node = _attention(trace_model("deepseek-v3", "decode").blocks["moe"].forward)
    assert node.bytes_read(8, 1, 4096) == 8 * 4096 * 576 * 2 + 8 * 128 * 576 * 2 == 38_928_384


# ---------------------------------------------------------------------------- F3
def test_falcon_40b_attention_keeps_its_kv_heads_and_causality() -> None:
    """HF Falcon always passes a mask. Train at s = 2048: 128 query / 8 KV heads, causal, no
    repeated K/V, the kernel's FLOPs half of 2·b·h·s·c·(64 + 64) = 68.7 GFLOP. Decode: 128
    heads over 8 KV heads, one query: the decode family, 2·b·h·c·128 FLOPs."""
    spec = spec_from_config("falcon-40b", FALCON_40B)
    train = trace_model(spec, "train").blocks["dense"]
    node = _attention(train.forward)
    p = _params(node, 1, 2048, 2048)
    assert (p["heads"], p["kv_heads"], p["causal"]) == (128, 8, 1)
    assert kernel_flops(node, 1, 2048, 2048) == 2 * 128 * 2048 * 2048 * 128 / 2 == 68_719_476_736
    bwd = next(n for n in train.backward.nodes if n.kind == OpKind.ATTENTION_BWD)
    assert _params(bwd, 1, 2048, 2048)["kv_heads"] == 8
    assert not any(n.kind == OpKind.COPY and "repeat" in n.target for n in train.forward.nodes)

    dec = _attention(trace_model(spec, "decode").blocks["dense"].forward)
    p = _params(dec, 32, 1, 2048)
    assert (p["heads"], p["kv_heads"], p["q_len"]) == (128, 8, 1)
    assert _family("attention", p) == "decode"
    assert dec.flops(32, 1, 2048) == 2 * 32 * 128 * 2048 * 128


@pytest.mark.parametrize("cfg", [
    # Mistral with a 64-token window (HF builds a windowed mask), Falcon MQA, Gemma 3.
    {"model_type": "mistral", "hidden_size": 256, "num_hidden_layers": 2,
     "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512,
     "vocab_size": 1000, "sliding_window": 64},
    {"model_type": "falcon", "hidden_size": 256, "num_hidden_layers": 2,
     "num_attention_heads": 8, "vocab_size": 1000, "multi_query": True,
     "new_decoder_architecture": False, "parallel_attn": True, "bias": False, "alibi": False},
    {"model_type": "gemma3_text", "hidden_size": 256, "num_hidden_layers": 2,
     "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
     "intermediate_size": 512, "vocab_size": 1000, "sliding_window": 128,
     "layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 64},
])
@pytest.mark.parametrize("phase", ["train", "prefill"])
def test_masked_attention_is_causal_gqa(cfg: dict, phase: str) -> None:
    spec = spec_from_config(cfg["model_type"], cfg)
    tm = trace_model(spec, phase)
    for t in spec.block_types:
        node = _attention(tm.blocks[t].forward)
        p = _params(node, 2, 512, 512)
        assert p["causal"] == 1 and p["kv_heads"] == spec.num_key_value_heads
        assert node.flops(2, 512, 512) == 2 * 2 * 8 * 512 * 512 * 2 * spec.head_dim


def test_glm5_style_mla_training_is_causal() -> None:
    """GLM-5's training path (glm_moe_dsa) masks its dense attention: priced causal, half of
    2·b·h·s·c·(48 + 32) for 4 heads of q/k 48, v 32."""
    cfg = {"model_type": "glm_moe_dsa", "hidden_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512,
           "vocab_size": 1000, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
           "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "moe_intermediate_size": 64, "first_k_dense_replace": 1,
           "index_n_heads": 2, "index_head_dim": 32, "index_topk": 64, "rope_interleave": True}
    spec = spec_from_config("glm5-toy", cfg)
    tm = trace_model(spec, "train")
    b, s = 2, 512
    for t in spec.block_types:
        node = _attention(tm.blocks[t].forward)
        assert _params(node, b, s, s)["causal"] == 1
        assert kernel_flops(node, b, s, s) == 2 * b * 4 * s * s * (48 + 32) / 2


# ---------------------------------------------------------------------------- F10
def test_tp_beyond_the_kv_heads_reads_one_whole_head() -> None:
    """8 query / 2 KV heads of 128 at TP 4: each rank holds 2 query heads and one whole,
    replicated KV head, so decode at b = 1, c = 8192 reads K + V = 2 x 8192 x 128 x 2 B =
    4,194,304 B plus its queries 2 x 128 x 2 B (was a quarter of both KV heads: 2,097,664)."""
    cfg = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 2,
           "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
           "intermediate_size": 2048, "vocab_size": 1000}
    tm = trace_model(spec_from_config("gqa-toy", cfg), "decode")
    whole = _attention(tm.blocks["dense"].forward)
    assert whole.bytes_read(1, 1, 8192) == 2 * 2 * 8192 * 128 * 2 + 8 * 128 * 2
    for tp, kv_read in ((2, 2 * 8192 * 128 * 2), (4, 2 * 8192 * 128 * 2)):
        node = _attention(parallelize_inference(tm, tp=tp)["dense"])
        assert node.params["kv_heads"].const_value() == 1
        assert node.bytes_read(1, 1, 8192) == kv_read + (8 // tp) * 128 * 2


def test_tp_keeps_the_whole_mla_latent_per_rank(dsv2: ModelSpec) -> None:
    """Absorbed MLA has one latent KV head: TP splits the query heads, every rank reads the
    whole latent (b·c·80·2 B), not 1/tp of it."""
    tm = trace_model(dsv2, "decode")
    node = _attention(parallelize_inference(tm, tp=4)["moe"])
    assert node.bytes_read(8, 1, 4096) == 8 * 4096 * LATENT * 2 + 8 * 2 * LATENT * 2


# ---------------------------------------------------------------------------- F4
def test_a_layer_tracing_no_attention_is_refused() -> None:
    """RWKV (no ``layer_types``; its time-mixing scan traces as plain elementwise ops) would
    otherwise be priced as MLP-only layers."""
    cfg = {"model_type": "rwkv", "hidden_size": 256, "num_hidden_layers": 1,
           "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 1000,
           "attention_hidden_size": 256}
    with pytest.raises(ConfigError, match=r"model_type 'rwkv'\): its 'dense' layers \(.*"
                                          r"attention: RwkvSelfAttention.*\) trace no attention "
                                          r"op") as e:
        trace_model(spec_from_config("rwkv-toy", cfg), "prefill", use_disk_cache=False)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------- F5
def test_trace_key_follows_the_layer_types(dsv2: ModelSpec) -> None:
    other = dataclasses.replace(dsv2, layer_types=("moe",) * 4)
    assert _cache_key(dsv2, "train", "bf16", "sdpa") != _cache_key(other, "train", "bf16",
                                                                   "sdpa")
    renamed = dataclasses.replace(dsv2, name="another-name")
    assert _cache_key(dsv2, "train", "bf16", "sdpa") == _cache_key(renamed, "train", "bf16",
                                                                   "sdpa")


# ---------------------------------------------------------------------------- F6
def test_a_forward_fake_tensors_cannot_follow_is_one_config_error() -> None:
    """DBRX's experts loop over the experts a batch reaches (``nonzero``): refused in one line
    naming the model type and the op, not a torch traceback."""
    cfg = {"model_type": "dbrx", "d_model": 256, "n_heads": 8, "n_layers": 2,
           "vocab_size": 1000, "max_seq_len": 4096,
           "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 500000},
           "ffn_config": {"ffn_hidden_size": 512, "moe_num_experts": 4, "moe_top_k": 2}}
    spec = spec_from_config("dbrx-toy", cfg)
    assert spec.num_experts == 4 and spec.layer_types == ("moe", "moe")
    with pytest.raises(ConfigError, match=r"model_type 'dbrx'\) cannot be traced for train: "
                                          r"its HF forward runs `aten\.nonzero") as e:
        trace_model(spec, "train", use_disk_cache=False)
    assert "\n" not in str(e.value)
