"""Write the shipped model catalog: ``charon_search/catalog/configs/<name>.json`` + SOURCES.md.

Reads HF ``config.json`` files from ``/work/shared/data/peers/aiconfigurator-core/model_configs``
(Apache-2.0, copied from the ``aiconfigurator-core`` 0.12.0 wheel) and writes the GPT (Megatron)
shapes and the Llama-2 configs from published tables. The package never reads ``/work/shared``:
this script is run once and its output is committed; ``--check`` verifies that the committed
files are what it writes (CI-free: it needs the peer files).

    python scripts/make_catalog.py [--peers DIR] [--check]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "charon_search" / "catalog" / "configs"
PEERS = Path("/work/shared/data/peers/aiconfigurator-core/model_configs")
AIC = "aiconfigurator-core 0.12.0 wheel, model_configs/{file} (Apache-2.0; HF config.json of {hf})"

#: catalog name -> (peer file stem, HF id, extra aliases)
FROM_PEERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "llama-3.1-8b": ("meta-llama--Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B",
                     ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                      "meta-llama/Meta-Llama-3.1-8B-Instruct", "llama3.1-8b")),
    "llama-3.1-70b": ("meta-llama--Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B",
                      ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
                       "meta-llama/Meta-Llama-3.1-70B-Instruct", "llama3.1-70b")),
    "llama-3.1-405b": ("meta-llama--Meta-Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B",
                       ("meta-llama/Llama-3.1-405B", "meta-llama/Llama-3.1-405B-Instruct",
                        "meta-llama/Meta-Llama-3.1-405B-Instruct", "llama3.1-405b")),
    "qwen3-8b": ("Qwen--Qwen3-8B", "Qwen/Qwen3-8B", ()),
    # The Qwen3 family's smallest member: a draft model for speculative decoding of the others
    # (same 151,936-token vocabulary).
    "qwen3-0.6b": ("Qwen--Qwen3-0.6B", "Qwen/Qwen3-0.6B", ()),
    "qwen3-32b": ("Qwen--Qwen3-32B", "Qwen/Qwen3-32B", ()),
    "qwen3-30b-a3b": ("Qwen--Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", ()),
    "qwen3-235b-a22b": ("Qwen--Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B", ()),
    "mixtral-8x7b": ("mistralai--Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-v0.1",
                     ("mistralai/Mixtral-8x7B-Instruct-v0.1",)),
    "deepseek-v3": ("deepseek-ai--DeepSeek-V3", "deepseek-ai/DeepSeek-V3",
                    ("deepseek-ai/DeepSeek-V3-Base", "deepseek-ai/DeepSeek-R1")),
    "gpt-oss-120b": ("openai--gpt-oss-120b", "openai/gpt-oss-120b", ()),
    "minimax-m2.5": ("MiniMaxAI--MiniMax-M2.5", "MiniMaxAI/MiniMax-M2.5", ()),
    "kimi-k2.5": ("moonshotai--Kimi-K2.5", "moonshotai/Kimi-K2.5", ()),
    "qwen3.5-397b-a17b": ("Qwen--Qwen3.5-397B-A17B", "Qwen/Qwen3.5-397B-A17B",
                          ("Qwen/Qwen3.5-397B-A17B-FP8", "qwen3.5-397b")),
    "glm-5": ("zai-org--GLM-5", "zai-org/GLM-5",
              ("zai-org/GLM-5-FP8", "nvidia/GLM-5-NVFP4")),
    "llama-4-scout-17b-16e": ("meta-llama--Llama-4-Scout-17B-16E-Instruct",
                              "meta-llama/Llama-4-Scout-17B-16E-Instruct",
                              ("meta-llama/Llama-4-Scout-17B-16E", "llama-4-scout")),
    "llama-4-maverick-17b-128e": ("meta-llama--Llama-4-Maverick-17B-128E-Instruct",
                                  "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
                                  ("meta-llama/Llama-4-Maverick-17B-128E",
                                   "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8",
                                   "llama-4-maverick")),
}

_LLAMA4_NOTE = ("the language model of Llama4ForConditionalGeneration (its `text_config`, "
                "transformers `llama4_text`); the vision tower is not modelled; the routed "
                "experts are traced as grouped GEMMs over the routed rows and the chunked local "
                "attention layers priced as a sliding window of the chunk (frontend._llama4). "
                "Language model only: {count} parameters, against the {stated} Meta states for "
                "the whole model (vision encoder included)")

#: Multimodal configs whose language model is an architecture transformers knows under another
#: ``model_type``: catalog name -> (the ``text_config`` model_type to use, why). The vision tower
#: is not modelled (text-only serving and training).
TEXT_MODELS: dict[str, tuple[str, str]] = {
    "qwen3.5-397b-a17b": ("qwen3_5_moe_text", "the language model of Qwen3_5MoeForConditional"
                          "Generation (its `text_config`, transformers `qwen3_5_moe_text`); the "
                          "vision tower is not modelled"),
    "kimi-k2.5": ("deepseek_v3", "text_config model_type 'kimi_k2' is the DeepSeek-V3 "
                  "architecture (its auto_map names modeling_deepseek.DeepseekV3ForCausalLM); "
                  "the MoonViT vision tower is not modelled. Language model only: this config "
                  "has 1,026.4 B parameters (no MTP layer, `num_nextn_predict_layers` 0), "
                  "against the 1.04 T Moonshot states for Kimi K2"),
    "llama-4-scout-17b-16e": ("llama4_text", _LLAMA4_NOTE.format(count="107.8 B",
                                                                  stated="109 B")),
    "llama-4-maverick-17b-128e": ("llama4_text", _LLAMA4_NOTE.format(count="400.7 B",
                                                                      stated="400 B")),
}

#: catalog name -> {precision: (peer file stem whose ``quantization_config`` describes the
#: checkpoint, HF id of the checkpoint, what the source says beyond the config)}. Written as
#: ``_charon_checkpoints`` (``serving._graphs.checkpoint_quant`` reads it); per-layer
#: ``modules_to_not_convert`` entries are folded to ``model.layers.*.<module>``.
CHECKPOINTS: dict[str, dict[str, tuple[str, str, str]]] = {
    "deepseek-v3": {"fp8": (
        "deepseek-ai--DeepSeek-V3", "deepseek-ai/DeepSeek-V3",
        "model_configs/deepseek-ai--DeepSeek-V3_config.json and "
        "deepseek-ai--DeepSeek-R1_config.json `quantization_config` (Apache-2.0; the native "
        "checkpoints are 128x128 block-scaled fp8; "
        "the router gate is a plain parameter, not a quantized Linear)")},
    "gpt-oss-120b": {"fp4": (
        "openai--gpt-oss-120b", "openai/gpt-oss-120b",
        "model_configs/openai--gpt-oss-120b_config.json `quantization_config` (Apache-2.0; HF "
        "config.json of openai/gpt-oss-120b): MXFP4 MoE experts, attention, router, embeddings "
        "and LM head bf16")},
    "qwen3-235b-a22b": {"fp8": (
        "Qwen--Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B-FP8",
        "model_configs/Qwen--Qwen3-235B-A22B-FP8_config.json `quantization_config` (Apache-2.0; "
        "HF config.json of Qwen/Qwen3-235B-A22B-FP8; the per-layer modules_to_not_convert "
        "entries written with `*`): 128x128 block-scaled fp8, router gate, norms and LM head "
        "bf16")},
    "kimi-k2.5": {"int4": (
        "moonshotai--Kimi-K2.5", "moonshotai/Kimi-K2.5",
        "model_configs/moonshotai--Kimi-K2.5_config.json `text_config.quantization_config` "
        "(Apache-2.0; HF config.json of moonshotai/Kimi-K2.5, whose released weights are this "
        "checkpoint): compressed-tensors, 4-bit symmetric integer weights in groups of 32, "
        "16-bit activations; attention, shared experts, the dense layer's MLP and the LM head "
        "are in its `ignore` list (bf16)")},
    "glm-5": {"fp8": (
        "zai-org--GLM-5-FP8", "zai-org/GLM-5-FP8",
        "model_configs/zai-org--GLM-5-FP8_config.json `quantization_config` (Apache-2.0; HF "
        "config.json of zai-org/GLM-5-FP8; the per-layer modules_to_not_convert entries written "
        "with `*`): 128x128 block-scaled fp8; norms, router gate, the indexer's k_norm and "
        "head-weight projection, embeddings and LM head bf16")},
    "minimax-m2.5": {"fp8": (
        "MiniMaxAI--MiniMax-M2.5", "MiniMaxAI/MiniMax-M2.5",
        "model_configs/MiniMaxAI--MiniMax-M2.5_config.json `quantization_config` (Apache-2.0; "
        "HF config.json of MiniMaxAI/MiniMax-M2.5, whose released weights are this fp8 "
        "checkpoint): 128x128 block-scaled fp8, router gate and LM head bf16")},
}
#: NVIDIA's NVFP4 releases (TensorRT Model Optimizer, ``quant_method`` ``modelopt``,
#: ``quant_algo`` NVFP4: 4-bit weights and activations in groups of 16, FP8 KV cache), the
#: ``fp4`` checkpoints of the serving rows that name the base model at NVFP4. Their config.json
#: ``quantization_config`` (``ignore``) or, where config.json has none, the
#: ``hf_quant_config.json`` ``exclude_modules`` list the bf16 modules.
NVFP4_CHECKPOINTS: dict[str, tuple[str, str, str]] = {
    "deepseek-v3": (
        "nvidia--DeepSeek-V3.1-NVFP4", "nvidia/DeepSeek-V3.1-NVFP4",
        "MLA's q_a, q_b, kv_a and kv_b projections and the LM head bf16, o_proj, the dense "
        "layers' MLP and the shared and routed experts NVFP4. ASSUMED for the DeepSeek-R1/V3 "
        "FP4 checkpoints the rows ran (nvidia/DeepSeek-R1-0528-FP4 and its kin, made with the "
        "same ModelOpt recipe, examples/deepseek/ptq.py, which leaves attention unquantized "
        "unless --enable_wo_quant quantizes o_proj)"),
    "glm-5": ("nvidia--GLM-5-NVFP4", "nvidia/GLM-5-NVFP4",
              "every attention projection, the sparse-attention indexer and the LM head bf16"),
    "minimax-m2.5": ("nvidia--MiniMax-M2.5-NVFP4", "nvidia/MiniMax-M2.5-NVFP4",
                     "attention, router gate and LM head bf16"),
    "qwen3.5-397b-a17b": (
        "nvidia--Qwen3.5-397B-A17B-NVFP4", "nvidia/Qwen3.5-397B-A17B-NVFP4",
        "only the routed experts NVFP4: softmax and Gated DeltaNet attention, the shared "
        "expert, the LM head (and the vision tower and MTP layer) bf16"),
    "qwen3-235b-a22b": ("nvidia--Qwen3-235B-A22B-NVFP4", "nvidia/Qwen3-235B-A22B-NVFP4",
                        "router gate and LM head bf16"),
    "kimi-k2.5": ("nvidia--Kimi-K2.5-NVFP4", "nvidia/Kimi-K2.5-NVFP4",
                  "attention and LM head (and the vision tower) bf16"),
}

#: Checkpoints whose ``quantization_config`` is not among the peer files but whose format a
#: measurement states: catalog name -> {precision: (HF id, quantization_config, source)}.
STATED_CHECKPOINTS: dict[str, dict[str, tuple[str, dict[str, object], str]]] = {
    "qwen3.5-397b-a17b": {"fp8": (
        "Qwen/Qwen3.5-397B-A17B-FP8",
        {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
         "weight_block_size": [128, 128],
         "modules_to_not_convert": ["lm_head", "model.layers.*.mlp.gate",
                                    "model.layers.*.mlp.shared_expert_gate"]},
        "aiconfigurator-core 0.12.0 systems/silicon_sample.csv rows of Qwen/Qwen3.5-397B-A17B "
        "(precision fp8, gemm_quant_mode fp8, moe_quant_mode fp8_block: 128x128 block-scaled "
        "fp8, the format of Qwen's FP8 releases, e.g. Qwen3-235B-A22B-FP8); the bf16 modules "
        "(LM head, router gates) are ASSUMED as in Qwen3-235B-A22B-FP8's "
        "modules_to_not_convert")},
}

# Keys that only matter for weight loading / quantized checkpoints; the traced graph is bf16.
_DROP_KEYS = ("quantization_config", "auto_map", "transformers_version")

LLAMA2 = {
    # Published HF config.json of meta-llama/Llama-2-7b-hf and Llama-2-70b-hf
    # (https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json, Llama 2
    # Community License; the shapes are also in Touvron et al. 2023, arXiv:2307.09288, Table 1).
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32,
                       max_position_embeddings=4096),
    "llama-2-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8,
                        max_position_embeddings=4096),
}

SC21 = ("Narayanan et al., SC21 'Efficient Large-Scale Language Model Training on GPU Clusters "
        "Using Megatron-LM', arXiv:2104.04473, Table 1 (vocab 51,200, seq 2048)")
KORTHIKANTI = ("Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer "
               "Models', arXiv:2205.05198, Table 3 (vocab 51,200, seq 2048)")

def mcore_source(stated: str) -> str:
    """``_charon_source`` of a Megatron-Core weak-scaling GPT (``stated``: its stated size)."""
    return ("NVIDIA Megatron-LM README 'Training Speed and Scalability' (github.com/NVIDIA/"
            "Megatron-LM, added 2024-07-15; images/model_table.png): the Megatron-Core GPT "
            "weak-scaling series, stated sizes 1.7, 16, 70, 177 and 462 B, vocab 131,072, seq "
            "4096; shapes (layers/hidden/heads) as stated by the `mcore_h100_weak_*` records in "
            f"charon_search/data/validation/published-dev.yaml. This model's stated size: "
            f"{stated}. Input embedding and output layer untied (Megatron's "
            "`--untie-embeddings-and-output-weights`): ASSUMED (the README does not name the "
            "flags); the stated sizes say so: untied, the counts (12*l*h^2 + 13*l*h + 2*V*h + "
            "(s + 2)*h) are 1.754, 16.13, 69.84, 177.23 and 461.54 B; tied, 1.485, 15.33, 68.76, "
            "175.62 and 459.13 B, which misses the 1.7 B by 12.6 %, and the README calls the 177 "
            "B 'slightly more than 175 billion parameters due to larger vocabulary size'")


#: name -> (layers, hidden, heads, seq, vocab, source); embeddings tied (SC21's parameter
#: formula counts V*h once), unless listed in ``UNTIED``.
GPT: dict[str, tuple[int, int, int, int, int, str]] = {
    # SC21 Table 1 rows: params (B), heads, hidden, layers.
    "gpt-1.7b": (24, 2304, 24, 2048, 51200, SC21),
    "gpt-3.6b": (30, 3072, 32, 2048, 51200, SC21),
    "gpt-7.5b": (36, 4096, 32, 2048, 51200, SC21),
    "gpt-18b": (40, 6144, 48, 2048, 51200, SC21),
    "gpt-39b": (48, 8192, 64, 2048, 51200, SC21),
    "gpt-76b": (60, 10240, 80, 2048, 51200, SC21),
    "gpt-145b": (80, 12288, 96, 2048, 51200, SC21),
    "gpt-310b": (96, 16384, 128, 2048, 51200, SC21),
    "gpt-530b": (105, 20480, 128, 2048, 51200, SC21),
    "gpt-1t": (128, 25600, 160, 2048, 51200, SC21),
    # Korthikanti et al. Table 3: 22B, 175B (GPT-3), 530B (MT-NLG), 1T.
    "gpt-22b": (48, 6144, 64, 2048, 51200, KORTHIKANTI),
    "gpt-175b": (96, 12288, 96, 2048, 51200, KORTHIKANTI),
}

DEBUG = {
    "debug-llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "hidden_act": "silu",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "num_nextn_predict_layers": 1,
        "_charon_source": "tiny Llama for tests (torchtitan 'debugmodel' style); not a real "
                          "model; context 131,072; one MTP layer (`num_nextn_predict_layers`) "
                          "so that tests can run MTP speculation",
    },
    "debug-hybrid": {
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
        "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                        "full_attention"], "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_value_head_dim": 16, "num_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "mlp_only_layers": [], "hidden_act": "silu",
        "attn_output_gate": True, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25},
        "tie_word_embeddings": False, "eos_token_id": 1,
        "_charon_source": "tiny Qwen3.5-MoE for tests (three Gated DeltaNet layers, then one "
                          "full-attention layer, all MoE); not a real model; context 131,072 "
                          "(as the other debug models) so that tests can serve real traces",
    },
    "debug-moe": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
        "intermediate_size": 160, "moe_intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
        "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
        "mlp_only_layers": [0], "norm_topk_prob": True, "hidden_act": "silu",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "attention_bias": False, "output_router_logits": False,
        "num_nextn_predict_layers": 1,
        "_charon_source": "tiny Qwen3-MoE for tests (layer 0 dense, layer 1 MoE); not real; "
                          "context 131,072; one MTP layer, as `debug-llama`",
    },
}

def llama2(name: str, dims: dict[str, int]) -> dict[str, object]:
    hf = "meta-llama/Llama-2-7b-hf" if name.endswith("7b") else "meta-llama/Llama-2-70b-hf"
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        **dims, "vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "attention_bias": False, "bos_token_id": 1,
        "eos_token_id": 2, "torch_dtype": "float16",
        "_charon_source": f"published HF config.json of {hf} (Llama 2 Community License)",
        "_charon_aliases": [hf, hf.removesuffix("-hf")],
    }


def gpt(layers: int, hidden: int, heads: int, seq: int, vocab: int, source: str,
        tied: bool = True) -> dict:
    """A GPT-2-architecture config (learned positions, LayerNorm, GELU 4h MLP) of Megatron GPT.

    ``tied``: the output layer shares the input embedding (Megatron's default); ``False`` is
    ``--untie-embeddings-and-output-weights``."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": layers,
        "n_embd": hidden, "n_head": heads, "n_inner": 4 * hidden, "n_positions": seq,
        "vocab_size": vocab, "activation_function": "gelu_pytorch_tanh",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "tie_word_embeddings": tied,
        "_charon_source": source,
    }


