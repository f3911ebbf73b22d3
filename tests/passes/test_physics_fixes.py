"""Physical mechanisms fixed while validating (engineer D2): TP reduction before the
bias/dropout epilogue, eager (pre-flash) attention, fp8 cast layouts and dynamic scaling."""

from __future__ import annotations

import pytest

from charon_search.ir import Node, OpGraph, OpKind, Phase, Role, TensorSpec, sym
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.fusion import FP8_CAST_READS
from charon_search.passes.synthetic import synthetic_block

B, S = 2, 128
H = 256
b, s = sym("b"), sym("s")


def _row_gemm_dropout_graph() -> OpGraph:
    """x (head-sharded) -> attn.out row GEMM -> dropout (value, 1-byte mask) -> + residual."""
    sh = (b, s, H + 0 * b)
    t = {0: TensorSpec(id=0, shape=sh, dtype="bf16"),  # x
         1: TensorSpec(id=1, shape=(H + 0 * b, H + 0 * b), dtype="bf16"),  # weight
         2: TensorSpec(id=2, shape=sh, dtype="bf16"),  # residual
         3: TensorSpec(id=3, shape=sh, dtype="bf16"),  # gemm out
         4: TensorSpec(id=4, shape=sh, dtype="bf16"),  # dropout out
         5: TensorSpec(id=5, shape=sh, dtype="bool"),  # dropout mask
         6: TensorSpec(id=6, shape=sh, dtype="bf16")}
    bs = b * s
    nodes = (
        Node(id=0, name="o_proj", kind=OpKind.GEMM, role=Role.ATTN_OUT, phase=Phase.FORWARD,
             inputs=(0, 1), outputs=(3,), flops=2 * bs * H * H,
             bytes_read=bs * H * 2 + H * H * 2, bytes_written=bs * H * 2,
             params={"m": bs, "n": H + 0 * b, "k": H + 0 * b}),
        Node(id=1, name="dropout", kind=OpKind.ELEMENTWISE, role=Role.ATTN_OUT,
             phase=Phase.FORWARD, inputs=(3,), outputs=(4, 5), flops=bs * H,
             bytes_read=bs * H * 2, bytes_written=bs * H * 3, params={"numel": bs * H}),
        Node(id=2, name="residual_add", kind=OpKind.ELEMENTWISE, role=Role.RESIDUAL,
             phase=Phase.FORWARD, inputs=(4, 5, 2), outputs=(6,), flops=bs * H,
             bytes_read=bs * H * 4, bytes_written=bs * H * 2, params={"numel": bs * H}),
    )
    return OpGraph(name="g", nodes=nodes, tensors=t, inputs=(0, 1, 2), outputs=(6,),
                   param_tensors=(1,), meta={"direction": "forward", "tp_sharded_inputs": (0,)})


@pytest.mark.parametrize("sp", [False, True])
def test_tp_reduces_before_dropout_and_never_sends_the_mask(sp: bool) -> None:
    from charon_search.passes import run_passes
    tp = 4
    g = run_passes(_row_gemm_dropout_graph(), PassContext(tp=tp, sequence_parallel=sp,
                                                          debug=True), ["tp"])
    comm = [n for n in g.nodes if n.is_comm]
    # Megatron: exactly one all-reduce (SP: reduce-scatter) of the b*s*h bf16 GEMM output.
    assert [n.kind for n in comm] == [OpKind.REDUCE_SCATTER if sp else OpKind.ALL_REDUCE]
    assert comm[0].params["bytes"](B, S) == B * S * H * 2
    names = [n.name for n in g.nodes]
    assert names.index(comm[0].name) < names.index("dropout")
    drop = next(n for n in g.nodes if n.name == "dropout")
    # The dropout runs on the reduced tensor: whole under plain TP, 1/tp of it under SP.
    assert drop.flops(B, S) == pytest.approx(B * S * H / (tp if sp else 1))


def _attn(g: OpGraph) -> list[Node]:
    return [n for n in g.nodes if n.role == Role.ATTN_CORE]


