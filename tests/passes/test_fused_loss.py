"""The fused cross-entropy kernel (``Layout.loss_kernel = "fused"``, ``passes.fused_loss``).

MPT-1B's LM head (vocabulary V = 50368, bf16 logits) at one sequence of 2048 tokens: the traced
``nn.CrossEntropyLoss`` under autocast moves 22 bytes per logit forward (fp32 copy: 2 + 4;
ATen's three-pass log-softmax over a 50368-wide row: 3 x 4 + 4) and 26 backward (the NLL
gradient zero-filled: 4; log-softmax backward reading the gradient twice and the output once
and writing: 16; the bf16 cast: 6). The fused kernels read the bf16 logits twice forward and
once backward and write the bf16 gradient: 4 + 4 bytes per logit, plus per-row terms.
"""

from __future__ import annotations

import pytest

from charon_search.errors import ConfigError
from charon_search.frontend import trace_model
from charon_search.ir import OpKind, Role
from charon_search.layout import Layout
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.fused_loss import JOIN_TARGET, loss_region
from charon_search.validation import default_files, load_files
from charon_search.validation.translate import to_case

B, S, V = 1.0, 2048.0, 50368
BF16, FP32, INT64 = 2, 4, 8


@pytest.fixture(scope="module")
def head():
    return trace_model("mpt-1b", phase="train", dtype="bf16").blocks["lm_head"]


def _loss_bytes(graph) -> float:
    return sum(float(n.bytes(B, S, S)) for n in graph.nodes if n.role == Role.LOSS)


def _kernel(graph):
    (k,) = [n for n in graph.nodes if "fused_loss" in n.tags and n.target != JOIN_TARGET]
    return k


def test_fused_kernels_move_the_logits_closed_form(head) -> None:
    fused = parallelize_block(head, PassContext(fused_kernels=True, loss_kernel="fused",
                                                debug=True))
    logits = B * S * V * BF16
    fwd, bwd = _kernel(fused.forward), _kernel(fused.backward)
    assert fwd.kind == bwd.kind == OpKind.SOFTMAX
    # forward: the logits twice and the int64 labels; writes a per-row fp32 log-sum-exp and
    # the loss (scalar + total weight)
    assert float(fwd.bytes_read(B, S, S)) == pytest.approx(2 * logits + B * S * INT64)
    assert float(fwd.bytes_written(B, S, S)) == pytest.approx(B * S * FP32 + 2 * FP32)
    # backward: the logits once, the log-sum-exp and the labels; writes the bf16 gradient
    assert float(bwd.bytes_written(B, S, S)) == pytest.approx(logits)
    reads = float(bwd.bytes_read(B, S, S))
    assert logits + B * S * FP32 < reads < logits + B * S * (FP32 + INT64) + 64
    # the other loss ops stay as zero-cost joins; the label shift (int64) stays as it was
    joins = [n for n in fused.forward.nodes if n.target == JOIN_TARGET]
    assert [n.target for n in joins] == [JOIN_TARGET] * 2  # the fp32 cast and log-softmax
    plain = parallelize_block(head, PassContext(fused_kernels=True))
    assert [n.target for n in loss_region(plain.forward)] == [
        "aten._to_copy.default", "aten._log_softmax.default", "aten.nll_loss_forward.default"]
    assert all(float(n.bytes(B, S, S)) == 0 for n in joins)
    assert any(n.role == Role.LOSS and n.target.startswith("aten.constant_pad_nd")
               for n in fused.forward.nodes)


def test_eager_loss_moves_six_times_the_fused_bytes(head) -> None:
    eager = parallelize_block(head, PassContext(fused_kernels=True))
    fused = parallelize_block(head, PassContext(fused_kernels=True, loss_kernel="fused"))
    per_logit = B * S * V
    assert _loss_bytes(eager.forward) / per_logit == pytest.approx(22.0, abs=0.01)
    assert _loss_bytes(eager.backward) / per_logit == pytest.approx(26.0, abs=0.01)
    assert _loss_bytes(fused.forward) / per_logit == pytest.approx(4.0, abs=0.01)
    assert _loss_bytes(fused.backward) / per_logit == pytest.approx(4.0, abs=0.01)
    # the LM head's GEMMs read the same gradient tensor either way
    gemms = [n for n in fused.backward.nodes if n.kind == OpKind.GEMM]
    assert [n.inputs for n in gemms] == [
        n.inputs for n in eager.backward.nodes if n.kind == OpKind.GEMM]


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-8b"])
def test_rmsnorm_head_keeps_its_norm_gradient_out_of_the_loss(model: str) -> None:
    """RMSNorm's input is used twice, so its backward sums two gradients (an op with no module
    of its own): it belongs to the final norm, after the LM head's GEMMs, not to the loss."""
    block = trace_model(model, phase="train", dtype="bf16").blocks["lm_head"]
    norm_sum = [n for n in block.backward.nodes if n.target == "aten.add.Tensor"]
    assert norm_sum and all(n.role == Role.FINAL_NORM for n in norm_sum)
    fused = parallelize_block(block, PassContext(fused_kernels=True, loss_kernel="fused",
                                                 debug=True))
    bwd = _kernel(fused.backward)
    gemms = [n for n in fused.backward.nodes if n.kind == OpKind.GEMM]
    # the kernel writes the gradient both LM-head GEMMs read, and runs before them
    assert all(set(bwd.outputs) & set(g.inputs) for g in gemms)
    index = {n.id: i for i, n in enumerate(fused.backward.nodes)}
    assert all(index[bwd.id] < index[g.id] for g in gemms)
    vocab = block.backward.tensors[bwd.outputs[0]].shape[-1]
    assert float(bwd.bytes_written(B, S, S)) == pytest.approx(B * S * float(vocab) * BF16)


