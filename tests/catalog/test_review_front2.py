"""Catalog fixes of the second frontend review: dense/MoE layer patterns of every model type,
refused token mixers, cache keys, DBRX, required MoE/MLA fields, active parameters, RoPE type.

Every count below is written out by hand from the config's shapes (and, where one exists, held
against the model card's figure)."""

from __future__ import annotations

import dataclasses

import pytest

from charon_search.catalog import ModelSpec, load_model, spec_from_config, spec_hash
from charon_search.catalog._hf import _counts_key, count_params, count_params_full
from charon_search.errors import ConfigError

# zai-org/GLM-4.5 config.json (model_type glm4_moe): 3 dense layers, then 89 MoE layers.
GLM45 = {
    "model_type": "glm4_moe", "attention_bias": True, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 5120, "partial_rotary_factor": 0.5, "intermediate_size": 12288,
    "max_position_embeddings": 131072, "moe_intermediate_size": 1536, "norm_topk_prob": True,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 160,
    "n_shared_experts": 1, "routed_scaling_factor": 2.5, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "num_hidden_layers": 92, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000, "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False, "use_qk_norm": False, "vocab_size": 151552,
}

SMALL_GLM4_MOE = {
    "model_type": "glm4_moe", "hidden_size": 256, "head_dim": 32, "num_attention_heads": 8,
    "num_key_value_heads": 2, "attention_bias": True, "partial_rotary_factor": 0.5,
    "intermediate_size": 1024, "moe_intermediate_size": 64, "n_routed_experts": 8,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "num_hidden_layers": 4, "vocab_size": 1000, "tie_word_embeddings": False,
}


def load_model_from(cfg: dict, name: str = "test") -> ModelSpec:
    return spec_from_config(name, cfg)


def _glm4_moe_params(h: int, layers: int, dense: int, heads: int, kv: int, hd: int, vocab: int,
                     inter: int, moe_inter: int, experts: int) -> int:
    """transformers ``Glm4MoeForCausalLM``: q/k/v with biases, o without; two RMSNorms a layer;
    dense SwiGLU MLP, or ``experts`` routed SwiGLU experts + one shared expert + a router
    (``experts x h``; its score-correction bias is a buffer); untied embedding and LM head."""
    attn = h * heads * hd + heads * hd + 2 * (h * kv * hd + kv * hd) + heads * hd * h
    dense_layer = attn + 2 * h + 3 * h * inter
    moe_layer = attn + 2 * h + (experts + 1) * 3 * h * moe_inter + experts * h
    return dense * dense_layer + (layers - dense) * moe_layer + 2 * vocab * h + h


# ---------------------------------------------------------------------------- F1
def test_glm45_counts_its_dense_layers_as_dense() -> None:
    """GLM-4.5: 3 dense + 89 MoE layers, 352,797,791,232 parameters as transformers builds it
    (31.46 B when every layer was read as MoE). The GLM-4.5 card (huggingface.co/zai-org/GLM-4.5
    and the GLM-4.5 report, arXiv:2508.06471, Table 1) gives 355 B total / 32 B active; its
    MTP layer, which transformers does not build, is the rest of the total."""
    spec = spec_from_config("glm-4.5", GLM45)
    assert spec.layer_types == ("dense",) * 3 + ("moe",) * 89
    hand = _glm4_moe_params(5120, 92, 3, 96, 8, 128, 151552, 12288, 1536, 160)
    assert hand == 352_797_791_232
    assert spec.num_params == hand == count_params_full(spec)
    assert spec.num_params == pytest.approx(355e9, rel=0.01)
    # 152 idle experts of 3 x 5120 x 1536 in each of 89 MoE layers.
    assert spec.params_per_expert == 3 * 5120 * 1536
    active = hand - 89 * 152 * 3 * 5120 * 1536
    assert spec.num_active_params == active == 33_632_228_352
    assert spec.num_active_params_excl_embedding == active - 151552 * 5120
    assert spec.num_active_params_excl_embedding == pytest.approx(32e9, rel=0.03)