def test_eager_attention_costs_full_score_matrix() -> None:
    heads, hd = 8, 32  # synthetic_block defaults: hidden 256, 8 heads
    pb = parallelize_block(synthetic_block("dense"),
                           PassContext(attention_kernel="eager", debug=True))
    fwd, bwd = _attn(pb.forward), _attn(pb.backward)
    assert [n.kind for n in fwd] == [OpKind.BATCHED_GEMM, OpKind.SOFTMAX, OpKind.ELEMENTWISE,
                                     OpKind.BATCHED_GEMM]
    sc = B * heads * S * S  # score elements (c = s); nothing skips the causal half
    bmm_fwd = sum(n.flops(B, S) for n in fwd if n.kind == OpKind.BATCHED_GEMM)
    assert bmm_fwd == pytest.approx(2 * 2 * sc * hd)
    assert fwd[1].bytes_read(B, S) + fwd[1].bytes_written(B, S) == pytest.approx(2 * 2 * sc)
    assert fwd[2].bytes_written(B, S) == pytest.approx(3 * sc)  # bf16 probs + 1-byte mask
    bmm_bwd = sum(n.flops(B, S) for n in bwd if n.kind == OpKind.BATCHED_GEMM)
    assert bmm_bwd == pytest.approx(2 * bmm_fwd)  # dP, dV, dQ, dK
    assert not any(n.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD)
                   for g in (pb.forward, pb.backward) for n in g.nodes)


def test_eager_attention_is_head_sharded_and_selectively_recomputed() -> None:
    pb1 = parallelize_block(synthetic_block("dense"), PassContext(attention_kernel="eager"))
    pb2 = parallelize_block(synthetic_block("dense"),
                            PassContext(attention_kernel="eager", tp=2, recompute="selective",
                                        debug=True))
    one = sum(n.flops(B, S) for n in _attn(pb1.forward))
    assert sum(n.flops(B, S) for n in _attn(pb2.forward)) == pytest.approx(one / 2)
    rc = [n for n in pb2.backward.nodes if n.phase == Phase.RECOMPUTE]
    assert len(rc) == 4 and sum(n.flops(B, S) for n in rc) == pytest.approx(one / 2)


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed"])
def test_fp8_wgrad_needs_transposed_casts_and_dynamic_scaling_reads_twice(recipe: str) -> None:
    blk = synthetic_block("dense")
    pb = parallelize_block(blk, PassContext(precision="fp8", fp8_recipe=recipe, debug=True))
    q = [n for n in pb.backward.nodes if "fp8" in n.tags and n.kind == OpKind.ELEMENTWISE]
    qt = [n for n in q if n.name.startswith("fp8_quantize_t_")]
    wgrads = [n for n in pb.backward.nodes if n.kind == OpKind.GEMM and n.dtype == "fp8"
              and n.params["k"].degree("b") > 0]
    # One token-major copy per distinct activation a wgrad GEMM reads (dY and the saved X).
    assert wgrads and len(qt) == len({t for n in wgrads for t in n.inputs
                                      if t not in set(pb.backward.param_tensors)})
    reads = FP8_CAST_READS[recipe]
    for n in q:
        numel = n.params["numel"](B, S)
        # Transformer Engine (delayed) writes the transposed copy in the forward / dgrad cast
        # kernel (fp8_cast_transpose_fused): that copy reads no bf16
        r = 0.0 if recipe == "delayed" and n in qt else reads
        assert n.bytes_read(B, S) == pytest.approx(numel * 2 * r)  # bf16 input
        assert n.bytes_written(B, S) == pytest.approx(numel)  # fp8 output


def test_fp8_delayed_cast_transpose_fusion_not_with_sequence_parallel() -> None:
    # TE Linear: fp8_cast_transpose_fused only "and not sequence_parallel"
    def t_reads(sp: bool) -> float:
        pb = parallelize_block(synthetic_block("dense"), PassContext(
            precision="fp8", fp8_recipe="delayed", tp=2, sequence_parallel=sp, debug=True))
        return sum(n.bytes_read(B, S) for n in pb.backward.nodes
                   if n.name.startswith("fp8_quantize_t_"))

    assert t_reads(False) == 0.0 and t_reads(True) > 0.0


