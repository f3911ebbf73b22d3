"""TP/SP/CP/EP/recompute passes: collective volumes and FLOP invariants (synthetic blocks)."""

from __future__ import annotations

import itertools

import pytest

from charon_search.errors import ConfigError
from charon_search.ir import OpKind, check
from charon_search.passes import PassContext, parallelize_block, parallelize_inference
from charon_search.passes.base import FP8_DISPATCH_BYTES
from charon_search.passes.synthetic import synthetic_block, synthetic_model

H = 256
B, S = 2, 128
DTB = 2  # bf16


def _comm(pb, graph="both"):
    gs = [pb.forward, pb.backward] if graph == "both" else [getattr(pb, graph)]
    return [n for g in gs for n in g.nodes if n.is_comm]


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_volume_two_allreduces_each_way(tp: int) -> None:
    pb = parallelize_block(synthetic_block("dense"), PassContext(tp=tp, debug=True))
    for g in (pb.forward, pb.backward):
        comm = [n for n in g.nodes if n.is_comm]
        assert [n.kind for n in comm] == [OpKind.ALL_REDUCE] * 2
        for n in comm:
            assert n.params["bytes"](B, S) == B * S * H * DTB
            assert n.params["group_size"].const_value() == tp


def test_sp_same_bytes_as_ag_plus_rs() -> None:
    pb = parallelize_block(synthetic_block("dense"),
                           PassContext(tp=4, sequence_parallel=True, debug=True))
    for g in (pb.forward, pb.backward):
        kinds = sorted(n.kind.value for n in g.nodes if n.is_comm)
        assert kinds == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
        assert sum(n.params["bytes"](B, S) for n in g.nodes if n.is_comm) == 4 * B * S * H * DTB


def _flops(g) -> float:
    # Gradient-accumulation adds of TP partial sums (role "") run at full size on every TP
    # rank (duplicated work, as in Megatron); the invariant covers every other op.
    return sum(n.flops(B, S) for n in g.nodes if n.role != "")


def _ranks_flops(kind: str, tp: int, cp: int, ep: int) -> tuple[float, float]:
    blk = synthetic_block(kind)
    single = _flops(blk.forward) + _flops(blk.backward)
    ctx = PassContext(tp=tp, cp=cp, ep=ep, dp=max(ep, 1),
                      sequence_parallel=tp > 1, debug=True)
    pb = parallelize_block(blk, ctx)
    per_rank = _flops(pb.forward) + _flops(pb.backward)
    # EP ranks are data-parallel ranks: each processes its own tokens, so the tp·cp ranks of
    # one micro-batch together do its whole work.
    return single, per_rank * tp * cp


@pytest.mark.parametrize(("kind", "tp", "cp", "ep"), [
    (k, tp, cp, ep) for k, tp, cp, ep in itertools.product(
        ("dense", "moe", "embedding", "lm_head"), (1, 2, 4), (1, 2), (1, 4))
    if not (ep > 1 and k != "moe")])
def test_flops_summed_over_ranks_equal_single_device(kind: str, tp: int, cp: int,
                                                     ep: int) -> None:
    single, summed = _ranks_flops(kind, tp, cp, ep)
    assert summed == pytest.approx(single, rel=1e-9)


@pytest.mark.parametrize("algo", ["ring", "allgather", "ulysses"])
def test_cp_inserts_collectives(algo: str) -> None:
    pb = parallelize_block(synthetic_block("dense"),
                           PassContext(cp=4, cp_algo=algo, debug=True))
    comm = _comm(pb)
    assert comm and all(n.group == "cp" for n in comm)
    if algo == "ring":
        fwd = next(n for n in pb.forward.nodes if n.is_comm)
        # (cp-1) steps of the local K+V chunk: b · s/cp · kv_heads · 2·head_dim · 2 bytes.
        assert fwd.params["bytes"](B, S) == pytest.approx(3 * B * S / 4 * 4 * 2 * 32 * DTB)


def test_ep_alltoalls_and_imbalance() -> None:
    pb = parallelize_block(synthetic_block("moe"),
                           PassContext(ep=4, dp=4, expert_load_imbalance=1.3, debug=True))
    for g in (pb.forward, pb.backward):
        a2a = [n for n in g.nodes if n.kind == OpKind.ALL_TO_ALL]
        assert len(a2a) == 2
    gg = [n for n in pb.forward.nodes if n.kind == OpKind.GROUPED_GEMM]
    assert all(n.params["num_experts"].const_value() == 2 for n in gg)
    assert all(n.params["load_imbalance"].const_value() == 1.3 for n in gg)


