"""Framework conventions of the memory model on the traced ``debug-llama`` (h = 64, ffn 160,
vocab 256, 2 layers, 4 heads / 2 KV heads): torch.compile'd per-op SAC, the loss
implementations, DTensor's all-gathered GEMM inputs, FSDP2's root buffers, NCCL buffers outside
the allocator, and the translation of validation records into these options."""

from __future__ import annotations

import dataclasses

import pytest

from charon_search.catalog import load_model
from charon_search.errors import ConfigError
from charon_search.layout import Layout
from charon_search.memory import MemoryOptions, ShardingPoint, memory_report, model_profile
from charon_search.memory.report import LOSS_IMPLS, _buffers, _loss_block
from charon_search.memory.static import STATE_RECIPES
from charon_search.testing import TOY_CALIBRATION, toy_cluster

B, S = 2, 256
H = 64
GIB = 2**30


@pytest.fixture(scope="module")
def llama():
    spec = load_model("debug-llama")
    return spec, model_profile(spec, phase="train", attn_impl="sdpa")


def _ev(prof, name: str, tp: int = 1, sp: bool = False) -> dict[str, float]:
    return prof.blocks[name].evaluate(ShardingPoint(b=B, s=S, c=S, tp=tp, sequence_parallel=sp))


def test_compiled_sac_drops_the_unread_down_projection_output(llama) -> None:
    spec, prof = llama
    ev = _ev(prof, "dense")
    # The 7th mm (down projection) is must-save under torchtitan's policy but only the residual
    # add reads it: eager SAC caches it, a compiled block does not save it (b*s*h bf16).
    assert ev["op_sac_saved"] - ev["op_sac_needed"] == 2 * B * S * H
    base = Layout(micro_batch_size=B, global_batch_size=B, seq_len=S, recompute="selective")
    acts = [memory_report(spec, base, toy_cluster(), profile=prof, options=MemoryOptions(
        selective_policy="op", compiled=c)).stages[0].saved_activations_bytes
        for c in (False, True)]
    assert acts[0] - acts[1] == spec.num_layers * 2 * B * S * H


def test_the_layouts_selective_policy_reaches_the_memory_model(llama) -> None:
    """``charon-search train``/``memory`` and the search evaluators call ``memory_report`` without
    options: the layout's ``selective_policy`` (the one its compute is priced with) decides what
    selective recompute keeps, unless a framework's options name one."""
    spec, prof = llama
    base = Layout(micro_batch_size=B, global_batch_size=B, seq_len=S, recompute="selective")
    op = dataclasses.replace(base, selective_policy="op")

    def acts(layout, **kw):
        return memory_report(spec, layout, toy_cluster(), profile=prof,
                             options=MemoryOptions(**kw)).stages[0].saved_activations_bytes

    ev = _ev(prof, "dense")
    assert acts(op) == acts(base, selective_policy="op")
    assert acts(base) == acts(op, selective_policy="attention")
    # per dense layer: compiled per-op SAC (Layout.fused_kernels) keeps what its backward reads
    # of the must-save set, attention-core recompute everything but the core's internals
    assert base.fused_kernels
    assert acts(base) - acts(op) == pytest.approx(
        spec.num_layers * (ev["selective_saved"] - ev["op_sac_needed"]), rel=1e-9)
    assert acts(base) > acts(op)
    assert memory_report(spec, op, toy_cluster(), profile=prof).assumptions[
        "selective_policy"] == "op"


