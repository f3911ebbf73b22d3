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
    # Two equal prompts on two attention-DP ranks: one prompt's attention, not two.
    assert dep.prefill_attention_total_s([one, one]) == pytest.approx(one)
    # Three: the busier rank runs two of them; balanced placement bound = 1.5 (>= max chunk).
    assert dep.prefill_attention_total_s([one] * 3) == pytest.approx(1.5 * one)
    tep = GraphIterationCostModel(model, cluster, tp=2, ep=2, dp_attention=False)
    t = tep.prefill_attention_s(512, 512)
    assert tep.prefill_attention_total_s([t, t]) == pytest.approx(2 * t)