def test_fp8_unknown_recipe_is_config_error() -> None:
    from charon_search.errors import ConfigError
    with pytest.raises(ConfigError, match="fp8_recipe"):
        parallelize_block(synthetic_block("dense"), PassContext(precision="fp8",
                                                                 fp8_recipe="nope"))


def test_ep_wgrad_writes_only_local_expert_gradients() -> None:
    ep = 4
    blk = synthetic_block("moe")
    pb = parallelize_block(blk, PassContext(ep=ep, dp=ep, debug=True))
    before = {n.name: n for n in blk.backward.nodes if n.name.endswith("wgrad")
              and n.kind == OpKind.GROUPED_GEMM}
    after = {n.name: n for n in pb.backward.nodes if n.name in before}
    assert before and set(after) == set(before)
    for name, n0 in before.items():
        p = n0.params
        w = p["num_experts"](B, S) * p["n"](B, S) * p["k"](B, S) * 2  # bf16 weight gradient
        # The unsharded wgrad writes every expert's gradient; an EP rank writes its ep-th.
        assert n0.bytes_written(B, S) - after[name].bytes_written(B, S) == pytest.approx(
            w * (1 - 1 / ep))


def test_op_sac_recomputes_every_second_matmul_and_cheap_ops() -> None:
    blk = synthetic_block("dense")
    pb = parallelize_block(blk, PassContext(recompute="selective", selective_policy="op",
                                            debug=True))
    rc = [n for n in pb.backward.nodes if n.phase == Phase.RECOMPUTE]
    gemms = [n for n in pb.forward.nodes if n.kind == OpKind.GEMM]
    even = gemms[1::2]  # 2nd, 4th, ... matmul in forward order
    assert len(gemms) >= 4
    assert sum(n.flops(B, S) for n in rc if n.kind == OpKind.GEMM) == pytest.approx(
        sum(n.flops(B, S) for n in even))
    assert not any(n.kind == OpKind.ATTENTION for n in rc)
    cheap = [n for n in pb.forward.nodes if n.kind in (OpKind.NORM, OpKind.ELEMENTWISE)]
    assert cheap and len([n for n in rc if n.kind in (OpKind.NORM, OpKind.ELEMENTWISE)]) == len(
        cheap)


def _op_sac_block(**kw: object):
    ctx = PassContext(recompute="selective", selective_policy="op", debug=True, **kw)
    return parallelize_block(synthetic_block("dense"), ctx)


def _tp_gathers(g: OpGraph) -> list[Node]:
    return [n for n in g.nodes if n.kind == OpKind.ALL_GATHER and n.group == "tp"]


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_op_sac_reruns_the_sequence_parallel_all_gathers(precision: str) -> None:
    """torchtitan's op-SAC save list holds reduce-scatters but no all-gather, and the backward
    needs the gathered activations: both sequence-parallel all-gathers of a dense layer (in
    front of the QKV and the MLP-in matmuls) are re-run, each moving the forward's bytes; the
    FSDP parameter gathers are not (module docstring of passes.recompute)."""
    pb = _op_sac_block(tp=4, sequence_parallel=True, zero_stage=3, dp=2, precision=precision)
    fwd = _tp_gathers(pb.forward)
    rc = [n for n in _tp_gathers(pb.backward) if n.phase == Phase.RECOMPUTE]
    assert len(fwd) == 2 and len(rc) == 2
    assert sorted(n.params["bytes"](B, S) for n in rc) == sorted(
        n.params["bytes"](B, S) for n in fwd)
    assert not any("fsdp" in n.tags for n in pb.backward.nodes if n.phase == Phase.RECOMPUTE)
    # Every recomputed matmul reads tensors of the backward graph or saved forward ones, never
    # a cast the recompute skipped: under fp8 its activation cast is re-run with it.
    made = {t for n in pb.backward.nodes if n.phase == Phase.RECOMPUTE for t in n.outputs}
    fwd_casts = {t for n in pb.forward.nodes if n.target == "pass:fp8" for t in n.outputs}
    for n in pb.backward.nodes:
        if n.phase == Phase.RECOMPUTE and n.kind == OpKind.GEMM:
            assert not (set(n.inputs) & fwd_casts), n.name
            if precision == "fp8":
                assert set(n.inputs) & made, n.name


