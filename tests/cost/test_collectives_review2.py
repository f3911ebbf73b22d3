"""Second review of the collective model: PCIe boxes on their measured rows (F1), the slowest
group of an axis (F2), same-fabric GPU variants (F3), uneven domains (F4), the one-node tree
chain (F5), ``rdma`` KV transfer over the NIC (F6), the tier's fabric (F7) and the fit's
``x_scale`` (F9). Every expected number is a measured row or a closed-form α-β value."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from charon_search.cost import nccl_fit
from charon_search.cost.collectives import collective_time, estimate_collective, rank_domains
from charon_search.cost.measured_collectives import measured_floor_s, measured_nccl_s
from charon_search.hardware.loader import load_cluster
from charon_search.hardware.spec import ClusterSpec
from charon_search.serving.simulator import kv_transfer_s
from charon_search.sim.costing import GraphCoster, axis_strides
from charon_search.testing import toy_cluster

MIB = 2**20
GIB = 2**30
US = 1e-6


# ------------------------------------------------------------------ F1: PCIe boxes, measured rows
def test_l40s_tp8_all_reduce_is_the_measured_row() -> None:
    """aiconfigurator-core 0.12.0 l40s nccl_perf.parquet (NCCL 2.27.3): all_reduce over 8
    GPUs of 1 MiB took 863.2 us (the α-β line gave 119.1 us); 2 GPUs at 16 MiB 850.4 us is
    interpolated between the 16 MiB row itself."""
    cl = load_cluster("l40s-8gpu")
    assert cl.tiers[0].fabric == "pcie"
    assert measured_nccl_s("all_reduce", MIB, 8, cl) == pytest.approx(863.2e-6, rel=1e-9)
    assert measured_nccl_s("all_reduce", 64 * 1024, 8, cl) == pytest.approx(164.5e-6, rel=1e-9)
    # Strided groups on PCIe sit elsewhere than the measured GPUs 0..g-1: the model prices
    # them, never below the measured 2-GPU row they contain.
    assert measured_nccl_s("all_reduce", MIB, 2, cl, stride=4) is None
    floor = measured_floor_s("all_reduce", MIB, 2, cl, stride=4)
    assert floor == pytest.approx(measured_nccl_s("all_reduce", MIB, 2, cl), rel=1e-12)


def test_l20_inherits_the_l40s_rows() -> None:
    """l20-48gb.yaml: ``nccl_profile_gpu: l40s-48gb`` (no L20 rows are shipped)."""
    l20, l40s = load_cluster("l20-8gpu"), load_cluster("l40s-8gpu")
    assert l20.gpu.nccl_profile_gpu == "l40s-48gb"
    assert measured_nccl_s("all_gather", 16 * MIB, 8, l20) == pytest.approx(
        measured_nccl_s("all_gather", 16 * MIB, 8, l40s), rel=1e-12)
    assert measured_nccl_s("all_reduce", MIB, 8, l20) == pytest.approx(863.2e-6, rel=1e-9)


def test_serving_tp8_on_l40s_uses_the_row() -> None:
    """The serving graph cost (``graph_cost_fn``) prices a TP=8 all-reduce of 1 MiB at the
    measured 863.2 us."""
    from charon_search.ir import OpGraph
    from charon_search.serving.iteration_cost import graph_cost_fn
    from charon_search.testing import comm_node

    cost = graph_cost_fn(load_cluster("l40s-8gpu"))
    g = OpGraph(name="tp", nodes=(comm_node("all_reduce", MIB, 8),), tensors={})
    assert float(cost(g, 1, 1, 1)[0]) == pytest.approx(863.2e-6, rel=1e-9)


# --------------------------------------------------------------------- F2: the slowest group
def _nvl72_packed_full() -> ClusterSpec:
    """gb200-nvl72 with jobs filling all 72 GPUs of a rack (no ``job_devices``)."""
    cl = load_cluster("gb200-nvl72")
    return dataclasses.replace(cl, tiers=(dataclasses.replace(cl.tiers[0], job_devices=0),
                                          *cl.tiers[1:]))


def test_nvl72_ep32_all_to_all_prices_the_straddling_group() -> None:
    """EP=32 on 144 GB200s packed 72 per rack: group 64..95 holds 8 ranks in rack 0 and 24 in
    rack 1; a rank of the 8 sends 24/32 of its 256 MiB over its 400 Gb/s NIC: 24/32·S/(50e9·0.9)
    + α_pairwise 4.998 us + 24 peers · α_leaf 3 us + launch 7.6 us = 4.5585 ms (the group at
    rank 0: 0.431 ms on NVLink)."""
    cl = _nvl72_packed_full()
    s = 256 * MIB
    hand = 24 / 32 * s / 45e9 + 4.998 * US + 24 * 3 * US + 7.6 * US
    est = estimate_collective("all_to_all", s, 32, cl, world_size=144)
    assert est.duration_s == pytest.approx(hand, rel=1e-12)
    assert est.duration_s == pytest.approx(4.5585e-3, rel=1e-4)
    assert est.tiers == ("nvlink", "leaf")
    nvl = 31 / 32 * s / (900e9 * 0.69) + 4.998 * US + 7.6 * US
    assert collective_time("all_to_all", s, 32, cl) == pytest.approx(nvl, rel=1e-12)
    # a 64-GPU job never straddles: its groups are 0..31 and 32..63
    assert collective_time("all_to_all", s, 32, cl, world_size=64) == pytest.approx(nvl)


def test_nvl72_jobs_fill_64_gpus_per_rack() -> None:
    """Shipped gb200-nvl72 (``job_devices: 64``): racks hold 64 job ranks, a leaf of 8 racks
    512. EP=32 on 256 GPUs stays on NVLink (31/32·S/(900e9·0.69) + 4.998 + 7.6 us); the PP
    send/recv between stages of 32 ranks crosses a rack between stages 1 and 2:
    S/(50e9·0.9) + α_leaf 3 us + 7.6 us = 23.8716 ms; two stages (64 ranks) stay in the rack."""
    cl = load_cluster("gb200-nvl72")
    assert rank_domains(cl, 256) == (64, 512, 4096)
    s = 256 * MIB
    assert collective_time("all_to_all", s, 32, cl, world_size=256) == pytest.approx(
        31 / 32 * s / (900e9 * 0.69) + 4.998 * US + 7.6 * US, rel=1e-12)
    across = GIB / (50e9 * 0.9) + 3 * US + 7.6 * US
    assert collective_time("send_recv", GIB, 8, cl, stride=32, world_size=256) == \
        pytest.approx(across, rel=1e-12)  # a hop of the 8-stage pipeline
    assert across == pytest.approx(23.8716e-3, rel=1e-5)
    inside = GIB / (900e9 * 0.69) + 2.218 * US + 7.6 * US
    for world in (None, 64):
        assert collective_time("send_recv", GIB, 2, cl, stride=32, world_size=world) == \
            pytest.approx(inside, rel=1e-12)


def test_aligned_clusters_have_one_placement() -> None:
    """On a DGX H100 cluster (tiers 8 | 256 | 8192) every group of a power-of-two axis lies
    alike, so the job size changes nothing: TP=8 all-reduce of 64 MiB is the rank-0 group's."""
    cl = load_cluster("dgx-h100-ib400")
    for n, stride in ((8, 1), (16, 1), (64, 8), (2, 512)):
        assert collective_time("all_reduce", 64 * MIB, n, cl, stride=stride,
                               world_size=4096) == collective_time(
            "all_reduce", 64 * MIB, n, cl, stride=stride)


