"""Training records -> ``Layout`` fields that state what the source framework ran.

Each rule reads a fact of the record (framework, version year, recipe, launch flags) and sets a
layout field with its source; none is tuned to an error (issue 8). ``translate`` builds the
training case and calls ``framework_facts`` and ``attention_kernel``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from charon_search.layout import RECOMPUTE_MODULES

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec
    from charon_search.validation.records import Record

__all__ = ["CUBLASLT_FP8_RECIPES", "MEGATRON_PERSIST_LN_HIDDEN_SIZES", "arxiv_year",
           "attention_kernel", "fp8_recipe", "framework", "framework_facts", "source_year"]


#: torchtitan compiles the loss together with the model from 2025 on
#: (``torchtitan/components/loss.py``, ``build_cross_entropy_loss``: ``torch.compile(loss_fn)``
#: when compiling); the Dec-2024 benchmark commit 9dec370 still had it commented out in
#: ``train.py`` ("TODO: compiling loss function causes CUDA errors, turning off for now").
_TORCHTITAN_COMPILED_LOSS_FROM = 2025
#: fp8 recipes whose training GEMMs run cuBLASLt (per-tensor or per-row scales; the block-scaled
#: recipes run their own kernels): see ``framework_facts``.
CUBLASLT_FP8_RECIPES = ("delayed", "tensorwise", "rowwise")
#: First year of torchtitan op-SAC runs without ``reduce_scatter_tensor`` in the save list
#: (pytorch/torchtitan#965, merged March 2025; see ``framework_facts``).
_TORCHTITAN_SAC_NO_RS_FROM = 2025


def framework(ex: Mapping[str, Any]) -> str:
    """The record's ``training.extra.framework`` (stripped; ``""`` when absent)."""
    return str(ex.get("framework") or "").strip()