def test_megatron_recompute_modules_free_their_saved_bytes(llama) -> None:
    """``recompute_modules`` on debug-llama (h 64, ffn 160), per layer: ``mlp`` (normal
    checkpointing) frees the four b x s x ffn bf16 tensors HF's SwiGLU saves (gate and up
    outputs, SiLU output, their product) and keeps nothing new (its input is saved anyway);
    ``layernorm`` (output-discarding) frees everything its two RMSNorms save, their bf16
    outputs included (bf16 output + bf16 normalised + fp32 copy of b x s x h, fp32 rstd of
    b x s), and keeps their bf16 inputs; ``core_attn`` is Megatron's attention-core selective
    recompute."""
    spec, prof = llama
    ev = _ev(prof, "dense")
    F = 160
    assert ev["module_saved:mlp"] == 4 * 2 * B * S * F
    assert ev["module_inputs:mlp"] == 0
    assert ev["module_saved:layernorm"] == 2 * (2 + 2 + 4) * B * S * H + 2 * 4 * B * S
    assert ev["module_inputs:layernorm"] == 2 * 2 * B * S * H
    assert (ev["module_saved:core_attn"], ev["module_inputs:core_attn"]) == (
        ev["saved_core"], ev["core_inputs"])

    def acts(modules):
        layout = Layout(micro_batch_size=B, global_batch_size=B, seq_len=S,
                        recompute="selective", recompute_modules=modules)
        return memory_report(spec, layout, toy_cluster(),
                             profile=prof).stages[0].saved_activations_bytes

    attn = acts(())
    assert acts(("core_attn",)) == attn
    freed = (ev["module_saved:mlp"] + ev["module_saved:layernorm"]
             - ev["module_inputs:layernorm"] - ev["module_saved:core_attn"]
             + ev["module_inputs:core_attn"])
    assert attn - acts(("mlp", "layernorm")) == pytest.approx(spec.num_layers * freed, rel=1e-9)


def test_eager_loss_model_reproduces_the_traced_hf_loss(llama) -> None:
    _, prof = llama
    ev = _ev(prof, "lm_head")
    f32 = 4 * B * S * 256  # fp32 logits
    assert ev["logits"] == f32
    kept, transient = _loss_block(ev, "eager")
    # HF: log-softmax output kept (1 F); nll + log-softmax backward hold 3 F at once. The
    # traced block additionally keeps the int64 labels (8 B/token) and the fp32 total-weight
    # scalar, which the model leaves out.
    assert kept == ev["saved"] - 8 * B * S - 4
    assert kept + transient == pytest.approx(ev["bwd_peak"], rel=1e-9)


@pytest.mark.parametrize(("impl", "kept_f", "peak_f"), [
    ("eager", 1.0, 3.0), ("loss_parallel", 1.0, 4.0), ("compiled", 0.5, 1.0), ("fused", 0.5, 1.0),
    ("vocab_parallel", 1.0, 1.5)])
def test_loss_implementations(llama, impl: str, kept_f: float, peak_f: float) -> None:
    _, prof = llama
    ev = _ev(prof, "lm_head")
    f32 = 4 * B * S * 256
    kept, transient = _loss_block(ev, impl)
    assert kept == ev["saved_noloss"] + kept_f * f32
    assert kept + transient == ev["saved_noloss"] + peak_f * f32
    assert LOSS_IMPLS[impl][0] == kept_f


def test_unknown_loss_impl_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="loss_impl"):
        MemoryOptions(loss_impl="chunked")