def test_op_sac_without_sequence_parallelism_reruns_no_collective() -> None:
    """TP without SP all-reduces the partial sums (no gathers): op-SAC re-runs none of them."""
    pb = _op_sac_block(tp=2)
    assert [n for n in pb.forward.nodes if n.kind == OpKind.ALL_REDUCE and n.group == "tp"]
    assert not [n for n in pb.backward.nodes if n.phase == Phase.RECOMPUTE and n.is_comm]


def test_op_sac_with_tp_fp8_fsdp_keeps_backward_acyclic() -> None:
    """Forward-inserted tensors (casts, collectives) read by partially recomputed ops must not
    alias backward tensors with the same id (that wiring deadlocked the engine)."""
    import numpy as np

    from charon_search.sim.costing import CostedGraph
    from charon_search.sim.layer import layer_cost

    ctx = PassContext(tp=2, sequence_parallel=True, precision="fp8", zero_stage=3, dp=2,
                      recompute="selective", selective_policy="op", debug=True)
    pb = parallelize_block(synthetic_block("dense"), ctx)
    g = pb.backward
    seen = set(g.inputs)
    for n in g.nodes:
        assert all(t in seen for t in n.inputs), n.name
        seen |= set(n.outputs)
    dur = np.full(len(g.nodes), 1e-6)
    cg = CostedGraph(graph=g, durations_s=dur, provenance=("x",) * len(dur),
                     tiers=tuple("t" if n.is_comm else "" for n in g.nodes))
    assert layer_cost(cg).first.duration_s > 0


def test_fp8_rowwise_slower_forward_kernel_and_backward_rescale() -> None:
    # torchao rowwise: CUTLASS forward kernel at 0.95 of cuBLAS tensorwise (pytorch#147971:
    # "90-100%"), backward GEMMs as tensorwise cuBLAS + one rescale kernel each (pytorch/ao#1325)
    from charon_search.passes.fusion import ROWWISE_FWD_GEMM_EFFICIENCY

    assert ROWWISE_FWD_GEMM_EFFICIENCY == 0.95
    rw = parallelize_block(synthetic_block("dense"), PassContext(
        precision="fp8", fp8_recipe="rowwise", tp=2, sequence_parallel=True, debug=True))
    tw = parallelize_block(synthetic_block("dense"), PassContext(
        precision="fp8", fp8_recipe="tensorwise", tp=2, sequence_parallel=True, debug=True))
    fwd = [n for n in rw.forward.nodes if n.kind == OpKind.GEMM and n.dtype == "fp8"]
    assert len(fwd) == 7
    assert all(n.params["kernel_slowdown"].const_value() == pytest.approx(1 / 0.95)
               for n in fwd)
    assert not any("kernel_slowdown" in n.params for n in tw.forward.nodes)
    bwd_gemms = [n for n in rw.backward.nodes if n.kind == OpKind.GEMM and n.dtype == "fp8"]
    rescale = [n for n in rw.backward.nodes if n.name.startswith("fp8_rowwise_rescale_")]
    assert len(bwd_gemms) == 14 and len(rescale) == 14
    assert not any(n.name.startswith("fp8_rowwise_rescale_") for n in tw.backward.nodes)
    # one rescale per backward GEMM, reading and writing its bf16 output once
    for g in bwd_gemms:
        (r,) = [n for n in rescale if n.name == f"fp8_rowwise_rescale_{g.name}"]
        numel = r.params["numel"](2, 64)
        assert r.bytes_read(2, 64) == r.bytes_written(2, 64) == 2 * numel > 0


def _tp_comm(g: OpGraph, kind: OpKind) -> list[Node]:
    return [n for n in g.nodes if n.kind == kind and n.group == "tp"]