def test_small_glm4_moe_and_ernie_layer_patterns() -> None:
    """``first_k_dense_replace`` (glm4_moe) and ERNIE 4.5's ``moe_layer_start_index`` /
    ``moe_layer_interval``: the spec's count is the full HF model's, exactly."""
    glm = load_model_from(SMALL_GLM4_MOE)
    assert glm.layer_types == ("dense", "moe", "moe", "moe")
    hand = _glm4_moe_params(256, 4, 1, 8, 2, 32, 1000, 1024, 64, 8)
    assert glm.num_params == hand == 3_290_880  # 4,316,928 when all 4 were read as MoE

    ernie = {"model_type": "ernie4_5_moe", "hidden_size": 256, "num_hidden_layers": 6,
             "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1024,
             "moe_intermediate_size": 64, "moe_num_experts": 8, "moe_k": 2,
             "moe_layer_start_index": 1, "moe_layer_interval": 2, "vocab_size": 1000}
    spec = load_model_from(ernie)
    # MoE where (i + 1) % 2 == 0 and i >= 1: layers 1, 3, 5.
    assert spec.layer_types == ("dense", "moe") * 3
    assert spec.num_params == count_params_full(spec)


def test_a_layer_pattern_the_loader_misreads_is_refused() -> None:
    """A spec whose layer types group layers transformers builds differently is refused by
    the count, never priced as the first layer of its type."""
    spec = load_model_from(SMALL_GLM4_MOE)
    wrong = dataclasses.replace(spec, layer_types=("moe",) * 4)
    with pytest.raises(ConfigError, match=r"layer 1 unlike layer 0 \(mlp: Glm4MoeMLP vs "
                                          r"Glm4MoeMoE\)") as e:
        count_params(wrong)
    assert "\n" not in str(e.value)
    dense_typed = dataclasses.replace(spec, layer_types=("dense",) + ("dense_x",) * 3)
    with pytest.raises(ConfigError, match=r"'dense_x' layer .* with routed experts"):
        count_params(dense_typed)


