"""Name mapping: HF ids -> catalog, data GPU keys -> GPU specs, records -> clusters."""

from __future__ import annotations

import pytest

from charon_search.validation import Unexpressible, choose_cluster, resolve_gpu, resolve_model_name


@pytest.mark.parametrize(("name", "catalog"), [
    ("meta-llama/Llama-3.1-70B", "llama-3.1-70b"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b"),
    ("Qwen/Qwen3-32B", "qwen3-32b"),
    ("Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
    ("openai/gpt-oss-120b", "gpt-oss-120b"),
    ("gpt-530b", "gpt-530b"),
])
def test_model_names(name, catalog):
    assert resolve_model_name(name) == catalog


def test_unknown_model_reason():
    with pytest.raises(Unexpressible, match=r"unknown model: 'example-org/NotAModel-7B'"):
        resolve_model_name("example-org/NotAModel-7B")


@pytest.mark.parametrize(("key", "gpu"), [
    ("h100_sxm", "h100-sxm-80gb"), ("h200_sxm", "h200-sxm-141gb"),
    ("a100-sxm-80gb", "a100-sxm-80gb"), ("A100-SXM4-80GB", "a100-sxm-80gb"),
    ("h100-sxm-96gb-500w", "h100-sxm-96gb-500w"),
])
def test_gpu_names(key, gpu):
    assert resolve_gpu(key).name == gpu


def test_tpu_is_not_a_gpu():
    with pytest.raises(Unexpressible, match="not a GPU"):
        resolve_gpu("tpu-v4")


@pytest.mark.parametrize(("rid", "cluster"), [
    ("megatron_sc21_t1_530b", "dgx-a100-superpod"),
    ("torchtitan_202412_t4_70b_256gpu_fsdp32_tp8", "h100-96gb-grand-teton"),
    ("llama3_405b_8192gpu_cp1", "h100-roce-24k"),
    ("llmfoundry_h100_80gb_mpt70b_64gpu_seq2048", "dgx-h100-ib400"),
    ("meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_"
     "1024x128_c8_tp1_epnone_1", "h100-sxm-8gpu"),
])
def test_cluster_choice(by_id, rid, cluster):
    rec = by_id[rid]
    assert choose_cluster(rec, rec.hardware["num_gpus"]).cluster.name == cluster


def test_derived_cluster_is_stated(by_id):
    rec = by_id["llmfoundry_a100_40gb_mpt70b_128gpu_seq2048"]
    choice = choose_cluster(rec, 128)
    assert choice.cluster.gpu.name == "a100-sxm-40gb"
    assert "derived" in choice.how and "dgx-a100-superpod" in choice.how