def _fold_layers(modules: list[str]) -> list[str]:
    """Per-layer module names folded to ``...layers.*.<module>``, ordered, deduplicated."""
    return list(dict.fromkeys(re.sub(r"layers\.\d+\.", "layers.*.", m) for m in modules))


def checkpoints(name: str, peers: Path) -> dict[str, dict[str, object]]:
    """The ``_charon_checkpoints`` block of catalog entry ``name`` (empty: none known)."""
    out: dict[str, dict[str, object]] = {}
    for precision, (stem, hf, note) in CHECKPOINTS.get(name, {}).items():
        raw = json.loads((peers / f"{stem}_config.json").read_text())
        qc = dict((raw.get("text_config") or raw).get("quantization_config")
                  or raw["quantization_config"])
        skip = qc.pop("modules_to_not_convert", None)
        if skip is not None:
            qc["modules_to_not_convert"] = _fold_layers(skip)
        out[precision] = {"hf_id": hf, "quantization_config": qc,
                          "source": f"aiconfigurator-core 0.12.0 wheel, {note}"}
    if name in NVFP4_CHECKPOINTS:
        stem, hf, note = NVFP4_CHECKPOINTS[name]
        raw = json.loads((peers / f"{stem}_config.json").read_text())
        qc = dict((raw.get("text_config") or {}).get("quantization_config")
                  or raw.get("quantization_config") or {})
        if not qc:
            q = json.loads((peers / f"{stem}_hf_quant_config.json").read_text())["quantization"]
            qc = {"quant_method": "modelopt", **{k: v for k, v in q.items()
                                                 if k not in ("exclude_modules",
                                                              "quantized_layers")},
                  "ignore": q.get("exclude_modules") or []}
        qc.pop("config_groups", None)  # the NVFP4 scheme, stated by quant_algo
        qc["ignore"] = _fold_layers(qc.get("ignore") or [])
        file = (f"{stem}_config.json `quantization_config`" if "producer" in qc
                else f"{stem}_hf_quant_config.json")
        out["fp4"] = {"hf_id": hf, "quantization_config": qc,
                      "source": f"aiconfigurator-core 0.12.0 wheel, model_configs/{file} "
                                f"(Apache-2.0; NVIDIA's ModelOpt NVFP4 release {hf}): {note}"}
    for precision, (hf, qc, note) in STATED_CHECKPOINTS.get(name, {}).items():
        out[precision] = {"hf_id": hf, "quantization_config": dict(qc), "source": note}
    return out