# ---------------------------------------------------------------------------- F4
@pytest.mark.parametrize(("cfg", "kind", "layers"), [
    ({"model_type": "lfm2", "hidden_size": 256, "num_hidden_layers": 4,
      "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512,
      "vocab_size": 1000, "block_ff_dim": 512, "block_auto_adjust_ff_dim": False,
      "layer_types": ["conv", "full_attention", "conv", "full_attention"]}, "conv", "0, 2"),
    ({"model_type": "mamba", "hidden_size": 256, "num_hidden_layers": 2, "vocab_size": 1000,
      "num_attention_heads": 8, "intermediate_size": 512}, "linear_attention", "0, 1"),
    ({"model_type": "jamba", "hidden_size": 256, "num_hidden_layers": 4,
      "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512,
      "vocab_size": 1000, "num_experts": 1, "num_experts_per_tok": 1, "attn_layer_period": 2,
      "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
     "linear_attention", "0, 2"),
])
def test_token_mixers_charon_does_not_trace_are_refused(cfg: dict, kind: str,
                                                        layers: str) -> None:
    mt = cfg["model_type"]
    with pytest.raises(ConfigError, match=rf"model_type '{mt}' has `layer_types` entry "
                                          rf"'{kind}' \(layers {layers}\)") as e:
        load_model_from(cfg)
    assert "\n" not in str(e.value) and "supported: chunked_attention" in str(e.value)


# ---------------------------------------------------------------------------- F5
def test_cache_keys_follow_the_spec_not_only_its_config() -> None:
    spec = load_model_from(SMALL_GLM4_MOE)
    other = dataclasses.replace(spec, layer_types=("moe",) * 4)
    assert spec.hf_config == other.hf_config
    assert spec_hash(spec) != spec_hash(other)
    assert _counts_key(spec) != _counts_key(other)
    # Name and counts do not shape the model: one entry for the same architecture.
    renamed = dataclasses.replace(spec, name="elsewhere", num_params=1)
    assert spec_hash(renamed) == spec_hash(spec)


# ---------------------------------------------------------------------------- F6
DBRX = {"model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40,
        "vocab_size": 100352, "max_seq_len": 32768,
        "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4}}


def test_dbrx_reads_its_nested_ffn_config() -> None:
    """databricks/dbrx-base: 16 experts, top-4, width 10,752 under ``ffn_config``; 8 KV heads
    under ``attn_config``. Its card: 132 B total, 36 B active."""
    spec = load_model_from(DBRX)
    assert (spec.num_experts, spec.num_experts_per_token, spec.moe_intermediate_size,
            spec.num_key_value_heads) == (16, 4, 10752, 8)
    assert spec.layer_types == ("moe",) * 40
    h, expert = 6144, 3 * 10752 * 6144
    # Fused Wqkv (48 + 2 x 8 heads of 128), out_proj, two bias-free LayerNorms, router, experts.
    layer = h * (48 + 16) * 128 + h * h + 2 * h + 16 * h + 16 * expert
    hand = 40 * layer + 2 * 100352 * h + h
    assert spec.num_params == hand == 131_596_523_520
    assert spec.num_active_params == hand - 40 * 12 * expert == 36_469_708_800
    assert spec.num_params == pytest.approx(132e9, rel=0.01)


def test_dbrx_without_its_expert_fields_names_them() -> None:
    cfg = {**DBRX, "ffn_config": {"ffn_hidden_size": 10752}}
    with pytest.raises(ConfigError, match=r"must state ffn_config\.moe_num_experts, "
                                          r"ffn_config\.moe_top_k"):
        load_model_from(cfg)


# ---------------------------------------------------------------------------- F7
BASE = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
        "intermediate_size": 512, "vocab_size": 100}


@pytest.mark.parametrize(("cfg", "missing"), [
    ({**BASE, "model_type": "mixtral"}, r"num_local_experts \(or num_experts\), "
                                        r"num_experts_per_tok"),
    ({**BASE, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2},
     r"must state moe_intermediate_size"),
    ({**BASE, "model_type": "deepseek_v3", "kv_lora_rank": 64, "n_routed_experts": 8,
      "num_experts_per_tok": 2, "moe_intermediate_size": 64},
     r"must state q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim"),
])
def test_moe_and_mla_fields_left_out_are_named(cfg: dict, missing: str) -> None:
    """transformers fills them with a reference checkpoint's (Qwen3-30B-A3B's width 768,
    DeepSeek-V3's q_lora_rank 1536...), a model nobody asked for."""
    with pytest.raises(ConfigError, match=missing) as e:
        load_model_from(cfg)
    assert "\n" not in str(e.value)


def test_mla_without_a_query_lora_states_it_as_null() -> None:
    cfg = {**BASE, "model_type": "deepseek_v3", "kv_lora_rank": 64, "q_lora_rank": None,
           "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
           "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
           "first_k_dense_replace": 1}
    spec = load_model_from(cfg)
    assert spec.extra["q_lora_rank"] is None and spec.head_dim == 48


# ---------------------------------------------------------------------------- F9
def test_gpt_oss_active_parameters_match_its_card() -> None:
    """gpt-oss-120b (OpenAI model card, arXiv:2508.10925, Table 1: 116.83 B total, 5.13 B
    active): 36 MoE layers, 128 experts, top-4. One expert is gate_up 2880 x 5760 + bias 5760
    and down 2880 x 2880 + bias 2880; the card leaves out the input embedding (201,088 x
    2880), and the idle experts' biases are not active either."""
    spec = load_model("gpt-oss-120b")
    per_expert = 2880 * 5760 + 5760 + 2880 * 2880 + 2880
    assert spec.params_per_expert == per_expert == 24_891_840
    active = spec.num_params - 36 * 124 * per_expert
    assert spec.num_active_params == active == 5_711_982_912
    assert spec.num_active_params_excl_embedding == active - 201088 * 2880 == 5_132_849_472
    assert spec.num_active_params_excl_embedding == pytest.approx(5.13e9, rel=1e-3)


def test_tied_embeddings_stay_in_the_active_count() -> None:
    spec = load_model("qwen3-0.6b")  # tied: the table is also the LM head a token multiplies
    assert spec.num_active_params_excl_embedding == spec.num_params == 596_049_920


# ---------------------------------------------------------------------------- F11
def test_an_unknown_rope_type_is_named() -> None:
    cfg = {**BASE, "model_type": "llama", "rope_scaling": {"rope_type": "yarnx", "factor": 2}}
    with pytest.raises(ConfigError, match=r"field `rope_scaling\.rope_type` must be one of "
                                          r"\['default', .*'yarn'.*\], but got 'yarnx'"):
        load_model_from(cfg)