def test_world_size_is_checked() -> None:
    from charon_search.errors import ConfigError

    cl = load_cluster("h100-sxm-8gpu")
    with pytest.raises(ConfigError, match=r"`world_size` must be <= 8 .* but got 16"):
        collective_time("all_reduce", MIB, 8, cl, world_size=16)
    with pytest.raises(ConfigError, match=r"`world_size` must be a whole number >= 1"):
        estimate_collective("all_reduce", MIB, 8, cl, world_size=0)


def test_graph_coster_prices_the_slowest_group_of_the_job() -> None:
    """Given the job size (tp·cp·dp·pp), ``GraphCoster`` prices the PP send/recv of the
    DeepSeek-V3 GB200 layout (dp=32, pp=8: stages of 32 ranks, 64 per rack) for the pair
    across racks: S/(50e9·0.9) + 3 us + 7.6 us."""
    strides = axis_strides("tp-cp-ep-dp-pp", {"tp": 1, "cp": 1, "dp": 32, "pp": 8, "ep": 32})
    assert strides["pp"] == 32
    cl = load_cluster("gb200-nvl72")
    t, tier = GraphCoster(cl, None, strides=strides, world_size=256).collective(
        "send_recv", GIB, 8, "pp")  # a hop of the 8-stage pipeline
    assert t == pytest.approx(GIB / 45e9 + 3 * US + 7.6 * US, rel=1e-12)
    assert tier == "leaf"
    rank0, _ = GraphCoster(cl, None, strides=strides, world_size=32).collective(
        "send_recv", GIB, 2, "pp")
    assert rank0 == pytest.approx(GIB / (900e9 * 0.69) + 2.218 * US + 7.6 * US, rel=1e-12)


