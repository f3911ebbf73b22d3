"""Megatron-LM facts of 2021/22 (Korthikanti et al. arXiv 2205.05198, Narayanan et al. SC21):
the SP backward re-gather, the synchronous backward all-reduce of 2021, the fused
bias-dropout-add and apex's persistent LayerNorm."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.hardware.loader import load_cluster
from charon_search.ir import OpKind, Phase, Role
from charon_search.layout import Layout
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.fusion import PERSISTENT_NORM_TAG, FusionPass
from charon_search.passes.synthetic import _G, synthetic_block
from charon_search.sim.costing import GraphCoster
from charon_search.validation import default_files, load_files, select_records, to_case

B, S, H = 2, 128, 256  # synthetic_block: hidden 256
TOKENS_BYTES = B * S * H * 2  # one bf16 b*s*h activation


def _bwd_comm(pb):
    return [n for n in pb.backward.nodes if n.is_comm]


def test_sp_regather_adds_one_all_gather_per_column_input_before_its_dgrad() -> None:
    plain = parallelize_block(synthetic_block("dense"),
                              PassContext(tp=4, sequence_parallel=True, debug=True))
    pb = parallelize_block(synthetic_block("dense"),
                           PassContext(tp=4, sequence_parallel=True, sp_wgrad_regather=True,
                                       debug=True))
    gathers = [n for n in _bwd_comm(pb) if n.kind == OpKind.ALL_GATHER]
    # Without the re-gather the backward has the 2 gathers of the row GEMMs' dgrad inputs;
    # Megatron adds one per column linear input (the QKV input and the MLP input: q/k/v and
    # gate/up read one gathered copy, Megatron's fused linear_qkv / fc1).
    assert len([n for n in _bwd_comm(plain) if n.kind == OpKind.ALL_GATHER]) == 2
    assert len(gathers) == 4
    regather = [n for n in gathers if n.name.startswith("tp_all_gather_wgrad_")]
    assert len(regather) == 2
    nodes = list(pb.backward.nodes)
    for ag in regather:
        # the whole b*s*h activation, like the forward's gather
        assert ag.params["bytes"](B, S) == pytest.approx(TOKENS_BYTES)
        # issued before the first dgrad it overlaps, after the gradient that dgrad reads
        i = nodes.index(ag)
        dgrad = next(n for n in nodes[i + 1:] if n.kind == OpKind.GEMM)
        assert dgrad.module_path == ag.module_path and dgrad.params["k"].degree("b") == 0
        assert set(dgrad.inputs) & set(ag.inputs)
        # every wgrad of that input reads the gathered copy
        readers = [n for n in nodes if ag.outputs[0] in n.inputs]
        assert readers and all(n.kind == OpKind.GEMM and n.params["k"].degree("b") > 0
                               for n in readers)


def test_sync_allreduce_of_2021_waits_for_the_wgrad_gemms() -> None:
    async_ = parallelize_block(synthetic_block("dense"), PassContext(tp=4, debug=True))
    sync = parallelize_block(synthetic_block("dense"),
                             PassContext(tp=4, tp_async_allreduce=False, debug=True))
    assert all(len(n.inputs) == 1 for n in _bwd_comm(async_))
    wgrad_out = {t for n in sync.backward.nodes if n.kind == OpKind.GEMM
                 and n.params["k"].degree("b") > 0 for t in n.outputs}
    for ar in _bwd_comm(sync):
        assert ar.kind == OpKind.ALL_REDUCE
        waits = set(ar.inputs[1:])
        # MLP input grad: gate + up wgrads; attention input grad: q + k + v wgrads
        assert waits and waits <= wgrad_out
    assert sorted(len(n.inputs) - 1 for n in _bwd_comm(sync)) == [2, 3]


def _dropout_add_graph():
    g = _G("bda.fwd", Phase.FORWARD)
    x, r = g.inp(B, S, H), g.inp(B, S, H)
    y, mask, z = g.t(B, S, H), g.t(B, S, H, dtype="bool"), g.t(B, S, H)
    n = B * S * H
    drop = g.op(OpKind.ELEMENTWISE, "attn.dropout", Role.ATTN_OUT, (x,), (y, mask), 2 * n,
                numel=n)
    g.nodes[-1] = drop.replace(target="aten.native_dropout.default")
    g.op(OpKind.ELEMENTWISE, "residual", Role.RESIDUAL, (y, r), (z,), n, numel=n)
    return g.graph((z,), {})


def test_bias_dropout_add_is_one_kernel_moving_7_bytes_per_element() -> None:
    graph = _dropout_add_graph()
    unfused = sum(float(n.bytes(1, 1)) for n in graph.nodes)
    assert unfused == 11 * B * S * H  # dropout 2 + 2 + 1, add 2 + 2 + 2
    out = FusionPass().run(graph, PassContext()).graph
    (fused,) = out.nodes
    assert fused.kind == OpKind.ELEMENTWISE and fused.role == Role.RESIDUAL
    assert "bias_dropout_add" in fused.tags
    # reads x and the residual, writes the sum and the 1-byte mask
    assert float(fused.bytes_read(1, 1)) == 4 * B * S * H
    assert float(fused.bytes_written(1, 1)) == 3 * B * S * H
    assert len(fused.outputs) == 2


class _Ones:
    provenance = "predictor"

    def cost_graph(self, graph, b, s, c=None):
        return np.ones(len(graph.nodes))


def test_persistent_layernorm_is_priced_at_the_a100_roofline() -> None:
    pb = parallelize_block(synthetic_block("dense"), PassContext(norm_impl="persistent"))
    cl = load_cluster("dgx-a100-superpod")
    gpu = cl.gpu
    for graph in (pb.forward, pb.backward):
        norms = [i for i, n in enumerate(graph.nodes) if n.kind == OpKind.NORM]
        assert norms and all(PERSISTENT_NORM_TAG in graph.nodes[i].tags for i in norms)
        cg = GraphCoster(cl, _Ones(), strides={"tp": 1}).cost(graph, B, S)
        for i in norms:
            nbytes = float(graph.nodes[i].bytes(B, S))
            # 2039 GB/s x 0.8 (memory_efficiency) + 4 us launch
            want = nbytes / (2039e9 * 0.8) + 4e-6
            assert gpu.hbm_bandwidth_bytes_per_s == 2039e9 and gpu.memory_efficiency == 0.8
            assert cg.durations_s[i] == pytest.approx(want) and cg.provenance[i] == "roofline"
    fused = parallelize_block(synthetic_block("dense"), PassContext())
    assert not any(PERSISTENT_NORM_TAG in n.tags for n in fused.forward.nodes)
    assert Layout(norm_impl="persistent").norm_impl == "persistent"


def test_records_get_the_megatron_code_of_their_year() -> None:
    recs = {r.id: r for r in select_records(load_files(default_files()), ids=[
        "korthikanti_t4_22b_layer_selective_plus_sequence_parallel",
        "korthikanti_t4_22b_layer_baseline_no_recompute", "megatron_sc21_t1_530b"])}
    sp = to_case(recs["korthikanti_t4_22b_layer_selective_plus_sequence_parallel"]).layout
    assert sp.sp_wgrad_regather and sp.norm_impl == "persistent" and sp.tp_async_allreduce
    base = to_case(recs["korthikanti_t4_22b_layer_baseline_no_recompute"]).layout
    assert not base.sp_wgrad_regather and base.norm_impl == "persistent"
    sc21 = to_case(recs["megatron_sc21_t1_530b"]).layout
    assert not sc21.tp_async_allreduce and sc21.norm_impl == "fused"


@pytest.mark.parametrize(("reduce_dtype", "acc"), [("fp16", 2), ("fp32", 4)])
def test_megatron_2021_adds_every_gradient_into_the_buffer_each_micro_batch(
        reduce_dtype: str, acc: int) -> None:
    """``main_grad.add_(grad)`` per parameter: one elementwise node per parameter tensor in
    each layer backward reading the fresh 2-byte gradient and the buffer and writing the
    buffer, over the rank's TP shard of the layer's parameters (synthetic dense layer:
    12 h^2 weights + 4 h norm params)."""
    from charon_search.passes import local_params

    ctx = PassContext(tp=2, grad_accum_hook=True, grad_reduce_dtype=reduce_dtype, debug=True)
    blk = synthetic_block("dense")
    pb = parallelize_block(blk, ctx)
    acc_nodes = [n for n in pb.backward.nodes if "grad_accum" in n.tags]
    assert len(acc_nodes) == len(blk.forward.param_tensors)  # one add_ per tensor
    assert not [n for n in pb.forward.nodes if "grad_accum" in n.tags]
    numel = local_params(blk.forward, tp=2).numel
    assert numel == pytest.approx(local_params(pb.forward, tp=2).numel)
    assert sum(n.bytes_read(B, S) for n in acc_nodes) == pytest.approx(numel * (2 + acc))
    assert sum(n.bytes_written(B, S) for n in acc_nodes) == pytest.approx(numel * acc)
    from charon_search.passes._rewrite import gemm_kind

    wgrads = {t for n in pb.backward.nodes if n.kind == OpKind.GEMM and gemm_kind(n) == "wgrad"
              for t in n.outputs}
    assert len(wgrads) >= 4
    assert all(set(n.inputs) == wgrads for n in acc_nodes)  # after every weight gradient
    plain = parallelize_block(blk, PassContext(tp=2, debug=True))
    assert not [n for n in plain.backward.nodes if "grad_accum" in n.tags]


def test_sc21_records_accumulate_gradients_unfused_in_fp16() -> None:
    recs = {r.id: r for r in load_files(default_files())}
    sc21 = to_case(recs["megatron_sc21_t1_530b"]).layout
    assert sc21.grad_accum_hook and sc21.grad_reduce_dtype == "fp16"
    kort = to_case(recs["korthikanti_t5_530b_seqsel"]).layout  # 2022: fused into the GEMM
    assert not kort.grad_accum_hook and kort.grad_reduce_dtype == "fp32"


@pytest.mark.parametrize(("precision", "elem_bytes"), [("bf16", 2), ("fp8", 1)])
def test_sp_regather_on_biased_linears_gathers_each_saved_input_once(
        precision: str, elem_bytes: int) -> None:
    """A GPT block (linears with biases, ``addmm``): per layer the re-gathers move the QKV and
    fc1 inputs once each, 2 * b * s * h elements (fp8 under Transformer Engine: 1 byte), never
    the output gradients, and only tensors already produced (pass checks on)."""
    import dataclasses

    from charon_search.catalog import load_model
    from charon_search.frontend import trace_model

    spec = load_model("mcore-gpt-16b")
    tr = trace_model(spec, phase="train")
    lay = Layout.from_dict(dict(tp=4, sequence_parallel=True, sp_wgrad_regather=True,
                                global_batch_size=4, seq_len=4096, precision=precision,
                                fp8_recipe="delayed"))
    ctx = dataclasses.replace(PassContext.from_layout(lay), debug=True)
    g = parallelize_block(tr.blocks["dense"], ctx).backward
    b, s, h = 1, 4096, spec.hidden_size
    gathers = [n for n in g.nodes if n.name.startswith("tp_all_gather_wgrad")]
    assert len(gathers) == 2
    assert sum(n.params["bytes"](b, s) for n in gathers) == pytest.approx(
        2 * b * s * h * elem_bytes)


def test_grad_accum_hook_needs_an_unsharded_gradient_buffer() -> None:
    """ZeRO-3 shards the gradients: no per-micro-batch add over the whole layer there."""
    blk = synthetic_block("dense")
    tensors = len(blk.forward.param_tensors)  # one add_ per parameter tensor
    for zero, expected in ((0, tensors), (1, tensors), (3, 0)):
        ctx = PassContext(dp=2, zero_stage=zero, grad_accum_hook=True, debug=True)
        pb = parallelize_block(blk, ctx)
        assert len([n for n in pb.backward.nodes if "grad_accum" in n.tags]) == expected


def test_op_sac_reruns_the_fused_bias_dropout_add() -> None:
    """Per-op SAC saves matmuls and attention only: the fused bias-dropout-add kernels of a
    GPT block (one per residual branch) are re-run like the dropout and add they merge."""
    from charon_search.catalog import load_model
    from charon_search.frontend import trace_model

    tr = trace_model(load_model("mcore-gpt-16b"), phase="train")
    ctx = PassContext(recompute="selective", selective_policy="op", debug=True)
    pb = parallelize_block(tr.blocks["dense"], ctx)
    fwd = [n for n in pb.forward.nodes if "bias_dropout_add" in n.tags]
    rc = [n for n in pb.backward.nodes if "bias_dropout_add" in n.tags
          and n.phase == Phase.RECOMPUTE]
    assert len(fwd) == 2 and len(rc) == 2


def test_fused_grad_accumulation_still_hooks_the_embedding_gradients() -> None:
    """Megatron-Core fuses the weight-gradient accumulation into the GEMMs, but its DDP hook
    still adds each micro-batch's embedding-table, norm and bias gradients into the fp32
    main_grad (``_make_param_hook``): one node per such tensor (the word and position tables;
    per layer the two LayerNorms' weight and bias and the four linears' biases, 13 h), none
    over the GEMM weight matrices."""
    from charon_search.catalog import load_model
    from charon_search.frontend import trace_model

    spec = load_model("mcore-gpt-1.7b")
    tr = trace_model(spec, phase="train")
    h, v, pos = spec.hidden_size, spec.vocab_size, 4096  # n_positions of the catalog config
    ctx = PassContext(embedding_grad_hook=True, debug=True)

    def hooked(block: str, c: PassContext = ctx) -> list:
        g = parallelize_block(tr.blocks[block], c).backward
        return [n for n in g.nodes if "grad_accum" in n.tags]

    emb = hooked("embedding")
    assert sorted(n.bytes_written(1, 4096) for n in emb) == pytest.approx(
        [pos * h * 4, v * h * 4])
    assert sum(n.bytes_read(1, 4096) for n in emb) == pytest.approx((v + pos) * h * (2 + 4))
    dense = hooked("dense")  # LayerNorm weights and biases, qkv / proj / fc1 / fc2 biases
    assert len(dense) == 8
    assert sum(n.bytes_written(1, 4096) for n in dense) == pytest.approx((4 + 3 + 1 + 4 + 1)
                                                                          * h * 4)
    assert len(hooked("lm_head")) == 2  # the final LayerNorm; the output weight is fused
    assert not hooked("embedding", PassContext(debug=True))
    recs = {r.id: r for r in load_files(default_files())}
    mcore = to_case(recs["mcore_h100_weak_1.7b"]).layout
    assert mcore.embedding_grad_hook and not mcore.grad_accum_hook
    sc21 = to_case(recs["megatron_sc21_t1_1.7b"]).layout  # 2021: every gradient hooked already
    assert sc21.grad_accum_hook and not sc21.embedding_grad_hook


def test_sc21_records_reduce_gradients_after_the_backward() -> None:
    recs = {r.id: r for r in load_files(default_files())}
    assert not to_case(recs["megatron_sc21_t1_7.5b"]).layout.dp_overlap_grad_reduce
    assert to_case(recs["korthikanti_t5_22b_full"]).layout.dp_overlap_grad_reduce


@pytest.mark.parametrize(("fields", "rule"), [
    (dict(fsdp_flat_grad=True, zero_stage=2), "`fsdp_flat_grad`.*needs `zero_stage` 3"),
    (dict(grad_accum_hook=True, zero_stage=3), "`grad_accum_hook`.*zero_stage` 0 or 1"),
    (dict(embedding_grad_hook=True, zero_stage=2), "`embedding_grad_hook`.*zero_stage` 0 or 1"),
    (dict(sp_wgrad_regather=True, tp=2), "`sp_wgrad_regather` needs `sequence_parallel`"),
    (dict(pp_p2p_blocking=True, pp=2, schedule="dualpipe"),
     "`pp_p2p_blocking`.*does not go with schedule 'dualpipe'"),
])
def test_framework_facts_without_their_setting_are_refused(fields, rule) -> None:
    from charon_search.errors import ConfigError

    with pytest.raises(ConfigError, match=rule):
        Layout(**fields)
