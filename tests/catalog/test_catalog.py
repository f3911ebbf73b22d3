"""Model catalog: names, aliases, ModelSpec fields and exact parameter counts."""

from __future__ import annotations

import json

import pytest

from charon_search.catalog import list_models, load_model, resolve_model_name
from charon_search.catalog._hf import count_params_full
from charon_search.errors import ConfigError

REQUIRED = [
    "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-3.3-70b", "llama-2-7b",
    "llama-2-70b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b",
    "deepseek-v3", "gpt-oss-120b", "gpt-1.7b", "gpt-7.5b", "gpt-22b", "gpt-39b", "gpt-145b",
    "gpt-175b", "gpt-530b", "gpt-1t", "mcore-gpt-1.7b", "mcore-gpt-16b", "mcore-gpt-70b",
    "mcore-gpt-177b", "mcore-gpt-462b", "mpt-7b", "opt-175b", "debug-llama", "debug-moe",
]


def test_required_models_are_shipped() -> None:
    missing = set(REQUIRED) - set(list_models())
    assert not missing


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("meta-llama/Llama-3.1-70B", "llama-3.1-70b"),
        ("meta-llama/Meta-Llama-3.1-70B", "llama-3.1-70b"),
        ("META-LLAMA/llama-3.1-70b", "llama-3.1-70b"),
        ("Qwen/Qwen3-32B", "qwen3-32b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
        ("MiniMaxAI/MiniMax-M2.5", "minimax-m2.5"),
        ("moonshotai/Kimi-K2.5", "kimi-k2.5"),
        ("LLAMA-3.1-8B", "llama-3.1-8b"),
    ],
)
def test_hf_ids_resolve_to_catalog_names(alias: str, name: str) -> None:
    assert resolve_model_name(alias) == name
    assert load_model(alias).name == name


def test_unknown_name_lists_close_matches() -> None:
    with pytest.raises(ConfigError, match=r"llama-3\.1-8b"):
        load_model("llama-3.1-8")


# Published parameter counts (HF model cards / safetensors metadata of the bf16 checkpoints):
# Llama-3.1-8B 8,030,261,248; Llama-3.1-70B 70,553,706,496; Llama-3.1-405B 405,853,388,800;
# DeepSeek-V3 671,026,404,352 without the MTP module (HF's DeepseekV3ForCausalLM has none);
# Mixtral-8x7B 46,702,792,704; Qwen3-30B-A3B 30,532,122,624.
@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3.1-70b", 70_553_706_496),
        ("llama-3.1-405b", 405_853_388_800),
        ("deepseek-v3", 671_026_404_352),
        ("mixtral-8x7b", 46_702_792_704),
        ("qwen3-30b-a3b", 30_532_122_624),
    ],
)
def test_published_param_counts(name: str, params: int) -> None:
    assert load_model(name).num_params == params


def test_minimax_m2_5_param_count_closed_form() -> None:
    # MiniMax-M2.5 config.json: 62 layers, hidden 3072, 48 query / 8 KV heads of 128, per-layer
    # q/k RMSNorm over all heads, 256 experts (top 8) of intermediate 1536, vocabulary 200,064,
    # untied embeddings. The router's e_score_correction_bias is a buffer in HF's
    # MiniMaxM2SparseMoeBlock, not a parameter; the MTP modules are not part of the HF model.
    h, layers, vocab, experts, inter, q, kv = 3072, 62, 200_064, 256, 1536, 48 * 128, 8 * 128
    attn = h * q + 2 * h * kv + q * h + q + kv
    layer = attn + 2 * h + experts * h + experts * 3 * h * inter
    spec = load_model("minimax-m2.5")
    assert spec.num_params == 2 * vocab * h + layers * layer + h == 228_689_748_992
    assert (spec.num_experts, spec.num_experts_per_token, spec.num_shared_experts) == (256, 8, 0)
    assert spec.attention == "gqa" and set(spec.layer_types) == {"moe"}


def test_kimi_k2_5_param_count_closed_form() -> None:
    # Kimi-K2.5 text_config (DeepSeek-V3 architecture): 61 layers, hidden 7168, MLA with 64
    # heads (q_lora_rank 1536, kv_lora_rank 512, qk_nope 128 + qk_rope 64, v 128), layer 0 dense
    # (intermediate 18432), layers 1-60 with 384 routed experts (top 8) and 1 shared expert of
    # intermediate 2048, vocabulary 163,840, untied embeddings; the routers'
    # e_score_correction_bias is a buffer in HF's DeepSeek-V3, not a parameter.
    h, layers, vocab, heads = 7168, 61, 163_840, 64
    attn = (h * 1536 + 1536 + 1536 * heads * (128 + 64) + h * (512 + 64) + 512
            + 512 * heads * (128 + 128) + heads * 128 * h)
    moe = 384 * h + 384 * 3 * h * 2048 + 3 * h * 2048
    total = 2 * vocab * h + layers * (attn + 2 * h) + 3 * h * 18432 + (layers - 1) * moe + h
    spec = load_model("kimi-k2.5")
    assert spec.num_params == total == 1_026_408_209_408
    assert spec.attention == "mla" and spec.layer_types[:2] == ("dense", "moe")
    assert (spec.num_experts, spec.num_experts_per_token, spec.num_shared_experts) == (384, 8, 1)