def framework_facts(record: Record, t: Mapping[str, Any], ex: Mapping[str, Any],
                    notes: list[str],
                    note_fields: list[frozenset[str]] | None = None) -> dict[str, Any]:
    """Layout fields that state what the source framework ran (no fitted values).

    Each rule reads a fact of the record (framework, recipe, schedule); none is tuned to an error.
    Every fact appends one line with its source to ``notes``; ``note_fields``, when given, gets
    the fields each line states, in the same order (so a caller that overrides a field can drop
    its line).
    """
    out: dict[str, Any] = {}
    stated: set[str] = set()

    def note(text: str) -> None:
        notes.append(text)
        if note_fields is not None:
            note_fields.append(frozenset(out.keys() - stated))
        stated.update(out)

    fw = framework(ex)
    # Megatron-LM of SC21 (Narayanan et al., arXiv 2104.04473) and Korthikanti et al. (arXiv
    # 2205.05198) ran CoreAttention: QK^T bmm, fused scale-mask-softmax over s x s, attention
    # dropout, PV bmm (Korthikanti's 5as/h activation term is that softmax + dropout mask);
    # flash attention reached Megatron only in 2023. "Megatron-Core ..." records (mcore_*) use
    # Transformer Engine's fused attention and keep "flash".
    if fw == "Megatron-LM":
        out["attention_kernel"] = "eager"
        note("Megatron-LM 2021/22 (pre flash-attention): unfused CoreAttention "
             "(attention_kernel='eager')")
    # Megatron-LM changed between the SC21 code (Narayanan et al., April 2021) and the 2022 code
    # of Korthikanti et al.; the source's date (its arXiv id) says which one ran.
    year = arxiv_year(record) or source_year(record)
    megatron_2021 = fw == "Megatron-LM" and year is not None and year < 2022
    if megatron_2021 and int(t.get("tp") or 1) > 1:
        # 2020-21 ``ColumnParallelLinear``: ``copy_to_tensor_model_parallel_region(input_)``
        # then ``F.linear``; the input-gradient all-reduce runs after both GEMMs of the
        # backward. ``ColumnParallelLinearWithAsyncAllreduce`` (``--no-async-tensor-model-
        # parallel-allreduce`` to turn it off) came with the 2022 code.
        out["tp_async_allreduce"] = False
        note("Megatron-LM 2021: the TP backward all-reduce waits for the wgrad GEMM "
             "(no async all-reduce yet)")
    if megatron_2021:
        # 2021 ``megatron/model/distributed.py``: a hook per parameter adds its gradient into
        # the contiguous gradient buffer every micro-batch (``main_grad.add_``); the buffer is
        # the parameters' dtype unless --accumulate-allreduce-grads-in-fp32 (forced for bf16),
        # and the step's data-parallel all-reduce reads it. Gradient-accumulation fusion into
        # the wgrad GEMM came with the 2022 code.
        out["grad_accum_hook"] = True
        # ... and train_step all-reduces the buffer after forward_backward_func returns: the
        # data-parallel reduction overlaps no backward.
        out["dp_overlap_grad_reduce"] = False
        fp16 = str(t.get("precision") or "").lower() == "fp16"
        out["grad_reduce_dtype"] = "fp16" if fp16 else "fp32"
        note("Megatron-LM 2021 DDP: each micro-batch adds every gradient into the "
             f"{'fp16' if fp16 else 'fp32'} gradient buffer (main_grad.add_), which "
             "the data-parallel all-reduce reads after the backward")
    if (fw.startswith(("Megatron-LM", "Megatron-Core")) and not megatron_2021
            and int(t.get("zero_stage") or 0) <= 1):
        # Gradient-accumulation fusion (on by default since 2022) adds the weight gradients
        # into main_grad inside the GEMMs; the DDP hook (Megatron-Core distributed_data_
        # parallel.py ``_make_param_hook``) still adds the rest each micro-batch: the
        # embedding tables' dense gradient, norm weights, linear biases and router weights.
        out["embedding_grad_hook"] = True
        note("Megatron DDP hook: embedding-table, norm, bias and router gradients added "
             "into the fp32 main_grad buffer every micro-batch (main_grad.add_)")
    pp = int(t.get("pp") or 1)
    vpp = int(t.get("vpp") or 1)
    # Pipeline transfers: Megatron-LM's ``p2p_communication._communicate`` (2020-22) runs
    # ``batch_isend_irecv``, waits on every request and calls ``torch.cuda.synchronize()``, so
    # a stage runs nothing while its sends are in flight; Megatron-Core does the same with
    # ``batch_p2p_comm`` and ``batch_p2p_sync`` (both default), which its training arguments
    # use whenever the schedule is not interleaved (``overlap_p2p_comm`` is forced off there;
    # interleaved runs keep ``--overlap-p2p-communication``, on by default).
    if (pp > 1 and t.get("schedule") != "dualpipe"
            and (fw == "Megatron-LM" or (fw.startswith("Megatron-Core") and vpp == 1))):
        out["pp_p2p_blocking"] = True
        note("Megatron pipeline transfers block the sending stage (batch_isend_irecv, "
             "then torch.cuda.synchronize)")
    # ... and without sequence parallelism it sends 1/tp of each activation over the network
    # and all-gathers it in the receiving stage's TP group (--scatter-gather-tensors-in-
    # pipeline, on by default; Narayanan et al., SC21, Section 4.1).
    if (fw == "Megatron-LM" and pp > 1 and int(t.get("tp") or 1) > 1
            and not t.get("sequence_parallel")):
        out["pp_scatter_gather"] = True
        note("Megatron-LM scatter/gather: a stage sends 1/tp of its output, the next "
             "stage all-gathers it over NVLink")
    mla = str(((record.model or {}).get("extra") or {}).get("attention") or "").upper() == "MLA"
    if fw.startswith("Megatron-Core") and mla:
        # MLASelfAttention with apply_rope_fusion (Megatron-Core's default): two fused Triton
        # RoPE kernels per direction (megatron/core/fusions/fused_mla_yarn_rope_apply.py).
        out["mla_rope_fusion"] = True
        note("Megatron-Core MLA: fused query and key/value RoPE kernels "
             "(apply_rope_fusion, fused_apply_mla_rope_for_q / _for_kv)")
    hidden = int((record.model or {}).get("hidden_size") or 0)
    if (fw == "Megatron-LM" and year is not None and year >= 2022
            and hidden in MEGATRON_PERSIST_LN_HIDDEN_SIZES):
        # megatron/model/fused_layer_norm.py of 2022: MixedFusedLayerNorm runs apex's
        # FastLayerNormFN unless --no-persist-layer-norm, for the listed hidden sizes.
        out["norm_impl"] = "persistent"
        note("Megatron-LM 2022: apex persistent LayerNorm (persist_layer_norm, "
             f"hidden {hidden} in its list)")
    # Megatron's sequence-parallel column linear saves its input shard and all-gathers it again
    # in the backward for the weight gradient, overlapped with the dgrad GEMM (Megatron-LM
    # ``LinearWithGradAccumulationAndAsyncCommunication`` since the SP commit of 2022;
    # Megatron-Core keeps it, and Transformer Engine's ``Linear`` does the same).
    if fw.startswith(("Megatron-LM", "Megatron-Core")) and t.get("sequence_parallel"):
        out["sp_wgrad_regather"] = True
        note("Megatron SP: the column linears' saved input shard is all-gathered again "
             "in the backward (under the dgrad GEMM)")
    # torchtitan's `activation_checkpoint.selective_ac_option = "op"`: per-op SAC (torchtitan
    # models/llama/parallelize_llama.py `_save_list`: matmuls every other time, SDPA and
    # collectives saved, the rest recomputed).
    if str(ex.get("selective_ac_option", "")).lower() == "op":
        out["selective_policy"] = "op"
        note("torchtitan op-level SAC (selective_ac_option 'op'): every other matmul, SDPA "
             "and the collectives saved, the rest recomputed")
        # torchtitan took ``reduce_scatter_tensor`` out of the op-SAC save list in March 2025
        # (pytorch/torchtitan#965: a saved reduce-scatter broke async TP's fusion) and put it
        # back later (#1031 was still open in spring 2025; the 2025 ``parallelize_llama.py``
        # with ``enable_float8_tensorwise_tp`` lists mm, SDPA and max only): its 2025 runs with
        # TP re-run the attention output's reduce-scatter in the backward.
        if (fw == "torchtitan" and year is not None and year >= _TORCHTITAN_SAC_NO_RS_FROM
                and int(t.get("tp") or 1) > 1 and t.get("sequence_parallel")):
            out["sac_saves_reduce_scatter"] = False
            note("torchtitan 2025 op SAC: reduce_scatter_tensor not in the save list "
                 "(pytorch/torchtitan#965); the backward re-runs the attention "
                 "output's reduce-scatter")
    # torchtitan context parallelism (torch ``context_parallel``): its Llama repeats K/V heads
    # before SDPA (``repeat_kv`` in models/llama/model.py), and with torch.compile the ring is
    # traced into the compiled block (``passes.context_parallel``: ``torch_traced``).
    if fw == "torchtitan" and int(t.get("cp") or 1) > 1:
        out["cp_repeat_kv"] = True
        if ex.get("torch_compile"):
            out["cp_ring_impl"] = "torch_traced"
            note("torchtitan CP under torch.compile: K/V all-gather and fp32 dK/dV "
                 "ring not overlapped; K/V at the query-head count (repeat_kv)")
        else:
            note("torchtitan CP: K/V at the query-head count (repeat_kv)")
    # The loss: llm-foundry's MPT runs flash-attn's fused CrossEntropyLoss
    # (``ComposerMPTCausalLM``: ``loss_fn`` defaults to ``fused_crossentropy``; the benchmark
    # yamls do not set it; its HF models keep their own loss), and torchtitan from 2025
    # compiles the loss with the model unless TP's ``loss_parallel`` computes it
    # (``passes.fused_loss``).
    tp = int(t.get("tp") or 1)
    mpt = any("mpt" in str((record.model or {}).get(k) or "").lower()
              for k in ("catalog", "name", "model_type"))
    if "llm-foundry" in fw.lower() and mpt:
        out["loss_kernel"] = "fused"
        note("llm-foundry MPT loss_fn 'fused_crossentropy' (default): flash-attn's "
             "fused cross entropy on the bf16 logits")
    elif (fw == "torchtitan" and ex.get("torch_compile") and year is not None
          and year >= _TORCHTITAN_COMPILED_LOSS_FROM
          and (tp == 1 or ex.get("disable_loss_parallel"))):
        out["loss_kernel"] = "fused"
        note("torchtitan 2025: the loss compiled with the model (build_cross_entropy_"
             "loss), one fused kernel per direction on the bf16 logits")
    # Megatron-Core --moe-permute-fusion / --moe-router-fusion (Transformer Engine's fused
    # permute, unpermute and router kernels; ``passes.fusion``).
    if ex.get("moe_permute_fusion") or ex.get("moe_router_fusion"):
        out["moe_fused_permute"] = True
        note("Megatron-Core MoE permute/router fusion (one kernel per op run)")
    # Megatron-Core ``--recompute-modules`` (e.g. "mlp moe_act"): only those submodules are
    # re-run under selective recompute, not the attention core. DeepSeek-V3 report sec. 3.2.3
    # ("Recomputation of RMSNorm and MLA Up-Projection") names the same modules in words.
    text = str(ex.get("recompute_modules") or "")
    mods = tuple(text.replace(",", " ").split())
    if text.lower() == "rmsnorm and mla up-projections":
        mods = ("layernorm", "mla_up_proj")
    if mods and set(mods) <= set(RECOMPUTE_MODULES) and t.get("recompute") == "selective":
        out["recompute_modules"] = mods
        note(f"selective recompute of Megatron-Core modules {' '.join(mods)}")
    # Megatron-Core ``--pipeline-model-parallel-layout`` (the record's ``pp_layout``; a trailing
    # "(32 stages)" is the record's own comment): which decoder layers, embedding and LM head
    # each virtual pipeline stage holds, instead of an even split.
    if ex.get("pp_layout") and int(t.get("pp") or 1) > 1:
        text = re.sub(r"\(\s*\d+\s+stages\s*\)\s*$", "", str(ex["pp_layout"])).strip()
        out["pp_layout"] = text
        note(f"pipeline layout {text!r} (--pipeline-model-parallel-layout)")
    # torchtitan without torch.compile runs its own eager ``RMSNorm`` (torchtitan
    # models/norms.py: ``_norm(x.float()).type_as(x) * weight``; ``norm_type = "rmsnorm"`` in
    # train_configs/llama3_8b.toml of the Dec-2024 benchmark commit 9dec370): one kernel per
    # op, no fused norm kernel (``passes.eager_norm``).
    if fw == "torchtitan" and ex.get("torch_compile") is False:
        out["norm_impl"] = "eager"
        note("torchtitan RMSNorm without torch.compile: one eager kernel per op "
             "(norm_impl='eager')")
    # llm-foundry trains under Composer's FSDP1 wrapper, whose FSDPConfig defaults are
    # backward_prefetch 'BACKWARD_POST', forward_prefetch False, limit_all_gathers True (the
    # benchmark tables' yamls do not override them): a backward all-gather is issued after the
    # layer's gradient computation, ahead of that layer's reduce-scatter on the one process group.
    if "llm-foundry" in fw.lower() and int(t.get("zero_stage") or 0) == 3:
        out["fsdp_backward_prefetch"] = "post"
        note("Composer FSDP1 backward_prefetch BACKWARD_POST (FSDPConfig default): "
             "backward all-gathers wait for the layer's gradients and queue with the "
             "reduce-scatters")
        # Composer wraps PyTorch FSDP1 (FlatParameter): each backward concatenates a unit's
        # gradients into its flat gradient, casts it to the reduce dtype and pre-divides it in
        # place before the reduce-scatter (torch/distributed/fsdp/_runtime_utils.py). Composer's
        # mixed_precision 'PURE' reduces in the parameter dtype (bf16), 'DEFAULT' in fp32
        # (mosaicml/composer #2047; mosaic_fsdp_utils.get_mixed_precision).
        out["fsdp_flat_grad"] = True
        mp = str(ex.get("fsdp_mixed_precision") or "").upper()
        if mp == "PURE":
            out["grad_reduce_dtype"] = "bf16"
        note("Composer FSDP1 FlatParameter gradients: concatenated, cast to the "
             f"{'bf16' if mp == 'PURE' else 'fp32'} reduce dtype and pre-divided before "
             "each reduce-scatter")
    recipe = fp8_recipe(record, t, ex, fw)
    if recipe is not None:
        out["fp8_recipe"] = recipe[0]
        note(f"fp8 recipe {recipe[0]!r} ({recipe[1]})")
        # Per-tensor-scaled fp8 GEMMs of training run cuBLASLt: Transformer Engine's GEMM
        # (transformer_engine/common/gemm/cublaslt_gemm.cu, the ``delayed`` recipe) and torchao's
        # ``torch._scaled_mm`` (tensorwise: ``at::cuda::blas::scaled_gemm``; rowwise backward
        # GEMMs run that kernel too, its forward is priced relative to it, ``passes.fusion``).
        if recipe[0] in CUBLASLT_FP8_RECIPES:
            out["fp8_gemm_kernel"] = "cublaslt"
            note("fp8 GEMMs on cuBLASLt (Transformer Engine / torch._scaled_mm)")
    # Deduplicating EP dispatch: a token crosses IB once per target node and NVLink once per
    # target rank, not once per routed expert. DeepSeek's own training (report sec. 3.2.2:
    # node-limited routing, each token to at most 4 nodes, forwarded over NVLink; DeepEP's
    # normal kernels) and Megatron-Core's flex dispatcher (``--moe-token-dispatcher-type
    # flex``: DeepEP or HybridEP kernels) do it; Megatron's alltoall / allgather dispatchers
    # and torchtitan's all-to-all send a row per routed expert.
    mx = dict(record.model.get("extra") or {}).get("max_nodes_per_token")
    dispatcher = str(ex.get("token_dispatcher") or "").strip().lower()
    flex = dispatcher.startswith(("flex", "deepep", "hybridep"))
    deepseek_own = bool(mx) and not dispatcher
    expert_parallel = int(t.get("ep") or 1) > 1
    if expert_parallel and deepseek_own and t.get("precision") == "fp8":
        # Report sec. 3.3.2: activations quantized to fp8 before the dispatch (and the
        # gradients before the backward's), combines kept in bf16.
        out["ep_dispatch_fp8"] = True
        note("EP dispatch in fp8 with 1x128 scales, combine in bf16 (DeepSeek-V3 "
             "report sec. 3.3.2)")
    if expert_parallel and (flex or deepseek_own):
        out["ep_node_dedup"] = True
        note("EP dispatch/combine once per target node and rank ("
             + (f"{ex.get('token_dispatcher')} dispatcher" if flex else
                f"node-limited routing, at most {mx} nodes per token; DeepSeek-V3 "
                "report sec. 3.2.2") + ")")
    # DeepSeek-V3 report sec. 3.2.1: DualPipe pairs a forward and a backward chunk and overlaps
    # the EP all-to-all (dispatch / combine) of one with the computation of the other.
    if t.get("schedule") == "dualpipe" and int(t.get("ep") or 1) > 1:
        out["moe_a2a_overlap"] = True
        note("DualPipe: EP all-to-all overlapped with the paired chunk's compute "
             "(DeepSeek-V3 report sec. 3.2.1)")
    return out


