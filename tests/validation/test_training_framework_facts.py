"""What a training record says its framework ran becomes a layout field (issue 8)."""

from __future__ import annotations

from charon_search.validation.records import default_files, load_files
from charon_search.validation.translate import to_case


def _case(rid: str):
    rec = next(r for r in load_files(default_files()) if r.id == rid)
    return to_case(rec)


def test_gb200_record_recomputes_mlp_and_moe_act_not_the_attention_core() -> None:
    # NVIDIA's GB200 DeepSeek-V3 doc: "--recompute-modules mlp moe_act"
    case = _case("deepseek_v3_gb200_mcore_final_hybridep")
    assert case.layout.recompute == "selective"
    assert case.layout.recompute_modules == ("mlp", "moe_act")


def test_deepseek_report_recompute_words_become_megatron_modules() -> None:
    # DeepSeek-V3 report sec. 3.2.3: "Recomputation of RMSNorm and MLA Up-Projection"
    case = _case("deepseek_v3_pretrain_2048_h800")
    assert case.layout.recompute_modules == ("layernorm", "mla_up_proj")


def test_torchtitan_cp_records_run_the_traced_torch_ring_with_repeated_kv() -> None:
    # torchtitan Dec 2024, Table 2/6: FSDP + CP + torch.compile; Llama repeat_kv before SDPA
    for rid in ("torchtitan_202412_t2_8b_fsdp2_cp4_128k",
                "torchtitan_202412_t6_405b_fsdp2_cp4_128k"):
        lay = _case(rid).layout
        assert (lay.cp_algo, lay.cp_ring_impl, lay.cp_repeat_kv) == ("ring", "torch_traced",
                                                                      True)
    lay = _case("torchtitan_202412_t2_8b_fsdp8_cp1_32k").layout
    assert (lay.cp_ring_impl, lay.cp_repeat_kv) == ("overlapped", False)


def test_gb200_record_runs_megatron_moe_permute_and_router_fusion() -> None:
    # reproduce guide launch script: --moe-permute-fusion --moe-router-fusion
    assert _case("deepseek_v3_gb200_mcore_final_hybridep").layout.moe_fused_permute
    assert not _case("deepseek_v3_pretrain_2048_h800").layout.moe_fused_permute


def test_torchtitan_without_compile_runs_eager_rmsnorm() -> None:
    # torchtitan Dec 2024 Table 1: "FSDP" row without torch.compile (torch_compile: false)
    assert _case("torchtitan_202412_t1_8b_8gpu_fsdp").layout.norm_impl == "eager"
    assert _case("torchtitan_202412_t1_8b_8gpu_fsdp_compile_fp8").layout.norm_impl == "fused"
    assert _case("megatron_sc21_t1_1.7b").layout.norm_impl == "fused"


def test_per_tensor_fp8_training_runs_cublaslt_gemms() -> None:
    # Transformer Engine (llm-foundry amp_fp8) and torchao torch._scaled_mm: cuBLASLt
    for rid in ("llmfoundry_h100_80gb_mpt3b_8gpu_seq2048_fp8",
                "torchtitan_asynctp_8b_float8_tensorwise_vanillaTP",
                "torchtitan_asynctp_70b_float8_rowwise_asyncTP"):
        assert _case(rid).layout.fp8_gemm_kernel == "cublaslt"
    # DeepSeek-V3 block-scaled fp8 (DeepGEMM) keeps the default
    assert _case("deepseek_v3_pretrain_2048_h800").layout.fp8_gemm_kernel == "cutlass"
    assert _case("megatron_sc21_t1_1.7b").layout.fp8_gemm_kernel == "cutlass"


def test_llm_foundry_runs_composer_fsdp1_backward_post_prefetch() -> None:
    # Composer FSDPConfig default backward_prefetch 'BACKWARD_POST'; torchtitan's FSDP2 keeps
    # the prefetching default.
    case = _case("llmfoundry_h100_80gb_mpt13b_64gpu_seq2048")
    assert case.layout.fsdp_backward_prefetch == "post"
    assert any("BACKWARD_POST" in a for a in case.assumptions)
    assert _case("torchtitan_202412_t1_8b_8gpu_fsdp").layout.fsdp_backward_prefetch == "pre"


def test_gb200_record_keeps_its_pipeline_layout() -> None:
    # NVIDIA's GB200 DeepSeek-V3 doc: --pipeline-model-parallel-layout "Et|(tt|)*30L" (the
    # record's "(32 stages)" is its own comment): 61 layers, the LM head alone in stage 32
    case = _case("deepseek_v3_gb200_mcore_final_hybridep")
    assert case.layout.pp_layout == "Et|(tt|)*30L"
    assert any("--pipeline-model-parallel-layout" in n for n in case.assumptions)
    assert _case("deepseek_v3_pretrain_2048_h800").layout.pp_layout == ""


def test_torchtitan_2025_op_sac_reruns_the_reduce_scatter() -> None:
    # pytorch/torchtitan#965 (March 2025) took reduce_scatter_tensor out of the op-SAC save list
    for rid in ("torchtitan_asynctp_8b_float8_tensorwise_vanillaTP",
                "torchtitan_asynctp_8b_float8_tensorwise_asyncTP"):
        assert not _case(rid).layout.sac_saves_reduce_scatter
    # Dec 2024 (op SAC, no TP) and the 70B rows (full AC) keep the default
    for rid in ("torchtitan_202412_t1_8b_8gpu_fsdp_compile_fp8",
                "torchtitan_asynctp_70b_bf16_vanillaTP"):
        assert _case(rid).layout.sac_saves_reduce_scatter
