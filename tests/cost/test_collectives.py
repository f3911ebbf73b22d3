"""Collective model: closed forms on one tier, tier selection from rank positions, hierarchical
bounds, monotonicity, send/recv across stages, contention, and measured NCCL bus bandwidths."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from charon_search.cost.collectives import (
    collective_bus_bandwidth,
    collective_time,
    estimate_collective,
    group_tiers,
)
from charon_search.errors import ConfigError
from charon_search.hardware import load_cluster
from charon_search.ir import OpKind
from charon_search.testing import TOY_CALIBRATION, toy_cluster

S = 1e9  # bytes
NVL = 450e9 * 0.8  # toy nvlink bandwidth x efficiency
NET = 50e9 * 0.9  # toy net bandwidth x efficiency
A_NVL, A_NET = 1e-6, 5e-6


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_closed_form_one_tier(n: int) -> None:
    cluster = toy_cluster(gpus_per_node=n)
    t = collective_time(OpKind.ALL_REDUCE, S, n, cluster, algo="ring")
    assert t == pytest.approx(2 * (n - 1) / n * S / NVL + 2 * (n - 1) * A_NVL, rel=1e-12)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_ring_gather_scatter_closed_form(kind: str) -> None:
    n = 8
    t = collective_time(kind, S, n, toy_cluster(gpus_per_node=n))
    assert t == pytest.approx((n - 1) / n * S / NVL + (n - 1) * A_NVL, rel=1e-12)


def test_tree_and_all_to_all_closed_forms_one_tier() -> None:
    n = 8
    c = toy_cluster(gpus_per_node=n)
    tree = collective_time("all_reduce", S, n, c, algo="tree")
    # one node: NCCL's tree is a chain there, n - 1 steps up and down
    assert tree == pytest.approx(2 * S / NVL + 2 * (n - 1) * A_NVL, rel=1e-12)
    a2a = collective_time("all_to_all", S, n, c)
    # inside one NVLink tier every peer's send is in flight at once: one α, not n - 1
    assert a2a == pytest.approx((n - 1) / n * S / NVL + A_NVL, rel=1e-12)


def test_all_to_all_latency_inside_nvl72_does_not_grow_with_the_peers() -> None:
    # GB300 NVL72, 512 B: EP 32 and EP 4 differ only by the (tiny) bytes term, while the
    # network tier still pays one α per peer (EP 16 over two 8-GPU DGX H100 nodes: 8 remote
    # peers).
    gb = load_cluster("gb300-nvl72")
    small = {n: collective_time("all_to_all", 512, n, gb) for n in (4, 32)}
    assert small[32] - small[4] < 0.01e-6
    assert small[4] == pytest.approx(gb.calibration.collective_launch_s
                                     + gb.calibration.collective_alpha_s["nvlink.pairwise"],
                                     rel=1e-3)
    h = load_cluster("dgx-h100-ib400")
    cal = h.calibration
    two_nodes = collective_time("all_to_all", 512, 16, h)
    net_alpha = cal.collective_alpha_s.get(f"{h.tiers[1].name}.pairwise",
                                           cal.collective_alpha_s[h.tiers[1].name])
    assert two_nodes > cal.collective_launch_s + 8 * net_alpha


def test_small_messages_pick_tree_large_pick_ring() -> None:
    c = toy_cluster(num_nodes=8, gpus_per_node=1)  # one rank per node: a binary tree
    assert estimate_collective("all_reduce", 1e3, 8, c).algorithm == "tree"  # 6α < 14α
    assert estimate_collective("all_reduce", S, 8, c).algorithm == "ring"


def test_launch_cost_added_once() -> None:
    cal = dataclasses.replace(TOY_CALIBRATION, collective_launch_s=3e-6)
    base = collective_time("all_reduce", S, 2, toy_cluster(), algo="ring")
    assert collective_time("all_reduce", S, 2, toy_cluster(calibration=cal),
                           algo="ring") == pytest.approx(base + 3e-6, rel=1e-12)


def test_uncalibrated_tier_uses_spec_latency_and_full_bandwidth() -> None:
    cal = dataclasses.replace(TOY_CALIBRATION, collective_alpha_s={},
                              collective_bw_efficiency={})
    t = collective_time("all_reduce", S, 2, toy_cluster(calibration=cal), algo="ring")
    assert t == pytest.approx(S / 450e9 + 2 * 1e-6, rel=1e-12)  # tier latency 1 µs


# ------------------------------------------------------------------ which tiers a group spans
def test_tiers_from_rank_positions() -> None:
    c = load_cluster("dgx-h100-ib400")  # nvlink 8, leaf 256, spine 8192
    assert group_tiers(8, c) == ("nvlink",)  # TP=8
    assert group_tiers(16, c) == ("nvlink", "leaf")
    assert group_tiers(32, c, stride=8) == ("leaf",)  # DP over 32 nodes of one SU
    assert group_tiers(64, c, stride=8) == ("leaf", "spine")
    assert group_tiers(4, c, stride=2) == ("nvlink",)
    g = load_cluster("gb200-nvl72")  # nvlink 72 (a job of several racks fills 64 of each)
    assert group_tiers(72, g) == ("nvlink",)
    assert group_tiers(64, g, stride=1) == ("nvlink",)
    assert group_tiers(4, g, stride=64) == ("nvlink", "leaf")  # ranks 0, 64 | 128 | 192


def test_tp_group_stays_on_nvlink_and_dp_group_crosses_nodes() -> None:
    c = load_cluster("dgx-h100-ib400")
    tp = estimate_collective("all_reduce", 64e6, 8, c)
    dp = estimate_collective("all_reduce", 64e6, 8, c, stride=8)
    assert tp.tiers == ("nvlink",) and dp.tiers == ("leaf",)
    assert dp.duration_s > 5 * tp.duration_s  # 50 GB/s NIC vs 450 GB/s NVLink


# ------------------------------------------------------------------ hierarchical, multi-tier
def test_hierarchical_closed_form_on_toy() -> None:
    c = toy_cluster()  # 2 nodes x 2 GPUs
    t = collective_time("all_reduce", S, 4, c, algo="hierarchical")
    rs_ag = 2 * (0.5 * S / NVL + A_NVL)  # RS + AG inside the node (2 ranks, S bytes)
    top = min(S / 2 / NET + 2 * A_NET,  # ring of 2 node leaders on S/2
              2 * (S / 2) / NET + 2 * A_NET)  # tree
    assert t == pytest.approx(rs_ag + top, rel=1e-12)


@pytest.mark.parametrize(("cluster_name", "n", "stride"),
                         [("toy", 4, 1), ("dgx-h100-ib400", 64, 1), ("dgx-h100-ib400", 512, 4),
                          ("h100-roce-24k", 4096, 1), ("gb200-nvl72", 144, 1)])
def test_hierarchical_not_below_flat_bottleneck_bound(cluster_name: str, n: int,
                                                      stride: int) -> None:
    """No algorithm beats the data each boundary must carry: inside the innermost domain a
    ring over its k ranks moves 2(k-1)/k·S per rank; across it, each of the m domains moves
    2(m-1)/m·S through its k links at best the fastest crossed tier's bandwidth."""
    c = toy_cluster() if cluster_name == "toy" else load_cluster(cluster_name)
    est = estimate_collective("all_reduce", S, n, c, stride=stride)
    hier = collective_time("all_reduce", S, n, c, stride=stride, algo="hierarchical")
    eff = c.calibration.collective_bw_efficiency
    inner = c.tiers[0]
    k = len({r for r in range(0, n * stride, stride) if r < inner.num_devices})
    m = n // k
    intra = 2 * (k - 1) / k * S / (inner.bandwidth_bytes_per_s * eff[inner.name])
    fastest_net = max(t.bandwidth_bytes_per_s * eff[t.name] for t in c.tiers[1:]
                      if t.name in est.tiers)
    cross = 2 * (m - 1) / m * S / (k * fastest_net)
    assert m > 1 and hier >= max(intra, cross) > 0
    assert est.duration_s <= hier  # the default picks the fastest candidate
    for algo, t in est.candidates:
        assert t >= cross, algo


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                  "send_recv"])
@pytest.mark.parametrize(("cluster_name", "n", "stride"),
                         [("h100-sxm-8gpu", 8, 1), ("dgx-h100-ib400", 64, 8),
                          ("h100-roce-24k", 8192, 1), ("gb200-nvl72", 256, 1),
                          ("l40s-8gpu", 4, 2)])