#: PyTorch SDPA picked FlashAttention-2 (its ``flash`` backend) on Hopper between 2.5.1 (cuDNN
#: attention made opt-in, pytorch/pytorch#138522, Oct 2024) and 2.9 (cuDNN first again on
#: sm90/sm100, pytorch/pytorch#162073, Sept 2025). torchtitan's context parallelism allows only
#: the flash and memory-efficient backends (torchtitan ``utils.get_train_context``: "currently we
#: only support these two SDP backends").
_SDPA_FA2_YEARS = (2024, 2025)


def attention_kernel(record: Record, ex: Mapping[str, Any],
                     model: ModelSpec) -> tuple[str, str] | None:
    """``(Layout.attention_kernel, why)`` when the framework ran an older fused kernel than the
    GPU's best (``cost.attention_kernels``); ``None`` keeps ``flash``."""
    fw = framework(ex).lower()
    year = source_year(record)
    if fw == "torchtitan" and year in _SDPA_FA2_YEARS:
        return "flash2", ("PyTorch SDPA flash backend = FlashAttention-2; cuDNN attention "
                          "opt-in from torch 2.5.1 (pytorch/pytorch#138522)")
    if "llm-foundry" in fw and bool((model.hf_config or {}).get("attn_config", {}).get(
            "alibi", (model.hf_config or {}).get("alibi", False))):
        # MPT with ALiBi ran attn_impl "triton" (MPTConfig of 2023: "alibi only implemented
        # with torch and triton attention"; scripts/train/benchmarking/submit_benchmarks.py
        # of the benchmark tables: --attn_impl default 'triton').
        return "flash_triton", "MPT attn_impl 'triton' (ALiBi) of the 2023 llm-foundry tables"
    return None


