"""MoE communication under attention TP / attention DP: what inference engines send."""

from __future__ import annotations

import pytest

from charon_search.catalog import load_model
from charon_search.ir.ops import OpKind
from charon_search.serving.iteration_cost import GraphIterationCostModel


def _comm(cm: GraphIterationCostModel, kind: OpKind) -> list[str]:
    return [n.name for p in cm._decode_parts for n in p.linear.nodes if n.kind == kind]


def test_ep_dispatch_only_with_attention_dp() -> None:
    from charon_search.testing import toy_cluster

    model, cluster = load_model("debug-moe"), toy_cluster()
    tep = GraphIterationCostModel(model, cluster, tp=2, ep=2, dp_attention=False)
    dep = GraphIterationCostModel(model, cluster, tp=2, ep=2, dp_attention=True)
    # Attention TP: tokens are replicated, nothing is dispatched; the experts' partial outputs
    # are summed by one all-reduce per MoE layer (no shared experts in debug-moe).
    assert _comm(tep, OpKind.ALL_TO_ALL) == []
    assert sum(name.startswith("moe_ep_all_reduce") for name in _comm(tep, OpKind.ALL_REDUCE)) \
        == sum(1 for p in tep._decode_parts if any(
            n.kind == OpKind.GROUPED_GEMM for n in p.linear.nodes))
    # Attention DP: each rank sends its own tokens to the experts' ranks and back.
    assert len(_comm(dep, OpKind.ALL_TO_ALL)) >= 2


def test_deepseek_moe_layer_all_reduces_once_after_attention() -> None:
    from charon_search.hardware import load_cluster

    model, cluster = load_model("deepseek-v3"), load_cluster("h200-sxm-8gpu")
    for ep in (1, 8):  # expert TP8 (moe_tp 8) and expert parallel EP8, attention TP8
        cm = GraphIterationCostModel(model, cluster, tp=8, ep=ep, precision="fp8")
        moe = next(p for p in cm._decode_parts
                   if any(n.kind == OpKind.GROUPED_GEMM for n in p.linear.nodes))
        ars = [n.name for n in moe.linear.nodes if n.kind == OpKind.ALL_REDUCE]
        # Attention output + (shared + routed experts) output: the engines add the routed
        # partial sums to the shared experts' before their one all-reduce.
        assert len(ars) == 2, ars
        assert not [n for n in moe.linear.nodes if n.kind == OpKind.ALL_TO_ALL]


def test_attention_dp_ranks_run_prefill_attention_side_by_side() -> None:
    from charon_search.testing import toy_cluster

    model, cluster = load_model("debug-moe"), toy_cluster()
    dep = GraphIterationCostModel(model, cluster, tp=2, ep=2, dp_attention=True)
    one = dep.prefill_attention_s(512, 512)
    floor = dep.prefill_attention_s(1, 1)  # a kernel's fixed cost: one launch per rank
    assert 0 < floor < one
    # Two equal prompts on two attention-DP ranks: one prompt's attention, not two.
    assert dep.prefill_attention_total_s([one, one]) == pytest.approx(one)
    # Three: the busier rank runs two of them in one launch: balanced share of 3 prompts'
    # work above the floor plus one floor per rank = 1.5 x one - floor / 2 (>= max chunk).
    assert dep.prefill_attention_total_s([one] * 3) == pytest.approx(1.5 * one - floor / 2)
    tep = GraphIterationCostModel(model, cluster, tp=2, ep=2, dp_attention=False)
    t, floor = tep.prefill_attention_s(512, 512), tep.prefill_attention_s(1, 1)
    # Without attention DP both prompts go through one variable-length launch per kernel.
    assert tep.prefill_attention_total_s([t, t]) == pytest.approx(2 * t - floor)
    assert tep.prefill_attention_total_s([t]) == t
    # Many one-token prompts cost one floor each above the first, not a whole launch each.
    assert tep.prefill_attention_total_s([floor] * 50) == pytest.approx(floor)


def _moe_block(graphs: dict) -> object:
    return next(g for g in graphs.values()
                if any(n.kind == OpKind.GROUPED_GEMM for n in g.nodes))


@pytest.mark.parametrize("ep", [1, 2])
def test_expert_tp_under_attention_dp_gathers_the_ranks_tokens(ep: int) -> None:
    from charon_search.serving._graphs import serving_graphs

    # debug-moe: hidden 64, 8 experts of intermediate 32, top-2. Four attention-DP ranks with
    # EP `ep` leave MoE TP 4 / ep: each expert is split 4 / ep ways (vLLM DP without EP, TRT-LLM
    # moe_tp_size), every rank computes the rows of all four ranks' tokens routed to its experts.
    model = load_model("debug-moe")
    dp, moe_tp, b = 4, 4 // ep, 16
    _, dec = serving_graphs(model, tp=dp, pp=1, ep=ep, dp_attention=True, precision="bf16",
                            fused_kernels=False)
    _, one = serving_graphs(model, tp=1, pp=1, ep=1, dp_attention=False, precision="bf16",
                            fused_kernels=False)
    g, g1 = _moe_block(dec), _moe_block(one)
    experts = [n for n in g.nodes if n.kind == OpKind.GROUPED_GEMM]
    w13 = experts[0]
    assert w13.param("n")(b, 1, 100) == 2 * 32 / moe_tp  # gate+up columns / moe_tp
    assert w13.param("tokens")(b, 1, 100) == b * moe_tp
    # Total expert work is conserved: dp ranks x per-rank FLOPs = one GPU's FLOPs at dp x b.
    f = sum(n.flops(b, 1, 100) for n in experts)
    f1 = sum(n.flops(b, 1, 100) for n in g1.nodes if n.kind == OpKind.GROUPED_GEMM)
    assert f == pytest.approx(f1)  # (dp x b x top-2 rows) / dp ranks = b x top-2 per rank
    # One all-gather and one reduce-scatter of dp x b tokens x 64 hidden x bf16 over dp ranks,
    # instead of the expert-parallel all-to-alls.
    comm = [n for n in g.nodes if n.is_comm]
    assert [n.kind for n in comm] == [OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER]
    for n in comm:
        assert n.param("bytes")(b, 1, 100) == dp * b * 64 * 2
        assert n.param("group_size")(b, 1, 100) == dp


def test_expert_weights_divide_over_ep_times_moe_tp() -> None:
    from charon_search.memory import kv_cache_capacity
    from charon_search.memory.serving import moe_tp_degree
    from charon_search.testing import toy_cluster

    assert [moe_tp_degree(8, ep) for ep in (1, 2, 8, 16, 3)] == [8, 4, 1, 1, 1]
    model, cluster = load_model("debug-moe"), toy_cluster()

    def weights(**kw: int) -> float:
        return kv_cache_capacity(model, cluster, activation_bytes=0, cuda_graph_pool_bytes=0,
                                 **kw).weights_bytes

    # Expert TP and expert parallelism split the same expert bytes: 8 experts x 3 x 64 x 32.
    expert_bytes = 8 * 3 * 64 * 32 * 2
    assert weights(tp=4, ep=2) == pytest.approx(weights(tp=4, ep=4))
    assert weights(tp=4, ep=1) == pytest.approx(weights(tp=4, ep=4))
    # Attention DP: dense layers whole on each of the 4 ranks, experts split 4 ways.
    assert weights(tp=1, ep=1, moe_tp=4) == pytest.approx(weights(tp=1, ep=4))
    assert weights(tp=1, ep=1) - weights(tp=1, ep=1, moe_tp=4) == pytest.approx(
        expert_bytes * 3 / 4)