def _llama4_params(*, experts: int, moe_layers: int, dense_layers: int) -> int:
    # Llama 4 text_config (Scout and Maverick): 48 layers, hidden 5120, 40 query / 8 KV heads of
    # 128 (q/k norm weightless), vocabulary 202,048, untied embeddings; an MoE layer holds a
    # router (5120 x experts), the routed experts and one shared expert, all of intermediate
    # 8192, a dense layer one MLP of intermediate_size_mlp 16,384.
    h, vocab, inter, dense_inter = 5120, 202_048, 8192, 16_384
    attn = h * 40 * 128 + 2 * h * 8 * 128 + 40 * 128 * h
    moe = experts * h + (experts + 1) * 3 * h * inter
    return (2 * vocab * h + (moe_layers + dense_layers) * (attn + 2 * h) + moe_layers * moe
            + dense_layers * 3 * h * dense_inter + h)


def test_llama4_param_counts_closed_form() -> None:
    # Meta's model cards: Scout 109B total / 17B active, Maverick 400B total / 17B active
    # (with the vision encoder, which the catalog's text models leave out).
    scout = load_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert scout.name == "llama-4-scout-17b-16e"
    assert scout.num_params == _llama4_params(experts=16, moe_layers=48, dense_layers=0)
    assert scout.num_params == 107_769_861_120
    assert set(scout.layer_types) == {"moe"}
    assert (scout.num_experts, scout.num_experts_per_token, scout.num_shared_experts) == (16, 1, 1)
    assert (scout.intermediate_size, scout.moe_intermediate_size) == (16_384, 8192)
    maverick = load_model("llama-4-maverick")
    assert maverick.num_params == _llama4_params(experts=128, moe_layers=24, dense_layers=24)
    assert maverick.num_params == 400_711_848_960
    # interleave_moe_layer_step 2: layers 1, 3, 5, ... route to experts.
    assert maverick.layer_types[:4] == ("dense", "moe", "dense", "moe")
    assert maverick.num_layers_of("moe") == 24 and maverick.num_experts == 128


@pytest.mark.parametrize(
    "name", ["debug-llama", "debug-moe", "llama-3.1-8b", "gpt-1.7b", "qwen3-30b-a3b", "mpt-1b"]
)
def test_param_count_equals_full_meta_instantiation(name: str) -> None:
    spec = load_model(name)
    assert spec.num_params == count_params_full(spec)


def test_llama_fields() -> None:
    spec = load_model("llama-3.1-70b")
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (80, 8192, 64)
    assert (spec.num_key_value_heads, spec.head_dim, spec.intermediate_size) == (8, 128, 28672)
    assert spec.attention == "gqa" and spec.gated_mlp and not spec.is_moe
    assert spec.layer_types == ("dense",) * 80


def test_moe_layer_types() -> None:
    ds = load_model("deepseek-v3")
    assert ds.attention == "mla" and (ds.head_dim, ds.v_head_dim) == (192, 128)
    assert ds.layer_types[:3] == ("dense",) * 3 and set(ds.layer_types[3:]) == {"moe"}
    assert (ds.num_experts, ds.num_experts_per_token, ds.num_shared_experts) == (256, 8, 1)
    assert load_model("debug-moe").layer_types == ("dense", "moe")
    assert set(load_model("qwen3-30b-a3b").layer_types) == {"moe"}
    assert set(load_model("gpt-oss-120b").layer_types) == {"moe"}
    gpt = load_model("gpt-175b")
    assert not gpt.gated_mlp and gpt.attention == "mha" and gpt.intermediate_size == 4 * 12288


def test_every_config_names_its_source() -> None:
    from charon_search.catalog._loader import _catalog

    for name, cfg in _catalog().items():
        assert cfg.get("_charon_source"), name


def test_load_from_path_and_errors(tmp_path) -> None:
    from charon_search.catalog._loader import _catalog

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_catalog()["debug-llama"]))
    spec = load_model(str(path))
    assert spec.num_params == load_model("debug-llama").num_params
    assert load_model(tmp_path).num_params == spec.num_params  # a folder with config.json
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(str(tmp_path / "missing.json"))
    nomt = tmp_path / "nomt.json"
    nomt.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError, match="model_type"):
        load_model(str(nomt))


def test_load_from_module() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from charon_search.catalog._hf import hf_config_object

    ref = load_model("debug-llama")
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(hf_config_object("x", ref.hf_config))
    spec = load_model(module)
    assert spec.num_params == ref.num_params
    assert spec.num_layers == 2 and spec.model_type == "llama"
    with pytest.raises(ConfigError):
        load_model(torch.nn.Linear(2, 2))


def test_an_hf_module_is_read_only_when_its_stock_class_is_what_gets_traced() -> None:
    """Tracing rebuilds the HF class from the module's config: the stock class is read (its
    parameters counted on the module), a subclass with layers of its own is refused (its
    adapter's 2 x 64 x 4096 weights and forward would not be simulated)."""
    import torch
    from torch import nn
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)

    class WithAdapter(LlamaForCausalLM):
        def __init__(self, config):  # type: ignore[no-untyped-def]
            super().__init__(config)
            self.adapter = nn.Linear(64, 4096)

    with torch.device("meta"):
        stock, custom = LlamaForCausalLM(cfg), WithAdapter(cfg)
    spec = load_model(stock)
    assert spec.num_params == sum(p.numel() for p in stock.parameters()) == 119_104
    with pytest.raises(ConfigError, match=r"WithAdapter .* is not a HuggingFace transformers "
                                          r"causal-LM class"):
        load_model(custom)
    # The stock class with a module attached at run time: its parameters give it away.
    with torch.device("meta"):
        stock.adapter = nn.Linear(64, 4096)
    with pytest.raises(ConfigError, match=r"holds 385,344 parameters, but the class rebuilt "
                                          r"from its config holds 119,104"):
        load_model(stock)