def test_fp8_rowwise_tp_gathers_bf16_then_quantizes_whole_tensorwise_gathers_fp8() -> None:
    # torchtitan parallelize_llama: float8 TP styles (fp8 all-gather) only for tensorwise;
    # "For rowwise recipes, we use regular TP and all-gather happens in high precision".
    def block(recipe: str | None):
        prec = "bf16" if recipe is None else "fp8"
        return parallelize_block(synthetic_block("dense"), PassContext(
            precision=prec, fp8_recipe=recipe or "tensorwise", tp=4, sequence_parallel=True,
            debug=True))

    bf, tw, rw = block(None), block("tensorwise"), block("rowwise")
    ag = {k: sum(n.params["bytes"](2, 64) for n in _tp_comm(pb.forward, OpKind.ALL_GATHER))
          for k, pb in (("bf", bf), ("tw", tw), ("rw", rw))}
    assert ag["tw"] == pytest.approx(ag["bf"] / 2)  # 1-byte fp8 vs 2-byte bf16 activations
    assert ag["rw"] == pytest.approx(ag["bf"])
    for pb in (rw,):
        for whole in (n for n in pb.forward.nodes if n.name.endswith("_gathered")):
            (shard,) = [n for n in pb.forward.nodes
                        if n.name == whole.name.removesuffix("_gathered")]
            # the shard cast costs 1/tp of the whole one, the gathered cast the other 3/4
            assert whole.bytes_read(2, 64) == pytest.approx(3 * shard.bytes_read(2, 64))
    assert not any(n.name.endswith("_gathered") for n in tw.forward.nodes)


def test_fp8_rowwise_rescale_keeps_partial_sums_no_extra_tp_collectives() -> None:
    # the rowwise output rescale is linear, so it runs on the local partial sum like a GEMM
    # epilogue: the backward has as many TP reduce-scatters as in bf16
    def rs(prec: str, recipe: str) -> int:
        pb = parallelize_block(synthetic_block("dense"), PassContext(
            precision=prec, fp8_recipe=recipe, tp=2, sequence_parallel=True, debug=True))
        return len(_tp_comm(pb.backward, OpKind.REDUCE_SCATTER))

    assert rs("fp8", "rowwise") == rs("bf16", "tensorwise") == rs("fp8", "tensorwise")


def test_fp8_keeps_grouped_gemm_offsets_and_ep_dispatches_the_activations() -> None:
    # The grouped GEMM's per-expert offsets (int32) are not quantized; the EP dispatch moves
    # the routed activations (tokens * top_k * hidden), the offsets only as a small exchange.
    from charon_search.catalog import load_model
    from charon_search.frontend import trace_model

    spec = load_model("debug-moe")
    block = trace_model(spec, phase="train", dtype="bf16").blocks["moe"]
    pb = parallelize_block(block, PassContext(precision="fp8", ep=2, debug=True))
    g = pb.forward
    for n in g.nodes:
        if n.name.startswith("fp8_quantize"):
            assert all(g.tensors[t].dtype != "int32" for t in n.inputs), n.name
    b, s = 2, 64
    routed = b * s * spec.num_experts_per_token * spec.hidden_size
    sizes = sorted(n.params["bytes"](b, s) for n in g.nodes if n.name.startswith("ep_dispatch"))
    # the bf16 activations (the cast to fp8 is part of the expert region, after the dispatch),
    # plus the small exchange of the int32 per-expert counts
    assert sizes[-1] == routed * 2
    assert sizes[:-1] == [spec.num_experts * 4]


