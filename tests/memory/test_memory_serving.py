"""Serving KV-cache capacity: bytes per token closed forms and the vLLM-style budget."""

from __future__ import annotations

import pytest

from charon_search.catalog.spec import ModelSpec
from charon_search.errors import ConfigError
from charon_search.memory import kv_bytes_per_token, kv_cache_capacity
from charon_search.testing import toy_cluster
from charon_search.units import GIB


def _llama8b() -> ModelSpec:
    # Llama 3.1 8B shapes (meta-llama/Llama-3.1-8B config.json).
    return ModelSpec(
        name="test-llama-8b", hf_config={}, model_type="llama", num_layers=32, hidden_size=4096,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336,
        vocab_size=128256, layer_types=("dense",) * 32)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_gqa_bytes_per_token(tp: int) -> None:
    assert kv_bytes_per_token(_llama8b(), tp=tp) == 2 * 32 * 8 * 128 * 2 / tp


def test_kv_heads_replicated_beyond_tp() -> None:
    # 8 KV heads over TP 16: each GPU still holds one whole head.
    assert kv_bytes_per_token(_llama8b(), tp=16) == 2 * 32 * 1 * 128 * 2


def test_mla_latent_bytes() -> None:
    # DeepSeek-V3: kv_lora_rank 512 + qk_rope_head_dim 64 per layer, 61 layers, replicated on TP.
    spec = ModelSpec(
        name="test-mla", hf_config={"kv_lora_rank": 512, "qk_rope_head_dim": 64},
        model_type="deepseek_v3", num_layers=61, hidden_size=7168, num_attention_heads=128,
        num_key_value_heads=128, head_dim=192, intermediate_size=18432, vocab_size=129280,
        attention="mla")
    assert kv_bytes_per_token(spec, tp=8) == 61 * 576 * 2
    assert kv_bytes_per_token(spec, tp=8, kv_dtype="fp8") == 61 * 576


def test_capacity_closed_form() -> None:
    spec = _llama8b()
    h, ffn, v = 4096, 14336, 128256
    layer = h * 4096 + 2 * h * 1024 + 4096 * h + 3 * h * ffn
    tp = 2
    weights = 2 * (32 * (layer / tp + 2 * h) + v * h / tp + v * h / tp + h)
    cap = kv_cache_capacity(spec, toy_cluster(), tp=tp, gpu_memory_utilization=0.9,
                            activation_bytes=GIB, cuda_graph_pool_bytes=0.5 * GIB)
    assert cap.weights_bytes == pytest.approx(weights)
    per_token = 2 * 32 * 8 * 128 * 2 / tp
    device = 85_018_877_624  # the H100's 79.18 GiB as CUDA reports it
    tokens = (0.9 * device - weights - 1.5 * GIB) // per_token
    assert cap.num_blocks == tokens // 16
    assert cap.num_tokens == cap.num_blocks * 16
    assert cap.fits


def test_capacity_zero_when_weights_do_not_fit() -> None:
    cap = kv_cache_capacity(_llama8b(), toy_cluster(), tp=1, gpu_memory_utilization=0.1,
                            activation_bytes=0, cuda_graph_pool_bytes=0)
    assert cap.num_blocks == 0 and not cap.fits


def test_capacity_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        kv_cache_capacity(_llama8b(), toy_cluster(), tp=1, gpu_memory_utilization=1.5,
                          activation_bytes=0, cuda_graph_pool_bytes=0)
    with pytest.raises(ConfigError, match="tp"):
        kv_cache_capacity(_llama8b(), toy_cluster(), tp=3, activation_bytes=0,
                          cuda_graph_pool_bytes=0)


def test_quantized_checkpoint_keeps_its_bf16_modules_in_weight_memory():
    """gpt-oss-120b's checkpoint stores only the routed experts in MXFP4 (4 bits + one E8M0
    scale byte per 32 elements = 0.53125 byte); attention (with biases and sinks), router,
    norms, embedding and LM head are bf16. From the config (h = i = 2880, 128 experts, 36
    layers, 64 x 64 query and 8 x 64 KV heads, vocabulary 201,088): 114,701,598,720 expert
    parameters and 2,127,557,952 others at 2 bytes, 65.19 GB on one GPU (every weight at a bare
    0.5 byte: 58.41 GB)."""
    from charon_search.catalog import load_model
    from charon_search.serving._graphs import checkpoint_quant

    spec = load_model("gpt-oss-120b")
    h, i, e, layers, heads, d, kv, vocab = 2880, 2880, 128, 36, 64, 64, 8, 201088
    expert = layers * e * (h * 2 * i + 2 * i + i * h + h)
    attn = layers * (h * heads * d + heads * d + 2 * (h * kv * d + kv * d) + heads * d * h + h
                     + heads)
    other = attn + layers * (h * e + e) + layers * 2 * h + h + 2 * vocab * h
    assert (expert, other) == (114_701_598_720, 2_127_557_952)
    quant = checkpoint_quant(spec, "fp4")
    assert quant.weight_bytes == 0.53125
    cap = kv_cache_capacity(spec, "h100-sxm-8gpu", tp=1, weight_dtype="nvfp4",
                            quantized_roles=quant.quantized_roles,
                            quantized_weight_bytes=quant.weight_bytes)
    assert cap.weights_bytes == pytest.approx(0.53125 * expert + 2 * other, rel=1e-3)
    flat = kv_cache_capacity(spec, "h100-sxm-8gpu", tp=1, weight_dtype="nvfp4")
    assert flat.weights_bytes == pytest.approx(0.5 * (expert + other), rel=1e-3)
    assert cap.num_tokens < flat.num_tokens


@pytest.mark.parametrize("rule", ["static", "free"])
def test_engine_memory_rules_closed_form(rule: str) -> None:
    """SGLang's static fraction holds weights + KV of the memory free before loading (the
    activations and graphs outside it); TensorRT-LLM's free fraction is a share of what the
    weights, activations and graphs leave (``memory.serving`` docstring)."""
    spec = _llama8b()
    act, graphs = GIB, 0.5 * GIB
    total = kv_cache_capacity(spec, toy_cluster(), tp=2, gpu_memory_utilization=0.85,
                              activation_bytes=act, cuda_graph_pool_bytes=graphs)
    cap = kv_cache_capacity(spec, toy_cluster(), tp=2, gpu_memory_utilization=0.85,
                            activation_bytes=act, cuda_graph_pool_bytes=graphs,
                            memory_rule=rule)
    w, device, extra = cap.weights_bytes, 85_018_877_624, cap.non_torch_bytes
    expected = (0.85 * (device - extra) - w if rule == "static"
                else 0.85 * (device - w - act - graphs - extra))
    assert cap.available_bytes == pytest.approx(expected)
    assert cap.num_blocks == int(expected // cap.kv_bytes_per_token) // 16
    # vLLM's rule takes everything off 0.85 of the device: the smallest of the three here.
    assert total.available_bytes == pytest.approx(0.85 * device - w - act - graphs - extra)
    assert total.num_blocks < cap.num_blocks


def test_unknown_memory_rule_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"memory_rule.*total"):
        kv_cache_capacity(_llama8b(), toy_cluster(), tp=1, memory_rule="sglang",
                          activation_bytes=0, cuda_graph_pool_bytes=0)