def test_fp8_dispatch_halves_dispatch_bytes_and_keeps_combines_bf16() -> None:
    """DeepSeek-V3 report sec. 3.3.2: fp8 values plus one fp32 scale per 128 on the dispatch
    (forward) and on the all-to-all carrying gradients into the experts (backward); both
    combines move bf16."""
    blk = synthetic_block("moe")
    plain = parallelize_block(blk, PassContext(ep=4, dp=4, debug=True))
    fp8 = parallelize_block(blk, PassContext(ep=4, dp=4, ep_dispatch_bytes=FP8_DISPATCH_BYTES,
                                             debug=True))
    for g_plain, g_fp8 in ((plain.forward, fp8.forward), (plain.backward, fp8.backward)):
        by_name = {n.name: n.params["bytes"](B, S) for n in g_plain.nodes
                   if n.kind == OpKind.ALL_TO_ALL}
        for n in (n for n in g_fp8.nodes if n.kind == OpKind.ALL_TO_ALL):
            ratio = n.params["bytes"](B, S) / by_name[n.name]
            want = (1 + 4 / 128) / DTB if n.name.startswith("ep_dispatch") else 1.0
            assert ratio == pytest.approx(want, rel=1e-12), n.name


def test_recompute_adds_forward_flops() -> None:
    blk = synthetic_block("dense")
    none = parallelize_block(blk, PassContext(debug=True))
    full = parallelize_block(blk, PassContext(recompute="full", debug=True))
    sel = parallelize_block(blk, PassContext(recompute="selective", debug=True))
    f = blk.forward.total_flops(B, S)
    assert full.backward.total_flops(B, S) == pytest.approx(none.backward.total_flops(B, S) + f)
    attn = sum(n.flops(B, S) for n in blk.forward.nodes if n.kind == OpKind.ATTENTION)
    assert sel.backward.total_flops(B, S) == pytest.approx(
        none.backward.total_flops(B, S) + attn)
    check(full.backward)


def test_fsdp_gathers_and_scatters() -> None:
    pb = parallelize_block(synthetic_block("dense"),
                           PassContext(zero_stage=3, dp=8, tp=2, debug=True))
    f = [n.kind for n in pb.forward.nodes if n.group == "dp"]
    b = [n.kind for n in pb.backward.nodes if n.group == "dp"]
    assert f == [OpKind.ALL_GATHER]
    assert b == [OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER]


def test_full_recompute_under_fsdp_gathers_the_parameters_once() -> None:
    """FSDP + full activation recompute: the re-run forward uses the parameters the backward's
    own all-gather brought in (FSDP unshards once per backward), so the backward still moves
    one layer of parameters in (plus the TP all-reduces it re-runs) and its recomputed GEMMs
    wait for that all-gather."""
    ctx = dict(zero_stage=3, dp=8, tp=2, debug=True)
    pb = parallelize_block(synthetic_block("dense"), PassContext(recompute="full", **ctx))
    plain = parallelize_block(synthetic_block("dense"), PassContext(**ctx))
    b = [n for n in pb.backward.nodes if n.group == "dp"]
    assert [n.kind for n in b] == [OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER]
    fwd_ag = next(n for n in plain.forward.nodes if n.group == "dp")
    assert b[0].bytes(B, S) == pytest.approx(fwd_ag.bytes(B, S))
    ag_out = set(b[0].outputs)
    recomputed = [n for n in pb.backward.nodes
                  if "recompute" in n.tags and n.kind == OpKind.GEMM]
    assert recomputed and all(ag_out & set(n.inputs) for n in recomputed)
    check(pb.backward)


def test_parallelize_inference_shards_and_validates() -> None:
    m = synthetic_model(layer_types=("dense", "moe"), train=False)
    graphs = parallelize_inference(m, tp=2, ep=2)
    assert set(graphs) == {"embedding", "dense", "moe", "lm_head"}
    dense = graphs["dense"]
    assert dense.total_flops(1, 64) == pytest.approx(
        m.blocks["dense"].forward.total_flops(1, 64) / 2, rel=0.02)
    with pytest.raises(ConfigError):
        parallelize_inference(m, tp=0)