def test_monotone_in_bytes(kind: str, cluster_name: str, n: int, stride: int) -> None:
    c = load_cluster(cluster_name)
    times = [collective_time(kind, 2.0**e, n, c, stride=stride) for e in range(4, 34, 2)]
    assert all(b > a for a, b in itertools.pairwise(times)), times


def test_all_to_all_multi_tier_closed_form() -> None:
    # 4 ranks on 2 nodes: 1 peer over NVLink, 2 peers over the network.
    t = collective_time("all_to_all", S, 4, toy_cluster())
    assert t == pytest.approx(max(S / 4 / NVL, S * 2 / 4 / NET) + A_NVL + 2 * A_NET, rel=1e-12)


# ------------------------------------------------------------------ send/recv between stages
def test_send_recv_is_alpha_plus_bytes_over_crossing_tier() -> None:
    c = toy_cluster()
    # PP neighbours 2 ranks apart sit on different nodes: the network tier.
    assert collective_time("send_recv", S, 2, c, stride=2) == pytest.approx(A_NET + S / NET)
    # Neighbours inside a node: NVLink.
    assert collective_time("send_recv", S, 2, c, stride=1) == pytest.approx(A_NVL + S / NVL)
    # group_size beyond 2 is still one transfer between r and r + stride.
    assert collective_time("send_recv", S, 4, c, stride=2) == pytest.approx(A_NET + S / NET)


