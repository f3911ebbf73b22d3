"""Record -> Layout facts of the source framework (attention kernel, SAC policy, fp8 recipe,
DualPipe overlap) and the framework's memory conventions; no simulation runs here."""

from __future__ import annotations

import pytest

from charon_search.validation.translate import to_case


@pytest.mark.parametrize(("rid", "kernel"), [
    ("megatron_sc21_t1_7.5b", "eager"),        # SC21 Megatron-LM, 2021: CoreAttention
    ("korthikanti_t5_22b_seqsel", "eager"),    # Korthikanti et al. 2022, Megatron-LM
    ("mcore_h100_weak_1.7b", "flash"),         # Megatron-Core r0.8.0: TE fused attention
    # torch SDPA's flash backend (FlashAttention-2): cuDNN attention opt-in since torch 2.5.1
    ("torchtitan_202412_t1_8b_8gpu_fsdp", "flash2"),
    ("torchtitan_trainy_h200_8b_4nodes", "flash2"),
    # MPT with ALiBi in 2023 ran attn_impl "triton"
    ("llmfoundry_h100_80gb_mpt7b_8gpu_seq2048", "flash_triton"),
    ("llmfoundry_a100_80gb_mpt13b_8gpu_seq2048", "flash_triton"),
    ("llama3_405b_8192gpu_cp1", "flash"),       # no framework stated: the GPU's best kernel
])
def test_attention_kernel(by_id, rid, kernel):
    case = to_case(by_id[rid])
    assert case.layout.attention_kernel == kernel
    # the memory model sees the same kernel: eager saves the s x s scores (Korthikanti's 5as/h)
    assert (case.memory_options.attn_impl == "eager") == (kernel == "eager")


@pytest.mark.parametrize(("rid", "policy"), [
    ("torchtitan_202412_t1_8b_8gpu_fsdp", "op"),   # extra.selective_ac_option: op
    ("torchtitan_trainy_h200_8b_4nodes", "attention"),  # option not stated: layout default
    ("korthikanti_t5_22b_seqsel", "attention"),
])
def test_selective_policy(by_id, rid, policy):
    assert to_case(by_id[rid]).layout.selective_policy == policy


@pytest.mark.parametrize(("rid", "recipe"), [
    ("torchtitan_asynctp_70b_float8_rowwise_vanillaTP", "rowwise"),   # extra.float8_recipe
    ("torchtitan_asynctp_8b_float8_tensorwise_asyncTP", "tensorwise"),
    ("llmfoundry_h100_80gb_mpt3b_8gpu_seq2048_fp8", "delayed"),       # Composer amp_fp8 = TE
    ("deepseek_v3_pretrain_2048_h800", "blockwise"),                  # fine-grained scaling
    ("deepseek_v3_gb200_mcore_final_hybridep", "blockwise"),          # MXFP8 block scales
])
def test_fp8_recipe(by_id, rid, recipe):
    lay = to_case(by_id[rid]).layout
    assert (lay.precision, lay.fp8_recipe) == ("fp8", recipe)


def test_dualpipe_overlaps_all_to_all(by_id):
    assert to_case(by_id["deepseek_v3_pretrain_2048_h800"]).layout.moe_a2a_overlap
    # Megatron-Core interleaved 1F1B; the record states no A2A overlap: none assumed
    assert not to_case(by_id["deepseek_v3_gb200_mcore_final_hybridep"]).layout.moe_a2a_overlap


def test_memory_options_follow_framework(by_id):
    tt = to_case(by_id["torchtitan_202412_t1_8b_8gpu_fsdp"]).memory_options
    assert (tt.recipe, tt.selective_policy, tt.fp8_saved_activations) == ("fsdp2", "op", False)
    mc = to_case(by_id["mcore_h100_weak_1.7b"]).memory_options
    assert (mc.recipe, mc.selective_policy) == ("megatron", "attention")


@pytest.mark.parametrize(("rid", "dedup"), [
    ("deepseek_v3_pretrain_2048_h800", True),   # model.extra.max_nodes_per_token: 4
    ("mcore_h100_weak_1.7b", False),
])
def test_ep_node_dedup(by_id, rid, dedup):
    assert to_case(by_id[rid]).layout.ep_node_dedup is dedup


@pytest.mark.parametrize(("rid", "blocking", "scatter_gather"), [
    # Megatron-LM 2021/22 p2p_communication: batch_isend_irecv + torch.cuda.synchronize; no SP
    ("megatron_sc21_t1_530b", True, True),
    ("korthikanti_t5_530b_full", True, True),
    ("korthikanti_t5_530b_seqsel", True, False),    # SP: the activation is already sharded
    ("mcore_h100_weak_177b", True, False),          # Megatron-Core, not interleaved
    ("deepseek_v3_gb200_mcore_final_hybridep", False, False),  # interleaved: overlap_p2p_comm
    ("llama3_405b_8192gpu_cp1", False, False),      # no framework stated
    ("torchtitan_202412_t6_405b_fsdp8_cp1_32k", False, False),
    ("megatron_sc21_t1_7.5b", False, False),        # pp = 1: nothing to send
])
def test_pipeline_transfers_follow_framework(by_id, rid, blocking, scatter_gather):
    lay = to_case(by_id[rid]).layout
    assert (lay.pp_p2p_blocking, lay.pp_scatter_gather) == (blocking, scatter_gather)