def test_dtensor_keeps_all_gathered_gemm_inputs(llama) -> None:
    spec, prof = llama
    # With TP 2 + SP each layer saves two norm outputs for column GEMMs (QKV, gate/up), the
    # LM head one: DTensor keeps them whole, i.e. (tp - 1) more sharded copies.
    assert _ev(prof, "dense", tp=2, sp=True)["col_gather_extra"] == 2 * (B * S * H // 2 * 2)
    assert _ev(prof, "lm_head", tp=2, sp=True)["col_gather_extra"] == B * S * H // 2 * 2
    assert _ev(prof, "dense", tp=2, sp=False)["col_gather_extra"] == 0
    lay = Layout(tp=2, sequence_parallel=True, micro_batch_size=B, global_batch_size=B,
                 seq_len=S)
    acts = [memory_report(spec, lay, toy_cluster(), profile=prof, options=MemoryOptions(
        sp_saves_gathered_inputs=g)).stages[0].saved_activations_bytes for g in (False, True)]
    assert acts[1] - acts[0] == spec.num_layers * 2 * B * S * H + B * S * H


def test_fsdp2_root_and_last_block_stay_unsharded() -> None:
    lay = Layout(dp=4, zero_stage=3, micro_batch_size=1, global_batch_size=4)
    fsdp2 = STATE_RECIPES["fsdp2"]
    # root = embedding + head = 10 params (head 4), largest block 3, prefetch 1:
    # at the loss: root + the last block, gathered in bf16;
    # at a block: root + the head's bf16 grad + gathered block and its prefetch + its bf16
    # grads + their fp32 reduce-scatter copy.
    got = _buffers(lay, fsdp2, MemoryOptions(), dense_shards=4, prefetch=1, unit_max=6,
                   layer_unit=3, root=10, head=4)
    assert got == (10 * 2 + 3 * 2, 10 * 2 + 4 * 2 + 3 * (2 * 2 + 2 + 4))
    # Other ZeRO-3 implementations gather the largest unit, embedding included.
    mixed = _buffers(lay, STATE_RECIPES["mixed"], MemoryOptions(), dense_shards=4, prefetch=1,
                     unit_max=6, layer_unit=3, root=10, head=4)
    assert mixed == (6 * 6, 6 * 6)


def test_nccl_buffers_count_for_fits_but_not_reserved(llama) -> None:
    spec, prof = llama
    cal = dataclasses.replace(TOY_CALIBRATION, comm_buffer_bytes=GIB)
    lay = Layout(tp=2, dp=2, micro_batch_size=1, global_batch_size=2, seq_len=S)
    rep = memory_report(spec, lay, toy_cluster(calibration=cal), profile=prof)
    st = rep.stages[0]
    assert st.device_overhead_bytes == 2 * GIB  # TP and DP groups
    assert st.peak_reserved_bytes == st.peak_allocated_bytes  # factor 1, no extra
    assert rep.peak_device_bytes == st.peak_reserved_bytes + 2 * GIB
    assert rep.to_dict()["peak_device_bytes"] == rep.peak_device_bytes


def test_records_translate_to_framework_options() -> None:
    from charon_search.validation import default_files, load_files, select_records
    from charon_search.validation.translate import to_case

    want = {
        "torchtitan_202412_t1_8b_8gpu_fsdp": ("eager", False),
        "torchtitan_202412_t4_70b_256gpu_fsdp32_tp8": ("loss_parallel", True),
        "torchtitan_trainy_h200_8b_4nodes": ("compiled", True),
        "korthikanti_fig1_22b_memory": ("vocab_parallel", True),
    }
    recs = select_records(load_files(default_files()), ids=list(want))
    for rec in recs:
        if rec.id not in want:
            continue
        case = to_case(rec)
        compiled = (case.layout.fused_kernels if case.memory_options.compiled is None
                    else case.memory_options.compiled)
        assert (case.memory_options.loss_impl, compiled) == want[rec.id], rec.id


def test_attention_kernel_not_fusion_decides_saved_scores() -> None:
    spec = load_model("debug-llama")
    base = Layout(micro_batch_size=B, global_batch_size=B, seq_len=S)
    flash = memory_report(spec, base, toy_cluster())
    unfused = memory_report(spec, base.replace(fused_kernels=False), toy_cluster())
    eager = memory_report(spec, base.replace(attention_kernel="eager"), toy_cluster())
    # torchtitan without torch.compile still runs SDPA's flash kernel: no s x s tensors.
    assert unfused.assumptions["attn_impl"] == "sdpa"
    assert unfused.stages[0].saved_activations_bytes == flash.stages[0].saved_activations_bytes
    # Eager attention saves at least the bf16 softmax output (b x heads x s x s) per layer.
    scores = B * spec.num_attention_heads * S * S * 2
    assert eager.assumptions["attn_impl"] == "eager"
    assert (eager.stages[0].saved_activations_bytes - flash.stages[0].saved_activations_bytes
            >= spec.num_layers * scores)


def test_fused_norm_and_swiglu_save_less(llama) -> None:
    spec, prof = llama
    ev = _ev(prof, "dense")
    tok = B * S
    # Per token, HF's RMSNorm saves an fp32 copy (4h) and the normalised bf16 tensor (2h) that
    # a fused kernel replaces by its bf16 input (2h): -4h per norm, two norms; the fused SwiGLU
    # recomputes SiLU instead of saving it (-2 ffn).
    assert ev["fused_delta"] == -tok * (2 * 4 * H + 2 * spec.intermediate_size)
    lay = Layout(micro_batch_size=B, global_batch_size=B, seq_len=S)
    acts = [memory_report(spec, lay, toy_cluster(), profile=prof, options=MemoryOptions(
        fused_saved=f)).stages[0].saved_activations_bytes for f in (False, True)]
    final_norm = -tok * 4 * H  # the LM head block's final norm
    assert acts[1] - acts[0] == spec.num_layers * ev["fused_delta"] + final_norm
    assert MemoryOptions.for_framework("megatron").fused_saved


@pytest.mark.parametrize("dtype,grad_b", [("fp32", 4), ("fp16", 2), ("bf16", 2)])
def test_gradient_buffers_follow_the_reduce_dtype(llama, dtype: str, grad_b: int) -> None:
    """Megatron's DDP buffer (``main_grad``) and FSDP2's reduce-scatter copy are allocated in
    ``Layout.grad_reduce_dtype``: per GPU, grads = local parameters x its bytes."""
    spec, prof = llama
    lay = Layout(dp=2, micro_batch_size=1, global_batch_size=2, seq_len=S,
                 grad_reduce_dtype=dtype)
    rep = memory_report(spec, lay, toy_cluster(), profile=prof,
                        options=MemoryOptions.for_framework("megatron"))
    st = rep.stages[0]
    assert st.grads_bytes == pytest.approx(st.params_bytes / 2 * grad_b)  # bf16 params
    fsdp = Layout(dp=4, zero_stage=3, micro_batch_size=1, global_batch_size=4, seq_len=S,
                  grad_reduce_dtype=dtype)
    opts = MemoryOptions.for_framework("torchtitan")
    from charon_search.memory.report import _recipe
    assert _recipe(opts, fsdp).reduce_buffer_bytes == grad_b
    assert _recipe(opts, fsdp).grad_bytes == 4  # the sharded fp32 gradient itself
    # the ZeRO-paper default keeps its fp16 gradients whatever the reduce dtype
    assert _recipe(MemoryOptions(), fsdp).grad_bytes == 2


@pytest.mark.parametrize("dtype,grad_b", [("fp32", 4), ("bf16", 2)])
def test_fsdp2_no_sync_accumulates_in_the_reduce_dtype(llama, dtype: str, grad_b: int) -> None:
    """Pipelined FSDP2 (no gradient sync between micro-batches) keeps the unsharded gradients
    in its reduce dtype (``FSDPParam.to_accumulated_grad_if_needed``): 2 B/param when it
    reduces in bf16, 4 B/param in fp32; the sharded fp32 parameters stay 4 B."""
    spec, prof = llama
    lay = Layout(dp=2, pp=2, schedule="1f1b", zero_stage=3, micro_batch_size=1,
                 global_batch_size=8, seq_len=S, grad_reduce_dtype=dtype)
    rep = memory_report(spec, lay, toy_cluster(), profile=prof,
                        options=MemoryOptions.for_framework("torchtitan"))
    st = rep.stages[0]
    assert rep.assumptions["fsdp_no_sync_accumulation"]
    # params: fp32, sharded over dp=2; grads: unsharded in the reduce dtype
    assert st.grads_bytes == pytest.approx(st.params_bytes * 2 / 4 * grad_b)