def test_a_loss_of_one_op_is_left_alone() -> None:
    from charon_search.passes.synthetic import synthetic_block

    block = synthetic_block("lm_head")
    plain = parallelize_block(block, PassContext(fused_kernels=True))
    fused = parallelize_block(block, PassContext(fused_kernels=True, loss_kernel="fused"))
    for a, b in ((plain.forward, fused.forward), (plain.backward, fused.backward)):
        assert [float(n.bytes(B, S, S)) for n in b.nodes] == [
            float(n.bytes(B, S, S)) for n in a.nodes]


def test_tp_shards_the_fused_kernels_over_the_vocabulary(head) -> None:
    one = _kernel(parallelize_block(head, PassContext(fused_kernels=True, loss_kernel="fused"))
                  .backward)
    tp4 = _kernel(parallelize_block(head, PassContext(fused_kernels=True, loss_kernel="fused",
                                                      tp=4)).backward)
    assert float(tp4.bytes_written(B, S, S)) == pytest.approx(
        float(one.bytes_written(B, S, S)) / 4)


@pytest.mark.parametrize("loss_kernel", ["eager", "fused"])
def test_vocab_parallel_loss_all_reduces_three_fp32_values_per_token(head, loss_kernel) -> None:
    """Megatron's ``_VocabParallelCrossEntropy`` / torchtitan's ``loss_parallel``: the maximum
    logit, the target's logit and the sum of exponentials, one fp32 value per token each, over
    the TP group; nothing in the backward. Under CP each rank holds s / cp tokens."""
    from charon_search.passes.tensor_parallel import LOSS_STAT_TAG, is_activation_all_reduce

    def stats(g):
        return [n for n in g.nodes if LOSS_STAT_TAG in n.tags]

    one = parallelize_block(head, PassContext(fused_kernels=True, loss_kernel=loss_kernel))
    assert not stats(one.forward)
    for cp in (1, 2):
        pb = parallelize_block(head, PassContext(fused_kernels=True, loss_kernel=loss_kernel,
                                                 tp=4, cp=cp, sequence_parallel=True))
        ars = stats(pb.forward)
        assert [n.kind for n in ars] == [OpKind.ALL_REDUCE] * 3
        assert all(n.group == "tp" and float(n.params["group_size"](B, S, S)) == 4
                   for n in ars)
        assert [float(n.params["bytes"](B, S, S)) for n in ars] == [B * S / cp * FP32] * 3
        assert not any(is_activation_all_reduce(n) for n in ars)
        assert not stats(pb.backward)
        # a chain: each reads the one before; eager: the NLL op waits for the last one (an
        # extra input; the log-probabilities keep their id for the backward), fused: the chain
        # ends the block's forward (the loss is known after it)
        assert [ars[i].outputs[0] in ars[i + 1].inputs for i in range(2)] == [True, True]
        out, last = ars[-1].outputs[0], pb.forward.nodes.index(ars[-1])
        if loss_kernel == "eager":
            (nll,) = [n for n in pb.forward.nodes[last + 1:] if out in n.inputs]
            assert nll.target == "aten.nll_loss_forward.default"
            assert ars[0].inputs[0] in nll.inputs and ars[0].inputs[0] in pb.forward.outputs
        else:
            assert last == len(pb.forward.nodes) - 1


def test_step_and_memory_follow_the_loss_kernel() -> None:
    from charon_search.memory.report import memory_report
    from charon_search.training import simulate_training

    kw = dict(dp=8, zero_stage=3, micro_batch_size=2, global_batch_size=16, seq_len=2048)
    eager, fused = Layout(**kw), Layout(**kw, loss_kernel="fused")
    t_e = simulate_training("mpt-1b", "h100-sxm-8gpu", eager, memory=False).step_time_s
    t_f = simulate_training("mpt-1b", "h100-sxm-8gpu", fused, memory=False).step_time_s
    # 40 fewer bytes per logit forward and backward: 2 x 2048 x 50368 x 40 B = 8.25 GB, a few
    # milliseconds at H100 bandwidth
    assert 2e-3 < t_e - t_f < 6e-3
    m_e = memory_report("mpt-1b", eager, "h100-sxm-8gpu")
    m_f = memory_report("mpt-1b", fused, "h100-sxm-8gpu")
    assert m_f.to_dict()["stages"][0]["activations_bytes"] <= m_e.to_dict()["stages"][0][
        "activations_bytes"]
    assert m_f.peak_device_bytes < m_e.peak_device_bytes


def test_unknown_loss_kernel_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"loss_kernel.*'eager', 'fused'"):
        Layout(loss_kernel="chunked")


@pytest.mark.parametrize(("rid", "kernel"), [
    ("llmfoundry_h100_80gb_mpt3b_8gpu_seq2048_fp8", "fused"),  # MPT fused_crossentropy
    ("torchtitan_trainy_h200_8b_4nodes", "fused"),          # 2025, compiled, no TP
    ("torchtitan_asynctp_70b_bf16_asyncTP", "eager"),        # TP 8: loss_parallel
    ("torchtitan_202412_t1_8b_8gpu_fsdp", "eager"),          # Dec 2024: loss not compiled
    ("megatron_sc21_t1_1.7b", "eager"),
])
def test_records_state_their_loss_kernel(rid: str, kernel: str) -> None:
    (rec,) = [r for r in load_files(default_files()) if r.id == rid]
    assert to_case(rec).layout.loss_kernel == kernel