def build(peers: Path) -> dict[str, str]:
    """Every file of the catalog directory: file name -> text."""
    files: dict[str, str] = {}

    def write(name: str, cfg: dict) -> None:
        files[f"{name}.json"] = json.dumps(cfg, indent=2, sort_keys=False) + "\n"

    sources: list[tuple[str, str]] = []
    for name, (stem, hf, aliases) in FROM_PEERS.items():
        cfg = json.loads((peers / f"{stem}_config.json").read_text())
        note = ""
        if name in TEXT_MODELS:
            model_type, note = TEXT_MODELS[name]
            cfg = {**cfg["text_config"], "model_type": model_type}
            note = f"; {note}"
        for key in _DROP_KEYS:
            cfg.pop(key, None)
        cfg["_charon_source"] = AIC.format(file=f"{stem}_config.json", hf=hf) + note
        cfg["_charon_aliases"] = [hf, *aliases]
        if ckpt := checkpoints(name, peers):
            cfg["_charon_checkpoints"] = ckpt
        write(name, cfg)
        sources.append((name, cfg["_charon_source"]))
    # Llama-3.3-70B has exactly the Llama-3.1-70B architecture (HF config.json of
    # meta-llama/Llama-3.3-70B-Instruct differs only in generation/token fields).
    cfg = json.loads(files["llama-3.1-70b.json"])
    cfg["_charon_source"] = ("Llama-3.1-70B architecture (aiconfigurator-core "
                             "meta-llama--Meta-Llama-3.1-70B_config.json); Llama-3.3-70B-Instruct "
                             "shares it (HF meta-llama/Llama-3.3-70B-Instruct config.json)")
    cfg["_charon_aliases"] = ["meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.3-70B"]
    write("llama-3.3-70b", cfg)
    sources.append(("llama-3.3-70b", cfg["_charon_source"]))
    for name, dims in LLAMA2.items():
        cfg = llama2(name, dims)
        write(name, cfg)
        sources.append((name, str(cfg["_charon_source"])))
    for name, row in {**GPT, **MORE_GPT}.items():
        cfg = gpt(*row, tied=name not in UNTIED)
        write(name, cfg)
        sources.append((name, cfg["_charon_source"]))
    for name, row in MPT.items():
        cfg = mpt(*row, note=MPT_NOTES.get(name, ""))
        write(name, cfg)
        sources.append((name, cfg["_charon_source"]))
    write("opt-175b", OPT_175B)
    sources.append(("opt-175b", str(OPT_175B["_charon_source"])))
    for name, cfg in DEBUG.items():
        write(name, cfg)
        sources.append((name, str(cfg["_charon_source"])))
    lines = [
        "# Shipped model configs: sources and licenses",
        "",
        "Generated by `scripts/make_catalog.py`. Each file is a HuggingFace `config.json`; the",
        "`_charon_source` key repeats the source and `_charon_aliases` lists accepted HF ids.",
        "Files taken from `aiconfigurator-core` 0.12.0 are Apache-2.0 (the wheel's METADATA;",
        "the license text ships as",
        "`charon_search/data/profiles/LICENSE.aiconfigurator-core.Apache-2.0.txt`).",
        "They are modified: `make_catalog.py` drops the keys",
        f"{', '.join(f'`{k}`' for k in _DROP_KEYS)} and adds the `_charon_*` keys (and, where",
        "a row says so, sets fields the upstream file lacks). GPT shapes are built as HF `gpt2`",
        "configs from the cited paper tables. The `source` of each row is the file's",
        "`_charon_source`, word for word.",
        "",
        "| name | source |",
        "|---|---|",
        *(f"| `{n}` | {s} |" for n, s in sorted(sources)),
        "",
    ]
    files["SOURCES.md"] = "\n".join(lines)
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=Path, default=PEERS,
                        help="aiconfigurator-core's model_configs directory")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a shipped file differs from what this "
                             "script would write (or is missing)")
    args = parser.parse_args()
    files = build(args.peers)
    if args.check:
        stale = [n for n, text in files.items()
                 if not (OUT / n).is_file() or (OUT / n).read_text() != text]
        extra = sorted(p.name for p in OUT.iterdir() if p.is_file() and p.name not in files)
        for n in stale:
            print(f"differs: {(OUT / n).relative_to(ROOT)}")
        for n in extra:
            print(f"not generated: {(OUT / n).relative_to(ROOT)}")
        print(f"{len(files) - len(stale)} of {len(files)} files as generated"
              + (f"; {len(extra)} not generated" if extra else ""))
        return 1 if stale or extra else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for n, text in files.items():
        (OUT / n).write_text(text)
        print(f"wrote {(OUT / n).relative_to(ROOT)}")
    return 0