# ------------------------------------------------------------- F3: same-fabric GPU variants
@pytest.mark.parametrize(("cluster", "kind", "nbytes", "row_s"), [
    # a100_sxm nccl_perf.parquet: all_reduce 8 GPUs, 64 MiB, 0.5953 ms
    ("a100-40gb-roce1600", "all_reduce", 64 * MIB, 0.5953e-3),
    # h100_sxm nccl_perf.parquet: all_reduce 8 GPUs, 8 MiB, 78.91 us (the α-β line: 57.5 us)
    ("h100-96gb-grand-teton", "all_reduce", 8 * MIB, 78.91e-6),
    ("h20-8gpu", "all_reduce", 8 * MIB, 78.91e-6),
])
def test_same_fabric_variants_use_the_siblings_rows(cluster: str, kind: str, nbytes: float,
                                                     row_s: float) -> None:
    cl = load_cluster(cluster)
    assert cl.gpu.nccl_profile_gpu
    assert measured_nccl_s(kind, nbytes, 8, cl) == pytest.approx(row_s, rel=1e-3)


# --------------------------------------------------------------- F4: uneven domains (8 + 4)
def test_hierarchical_stage_sized_by_the_smallest_node() -> None:
    """dgx-h100-ib400, 1 GiB over 12 ranks = 8 + 4 GPUs. Hierarchical all-reduce: RS + AG in
    the 8-GPU node 2·(7/8·S/(450e9·0.75) + 7·0.8 us), then the 4-GPU node's ranks all-reduce
    their S/4 shards with the other node over 45 GB/s: 2·(1/2)·(S/4)/45e9 + 2·3 us. That is
    11.54 ms, slower than the ring (10.96 ms, which the model now picks)."""
    cl = load_cluster("dgx-h100-ib400")
    s = float(GIB)
    intra = 2 * (7 / 8 * s / (450e9 * 0.75) + 7 * 0.8 * US)
    inter = 2 * (1 / 2) * (s / 4) / 45e9 + 2 * 3 * US
    est = estimate_collective("all_reduce", s, 12, cl)
    cand = dict(est.candidates)
    assert cand["hierarchical"] == pytest.approx(intra + inter, rel=1e-12)
    assert est.algorithm == "ring"
    assert est.duration_s == pytest.approx(cand["ring"] + 4.5 * US, rel=1e-12)
    ag = dict(estimate_collective("all_gather", s, 12, cl).candidates)
    assert ag["hierarchical"] == pytest.approx(
        7 / 8 * s / (450e9 * 0.75) + 7 * 0.8 * US + (1 / 2) * (s / 4) / 45e9 + 3 * US,
        rel=1e-12)


# ------------------------------------------------------------------- F5: one-node tree chain
def test_single_tier_tree_is_a_chain_inside_one_node() -> None:
    """l20-8gpu (one PCIe node), 8 KiB all-reduce over 8 GPUs: the tree is a chain of 7 steps
    up and down, 2·S/(32e9·0.6) + 2·7·1.4 us = 20.45 us (not 2·log2(8)·1.4 us)."""
    cl = load_cluster("l20-8gpu")
    cand = dict(estimate_collective("all_reduce", 8192, 8, cl).candidates)
    assert cand["tree"] == pytest.approx(2 * 8192 / (32e9 * 0.6) + 2 * 7 * 1.4 * US, rel=1e-12)
    # A multi-node NVLink domain (NVL72: 72 GPUs, 4 per tray) keeps the binary tree there.
    g = load_cluster("gb200-nvl72")
    cand = dict(estimate_collective("all_reduce", 8192, 16, g).candidates)
    assert cand["tree"] == pytest.approx(2 * 8192 / (900e9 * 0.69) + 2 * 4 * 2.218 * US,
                                         rel=1e-12)


# ------------------------------------------------------------ F6: rdma KV over the NIC
def test_rdma_kv_transfer_leaves_the_nvl72_rack() -> None:
    """1 GiB of KV per GPU with ``kv_transfer="rdma"``: on GB200 over the 400 Gb/s NIC,
    S/(50e9·0.9) + 3 us + 7.6 us = 23.87 ms (it was the NVLink 1.74 ms); DGX H100 unchanged,
    S/(50e9·0.72) + 3 us + 4.5 us = 29.83 ms."""
    g = load_cluster("gb200-nvl72")
    assert kv_transfer_s(GIB, g, "rdma") == pytest.approx(GIB / 45e9 + 3 * US + 7.6 * US,
                                                          rel=1e-12)
    h = load_cluster("dgx-h100-ib400")
    assert kv_transfer_s(GIB, h, "rdma") == pytest.approx(GIB / 36e9 + 3 * US + 4.5 * US,
                                                          rel=1e-12)
    # toy cluster: nvlink (2 GPUs) + net: one node apart, as before
    t = toy_cluster()
    assert kv_transfer_s(GIB, t, "rdma") == pytest.approx(GIB / (50e9 * 0.9) + 5 * US,
                                                          rel=1e-12)