def fp8_recipe(record: Record, t: Mapping[str, Any], ex: Mapping[str, Any],
               fw: str) -> tuple[str, str] | None:
    """``(Layout.fp8_recipe, why)`` for fp8 records; ``None`` keeps the default."""
    prec = str(t.get("precision") or "")
    if prec not in ("fp8", "mxfp8"):
        return None
    stated = str(ex.get("float8_recipe") or "").lower()
    if stated in ("tensorwise", "rowwise"):  # torchao Float8LinearConfig recipe name
        return stated, "extra.float8_recipe of the record"
    if prec == "mxfp8" or "block" in str(ex.get("fp8_recipe", "")).lower():
        # MXFP8 (OCP MX spec: 1x32 blocks with E8M0 scales) and DeepSeek-V3's fine-grained
        # 1x128 / 128x128 scaling (report sec. 3.3.2) compute scales per block, inside the cast.
        return "blockwise", "block-scaled: mxfp8 or DeepSeek-V3 fine-grained scaling"
    if fw.lower().startswith(("megatron", "nemo")) or "llm-foundry" in fw.lower() \
            or str(ex.get("amp", "")) == "amp_fp8":
        # Megatron and Composer's amp_fp8 both run Transformer Engine's DelayedScaling recipe
        # (scale from the amax history of previous iterations).
        return "delayed", "Transformer Engine DelayedScaling (Megatron / llm-foundry amp_fp8)"
    if "DeepSeek-V3" in record.source:
        return "blockwise", "DeepSeek-V3 fine-grained block scaling (report sec. 3.3.2)"
    if fw == "torchtitan":
        # torchtitan's float8 converter without a recipe name: torchao Float8Linear's default,
        # dynamic tensorwise scaling (``Float8LinearConfig()``; rowwise is opt-in by name)
        return "tensorwise", "torchao Float8Linear default (dynamic tensorwise scaling)"
    return None


#: ``persist_ln_hidden_sizes`` of Megatron-LM's ``MixedFusedLayerNorm`` (2022): the hidden sizes
#: apex's persistent ``FastLayerNorm`` kernel supports; others fall back to the older kernel.
MEGATRON_PERSIST_LN_HIDDEN_SIZES = frozenset({
    1024, 1536, 2048, 2304, 3072, 3840, 4096, 5120, 6144, 8192, 10240, 12288, 12800, 15360,
    16384, 18432, 20480, 24576, 25600, 30720, 32768, 40960, 49152, 65536})


def arxiv_year(record: Record) -> int | None:
    """Year of the source's arXiv id (``arXiv 2205.05198`` -> 2022) in its title or URL."""
    for text in (record.source, record.url):
        m = re.search(r"(?:arXiv[ :]|arxiv\.org/(?:abs|pdf)/)(\d{2})(\d{2})\.\d{4,5}", text or "")
        if m and 1 <= int(m.group(2)) <= 12:
            return 2000 + int(m.group(1))
    return None


def source_year(record: Record) -> int | None:
    """Year of the source as its title states it (``"... (Dec 2024)"``), else ``None``."""
    years = re.findall(r"\b(20[0-9]{2})\b", record.source)
    return int(years[-1]) if years else None