#: Megatron-Core GPT weak-scaling shapes, as stated (layers/hidden/heads/ffn/vocab) by the
#: records in charon_search/data/validation/published-dev.yaml (NVIDIA Megatron-LM README table).
MORE_GPT: dict[str, tuple[int, int, int, int, int, str]] = {
    "mcore-gpt-1.7b": (24, 2048, 16, 4096, 131072, mcore_source("1.7 B")),
    "mcore-gpt-16b": (32, 6144, 48, 4096, 131072, mcore_source("16 B")),
    "mcore-gpt-70b": (84, 8192, 64, 4096, 131072, mcore_source("70 B")),
    "mcore-gpt-177b": (96, 12288, 96, 4096, 131072, mcore_source("177 B")),
    "mcore-gpt-462b": (112, 18432, 144, 4096, 131072, mcore_source("462 B")),
}
#: GPT configs with untied input embedding and output layer.
UNTIED = frozenset(MORE_GPT)

MPT_SRC = ("MosaicML MPT (HF model_type 'mpt': ALiBi, no biases, tied embeddings); shapes "
           "(layers/hidden/heads, vocab 50,368, seq 2048) as stated by the MPT records in "
           "charon_search/data/validation/published-dev.yaml (MosaicML LLM Foundry throughput "
           "table)")