# --------------------------------------------------------------------- F7: the tier's fabric
def test_measured_rows_follow_the_fabric_not_the_name() -> None:
    """h100-sxm-8gpu with its tier renamed ``nvswitch`` (``fabric: nvlink`` kept): still the
    measured 78.91 us for 8 MiB over 8 GPUs; the same tier as ``network`` has no rows."""
    cl = load_cluster("h100-sxm-8gpu")
    renamed = dataclasses.replace(cl, tiers=(dataclasses.replace(cl.tiers[0], name="nvswitch"),))
    assert renamed.tiers[0].fabric == "nvlink"
    assert measured_nccl_s("all_reduce", 8 * MIB, 8, renamed) == pytest.approx(78.91e-6,
                                                                               rel=1e-3)
    net = dataclasses.replace(cl, tiers=(dataclasses.replace(cl.tiers[0], fabric="network"),))
    assert measured_nccl_s("all_reduce", 8 * MIB, 8, net) is None


# ------------------------------------------------------------------ F9: the fit's x_scale
def test_fit_passes_seconds_and_efficiency_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    """x_scale is 1e-5 for every time (launch, α) and 1.0 for the efficiency."""
    import scipy.optimize

    seen: list[np.ndarray] = []
    real = scipy.optimize.least_squares

    def spy(fun, x0, **kw):  # type: ignore[no-untyped-def]
        seen.append(np.asarray(kw["x_scale"], float))
        return real(fun, x0, **kw)

    monkeypatch.setattr(scipy.optimize, "least_squares", spy)
    cl = load_cluster("a100-sxm-8gpu")

    class _Table:
        def __init__(self, cols: dict) -> None:
            self.columns = cols

        def __len__(self) -> int:
            return len(self.columns["bytes"])

    class _DB:
        def table(self, gpu: str, kind: str) -> _Table | None:
            if kind != "all_gather":
                return None
            g = np.array([8.0] * 8)
            b = 2.0 ** np.arange(16, 24)
            t = np.array([collective_time("all_gather", x, 8, cl) for x in b])
            return _Table({"group_size": g, "bytes": b, "latency_s": t,
                           "num_nodes": np.ones(8), "variant": np.array([""] * 8, object),
                           "source": np.array(["synthetic"] * 8, object)})

    nccl_fit.fit_cluster_calibration(_DB(), "x", cl)
    nccl_fit.fit_cluster_calibration(_DB(), "x", cl, fit_launch=False)
    assert seen[0].tolist() == [1e-5, 1e-5, 1.0]
    assert seen[1].tolist() == [1e-5, 1.0]


# ------------------------------------------- send/recv hops inside their rings; small NVL72 jobs
def test_cp_ring_hops_stay_inside_their_blocks() -> None:
    """tp 4, cp 2, dp 2 on 8-GPU nodes (world 16): the CP rings are ranks (0, 4) and (8, 12),
    both inside a node, so a hop prices as NVLink; no real hop is (4, 8) across nodes. A
    pipeline of 2 stages at stride 8 does cross: (0, 8)."""
    cl = load_cluster("dgx-h100-ib400")
    hop = estimate_collective("send_recv", 8 * MIB, 2, cl, stride=4, world_size=16)
    assert hop.tiers == ("nvlink",)
    assert hop.duration_s == pytest.approx(
        collective_time("send_recv", 8 * MIB, 2, cl, stride=4), rel=1e-12)
    # a ring of 4 at stride 4 (ranks 0, 4, 8, 12) does hop across nodes: (4, 8)
    assert estimate_collective("send_recv", 8 * MIB, 4, cl, stride=4,
                               world_size=16).tiers == ("leaf",)
    assert estimate_collective("send_recv", 8 * MIB, 2, cl, stride=8,
                               world_size=16).tiers == ("leaf",)


def test_nvl72_job_of_one_rack_keeps_the_whole_rack() -> None:
    """``job_devices: 64`` packs jobs of several racks; a job of 72 GPUs (or a call without a
    job size, as serving makes) keeps the rack's 72 on NVLink."""
    cl = load_cluster("gb200-nvl72")
    assert rank_domains(cl, 72) == rank_domains(cl) == tuple(t.num_devices for t in cl.tiers)
    for world in (None, 72):
        assert estimate_collective("all_to_all", 64 * MIB, 72, cl,
                                   world_size=world).tiers == ("nvlink",)
    assert rank_domains(cl, 256)[0] == 64