@pytest.mark.parametrize("mode", ["pre", "post"])
def test_fsdp_backward_prefetch_post_exposes_each_all_gather(mode: str) -> None:
    """ZeRO-3 backward of a chain of layers whose compute C outlasts its all-gather a and
    reduce-scatter r: ``pre`` prefetches the next layer's all-gather, so a layer costs C;
    ``post`` (FSDP1 BACKWARD_POST) issues it after the layer's gradients, so every layer waits
    a + C, while the reduce-scatter queued behind that all-gather runs under the next compute."""
    import numpy as np

    from charon_search.sim.costing import CostedGraph
    from charon_search.sim.layer import chain_tasks, layer_cost

    ctx = PassContext(dp=8, zero_stage=3)
    g = parallelize_block(synthetic_block("dense"), ctx).backward
    comm = {n.kind for n in g.nodes if n.group == "dp"}
    assert comm == {OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER}
    a, r, c_node = 2e-3, 3e-3, 1e-3
    dur = np.array([a if n.kind == OpKind.ALL_GATHER else r if n.group == "dp" else c_node
                    for n in g.nodes])
    compute = c_node * sum(1 for n in g.nodes if n.group != "dp")
    assert compute > a + r
    cg = CostedGraph(graph=g, durations_s=dur, provenance=("x",) * len(dur),
                     tiers=tuple("t" if n.is_comm else "" for n in g.nodes))
    period = layer_cost(cg, fsdp_backward_prefetch=mode).period.duration_s
    assert period == pytest.approx(compute + (a if mode == "post" else 0.0))
    streams = {t.stream for t in chain_tasks(cg, 3, fsdp_backward_prefetch=mode)
               if t.group == "dp"}
    assert len(streams) == (1 if mode == "post" else 2)


def test_layout_rejects_unknown_fsdp_backward_prefetch() -> None:
    from charon_search.errors import ConfigError
    from charon_search.layout import Layout

    with pytest.raises(ConfigError, match="fsdp_backward_prefetch"):
        Layout.from_dict({"dp": 8, "zero_stage": 3, "fsdp_backward_prefetch": "early"})


def test_gpt_oss_expert_biases_are_not_sent_between_ep_ranks() -> None:
    """gpt-oss's experts add biases gathered by expert id (parameters the owning rank holds)
    and sum their clamped-SwiGLU gradient branches in residual-role adds. Under EP the forward
    still sends its routed rows once, the per-expert counts once (128 experts x int32) and
    combines the experts' output once; the backward sends the gradient rows in and the input
    gradient out (2 all-to-alls, not 8), not each bias gather, bias gradient or gradient add on
    its own: a bias gradient reduces into a fixed-size table on the rank that owns the expert."""
    from charon_search.catalog import load_model
    from charon_search.frontend import trace_model

    spec = load_model("gpt-oss-120b")
    traced = trace_model(spec, phase="train", dtype="bf16")
    block = traced.blocks[next(k for k in traced.blocks if k.startswith("moe"))]
    pb = parallelize_block(block, PassContext(ep=8, dp=16))
    b, s = 1, 4096
    rows = b * s * spec.num_experts_per_token * spec.hidden_size * 2  # bf16
    fwd = [(n.name.split("_")[1], float(n.params["bytes"](b, s)))
           for n in pb.forward.nodes if n.is_comm and n.group == "ep"]
    assert fwd == [("dispatch", rows), ("dispatch", 128 * 4), ("combine", rows)]
    bwd = [(n.name.split("_")[1], float(n.params["bytes"](b, s)))
           for n in pb.backward.nodes if n.is_comm and n.group == "ep"]
    assert bwd == [("dispatch", rows), ("combine", rows)]