#: What the name of an MPT model does not say.
MPT_NOTES = {
    "mpt-70b": "; the shape of llm-foundry's scripts/train/yamls/pretrain/mpt-70b.yaml (d_model "
               "8192, 80 layers, 64 heads, expansion 4): 64.8 B parameters, not 70 B",
}
#: name -> (layers, hidden, heads)
MPT = {
    "mpt-1b": (24, 2048, 16), "mpt-3b": (32, 2560, 20), "mpt-7b": (32, 4096, 32),
    "mpt-13b": (40, 5120, 40), "mpt-30b": (48, 7168, 56), "mpt-70b": (80, 8192, 64),
}


def mpt(layers: int, hidden: int, heads: int, note: str = "") -> dict:
    return {
        "architectures": ["MptForCausalLM"], "model_type": "mpt", "n_layers": layers,
        "d_model": hidden, "n_heads": heads, "expansion_ratio": 4, "max_seq_len": 2048,
        "vocab_size": 50368, "no_bias": True, "layer_norm_epsilon": 1e-5,
        "attn_config": {"alibi": True},
        "tie_word_embeddings": True, "_charon_source": MPT_SRC + note,
    }


OPT_175B = {
    "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 12288,
    "num_hidden_layers": 96, "num_attention_heads": 96, "ffn_dim": 49152,
    "word_embed_proj_dim": 12288, "vocab_size": 50272, "max_position_embeddings": 2048,
    "do_layer_norm_before": True, "activation_function": "relu", "dropout": 0.1,
    "attention_dropout": 0.0, "enable_bias": True, "layer_norm_elementwise_affine": True,
    "tie_word_embeddings": True,
    "_charon_source": ("Zhang et al. 2022, 'OPT: Open Pre-trained Transformer Language Models', "
                       "arXiv:2205.01068, Table 1 (96 layers, 96 heads, d_model 12288); other "
                       "fields as the published HF facebook/opt-66b config.json"),
    "_charon_aliases": ["facebook/opt-175b"],
}

if __name__ == "__main__":
    raise SystemExit(main())