# ------------------------------------------------------------------ contention
def test_oversubscribed_tier_slows_down_with_concurrent_groups() -> None:
    c = load_cluster("h100-roce-24k")  # 1:7 above 3,072-GPU pods
    alone = collective_time("all_to_all", 256e6, 8, c, stride=3072)
    busy = collective_time("all_to_all", 256e6, 8, c, stride=3072, concurrent_groups=3072)
    # 3,072 groups share the pod uplinks, 1/7 of the pod's NIC capacity.
    assert busy > 5 * alone
    # A non-blocking fabric does not care.
    d = load_cluster("dgx-h100-ib400")
    assert collective_time("all_to_all", 256e6, 8, d, stride=1024, concurrent_groups=1024) == \
        pytest.approx(collective_time("all_to_all", 256e6, 8, d, stride=1024))


def test_pod_uplink_share_closed_form() -> None:
    c = load_cluster("h100-roce-24k")
    eff, bw = c.calibration.collective_bw_efficiency["cluster"], 50e9
    alpha = c.calibration.collective_alpha_s["cluster"]
    launch = c.calibration.collective_launch_s
    # send/recv from pod 0 to pod 1 while all 3,072 GPUs of the pod send: bw·3072/(7·3072).
    t = collective_time("send_recv", S, 2, c, stride=3072, concurrent_groups=3072)
    assert t == pytest.approx(launch + alpha + S / (bw * eff / 7), rel=1e-12)


# ------------------------------------------------------------------ measured NCCL bus bandwidth
def test_h100_node_bus_bandwidth_matches_measurement() -> None:
    """aiconfigurator-core 0.12.0, systems/data/h100_sxm/comm/nccl/2.29.2/nccl_perf.parquet,
    8x H100, 268,435,456 half elements (537 MB): all_reduce 2.11 ms = 445 GB/s bus bandwidth,
    all_gather 1.40 ms = 335 GB/s. The defaults were fitted to these rows, so this guards the
    NVLS / ring formulas and the YAML values together (5 %)."""
    c = load_cluster("h100-sxm-8gpu")
    nbytes = 268435456 * 2
    ar = estimate_collective("all_reduce", nbytes, 8, c)
    assert ar.algorithm == "nvls"
    assert ar.duration_s == pytest.approx(2.11e-3, rel=0.05)
    assert collective_bus_bandwidth("all_reduce", nbytes, 8, c) == pytest.approx(445e9, rel=0.05)
    assert collective_time("all_gather", nbytes, 8, c) == pytest.approx(1.40e-3, rel=0.05)
    # Small messages: all_gather of 512 B on 8 GPUs measured 10.1 us.
    assert collective_time("all_gather", 512, 8, c) == pytest.approx(10.1e-6, rel=0.1)


def test_ring_bus_bandwidth_approaches_link_bandwidth() -> None:
    c = toy_cluster(gpus_per_node=8)
    busbw = collective_bus_bandwidth("all_reduce", 1e12, 8, c, algo="ring")
    assert busbw == pytest.approx(NVL, rel=1e-4)


# ------------------------------------------------------------------ edge cases and errors
def test_trivial_groups_cost_nothing() -> None:
    c = toy_cluster()
    assert collective_time("all_reduce", S, 1, c) == 0.0
    assert collective_time("all_reduce", 0, 4, c) == 0.0


def test_errors_name_the_rule() -> None:
    c = toy_cluster()
    with pytest.raises(ConfigError, match="collective kind must be one of"):
        collective_time("gemm", S, 2, c)
    with pytest.raises(ConfigError, match="spans 7 ranks, but cluster toy has 4"):
        collective_time("all_reduce", S, 4, c, stride=2)
    with pytest.raises(ConfigError, match=r"algorithm 'nvls' is not available.*available"):
        collective_time("all_reduce", S, 2, c, algo="nvls")
    with pytest.raises(ConfigError, match="nbytes >= 0"):
        collective_time("all_reduce", -1, 2, c)


def test_fast_path_equals_estimate(rng) -> None:  # type: ignore[no-untyped-def]
    """collective_time's per-shape affine cache gives the same seconds as the full estimate
    (and as a fresh evaluation of the formulas at that size)."""
    from charon_search.cost import collectives

    c = load_cluster("h100-roce-24k")
    kinds = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
    for _ in range(200):
        kind = kinds[rng.integers(len(kinds))]
        n = int(2 ** rng.integers(1, 12))
        stride = int(2 ** rng.integers(0, 14 - int(math.log2(n))))
        nbytes = float(10 ** rng.uniform(2, 10))
        cg = int(2 ** rng.integers(0, 8))
        t = collective_time(kind, nbytes, n, c, stride=stride, concurrent_groups=cg)
        est = estimate_collective(kind, nbytes, n, c, stride=stride, concurrent_groups=cg)
        assert t == pytest.approx(est.duration_s, rel=1e-12)
        ctx = collectives._context(c, 2 if kind == "send_recv" else n, stride, cg)
        direct = min(v for v, _ in ctx._candidates(OpKind(kind), nbytes,
                                                   2 if kind == "send_recv" else n).values())
        assert t == pytest.approx(direct + c.calibration.collective_launch_s, rel=1e-9)