def test_fp8_rowwise_sp_wgrad_casts_read_the_whole_gathered_tensor() -> None:
    # torchao matmul_with_hp_or_float8_args.backward casts the saved input and the incoming
    # grad_output along dim 0 from bf16; under torchtitan's plain TP + SP (rowwise) both are
    # the all-gathered tensors, so the wgrad cast of a sequence-sharded tensor is the whole
    # cast (as at tp=1), and a row GEMM's output gradient is gathered once for its wgrad cast
    # and its dgrad cast.
    def block(prec: str, tp: int):
        return parallelize_block(synthetic_block("dense"), PassContext(
            precision=prec, fp8_recipe="rowwise", tp=tp, sequence_parallel=tp > 1,
            debug=True))

    rw, one, bf = block("fp8", 4), block("fp8", 1), block("bf16", 4)
    whole = {n.name: n.bytes_read(2, 64) for n in one.backward.nodes
             if n.name.startswith("fp8_quantize_t")}
    casts = [n for n in rw.backward.nodes if n.name.startswith("fp8_quantize_t")]
    ratio = {n.name: n.bytes_read(2, 64) / whole[n.name] for n in casts}
    # the inputs of the column GEMMs (attention, MLP) and the output gradients of the row
    # GEMMs (attention out, MLP out) are sequence-sharded: cast whole; the rest feature-sharded
    assert sorted(ratio.values()) == pytest.approx([0.25] * (len(casts) - 4) + [1.0] * 4)
    producer = {o: n for n in rw.backward.nodes for o in n.outputs}
    grads = [n for n in casts if ratio[n.name] == 1.0
             and producer.get(n.inputs[0]) is not None
             and producer[n.inputs[0]].kind == OpKind.ALL_GATHER]
    assert len(grads) == 2  # attention out's and MLP out's output gradient
    # no extra collective: as many TP all-gathers in the backward as in bf16
    assert len(_tp_comm(rw.backward, OpKind.ALL_GATHER)) == \
        len(_tp_comm(bf.backward, OpKind.ALL_GATHER))


def test_fp8_rowwise_sp_routed_expert_wgrad_casts_are_not_gathered() -> None:
    # Routed experts run on the rank's own (sequence-sharded) tokens: their wgrad casts read
    # what the grouped GEMMs read, with no TP all-gather (only ColwiseParallel inputs and
    # RowwiseParallel output gradients are whole); the fp8 backward has bf16's TP all-gathers.
    def block(prec: str):
        return parallelize_block(synthetic_block("moe"), PassContext(
            precision=prec, fp8_recipe="rowwise", tp=2, ep=1, sequence_parallel=True,
            debug=True))

    rw, bf = block("fp8"), block("bf16")
    assert len(_tp_comm(rw.backward, OpKind.ALL_GATHER)) == \
        len(_tp_comm(bf.backward, OpKind.ALL_GATHER))
    producer = {o: n for n in rw.backward.nodes for o in n.outputs}
    expert_casts = [n for n in rw.backward.nodes if n.name.startswith("fp8_quantize_t")
                    and n.role == Role.MOE_EXPERT]
    assert expert_casts
    assert not any(producer.get(n.inputs[0]) is not None
                   and producer[n.inputs[0]].kind == OpKind.ALL_GATHER for n in expert_casts)


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed"])
def test_fp8_sp_wgrad_reads_a_transpose_of_the_gathered_fp8_tensor(recipe: str) -> None:
    # Per-tensor scales: the input (ColwiseParallel) and the output gradient (RowwiseParallel)
    # are gathered in fp8, and the weight gradient reads a transpose of the whole gathered fp8
    # tensor (1 B read + 1 B written per element), not a cast of the rank's sequence shard.
    def block(tp: int):
        return parallelize_block(synthetic_block("dense"), PassContext(
            precision="fp8", fp8_recipe=recipe, tp=tp, sequence_parallel=tp > 1, debug=True))

    tp4, one = block(4), block(1)
    numel = {n.name: float(n.params["numel"](2, 64)) for n in one.backward.nodes
             if n.name.startswith("fp8_quantize_t")}
    tr = [n for n in tp4.backward.nodes if n.name.startswith("fp8_transpose")]
    # attention and MLP input (q/k/v and gate/up share one copy), o_proj and down_proj grads
    assert len(tr) == 4
    for n in tr:
        full = numel[n.name.replace("fp8_transpose", "fp8_quantize_t", 1)]
        assert n.bytes_read(2, 64) == pytest.approx(full)
        assert n.bytes_written(2, 64) == pytest.approx(full)
    # block scales do not survive a transpose: no transposes there
    blockwise = parallelize_block(synthetic_block("dense"), PassContext(
        precision="fp8", fp8_recipe="blockwise", tp=4, sequence_parallel=True, debug=True))
    assert not [n for n in blockwise.backward.nodes if n.name.startswith("fp8_transpose")]
