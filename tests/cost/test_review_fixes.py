"""Cost-model review fixes (/tmp/review_cost/findings.md 1, 2, 4, 5, 10): the floor where measured
NCCL rows meet the α-β model, NCCL's tree / ring latency across tiers, fp32 / tf32 matmuls at
their own peak, one rule for fp4 without FP4 tensor cores, and input / spec checks.

Every expected number is written out with the arithmetic that gives it."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from charon_search.cost.base import ShapePoint
from charon_search.cost.collectives import collective_time, estimate_collective
from charon_search.cost.measured_collectives import (
    cost_model_nccl_floor_s,
    measured_floor_s,
    measured_nccl_s,
)
from charon_search.cost.roofline import node_compute_efficiency
from charon_search.cost.selector import FusedCostModel
from charon_search.errors import ConfigError
from charon_search.hardware import gpu_from_dict, load_cluster, load_gpu
from charon_search.hardware.spec import GpuSpec
from charon_search.testing import gemm_node, toy_cluster

US = 1e-6
MIB = 2**20
SPECS = Path(__file__).resolve().parents[2] / "charon_search" / "cluster_specs"


def _site(cl: Any, kind: str, nbytes: float, n: int, stride: int = 1) -> float:
    """What the call sites do (``sim/costing.GraphCoster.collective``,
    ``serving/iteration_cost._comm``): the measured rows where they cover the group, else the
    α-β model no lower than the floor."""
    m = measured_nccl_s(kind, nbytes, n, cl, stride=stride)
    if m is not None:
        return m
    model = estimate_collective(kind, nbytes, n, cl, stride=stride).duration_s
    return max(model, measured_floor_s(kind, nbytes, n, cl, stride=stride) or 0.0)


# ------------------------------------------------------------------ 1. measured / model seam
def test_two_node_all_reduce_is_floored_at_the_measured_node() -> None:
    """16 H100s over 2 nodes, 16 MiB: the model says 121.1 us, the measured 8-GPU row 121.9
    us; the 16-rank group contains that 8-rank one, so the floor is the 8-GPU row itself."""
    h = load_cluster("dgx-h100-ib400")
    eight = measured_nccl_s("all_reduce", 16 * MIB, 8, h)
    assert eight == pytest.approx(121.9 * US, rel=1e-3)
    assert measured_floor_s("all_reduce", 16 * MIB, 16, h) == pytest.approx(eight, rel=1e-12)
    assert _site(h, "all_reduce", 16 * MIB, 16) >= eight
    # the 4-GPU row (99.0 us) is also contained, and lower
    assert measured_nccl_s("all_reduce", 16 * MIB, 4, h) == pytest.approx(99.0 * US, rel=1e-3)


def test_unmeasured_sizes_inside_a_node_cost_at_least_the_measured_four() -> None:
    """6 H100s in one node, 16 MiB: model (NVLS) 90.5 us < measured 4-GPU 99.0 us; the floor
    makes it 99.0 us, and 5 and 7 ranks likewise."""
    h = load_cluster("dgx-h100-ib400")
    four = measured_nccl_s("all_reduce", 16 * MIB, 4, h)
    assert estimate_collective("all_reduce", 16 * MIB, 6, h).duration_s == pytest.approx(
        90.5 * US, rel=2e-3)
    for n in (5, 6, 7):
        assert measured_nccl_s("all_reduce", 16 * MIB, n, h) is None  # not measured
        assert measured_floor_s("all_reduce", 16 * MIB, n, h) == pytest.approx(four)
        assert _site(h, "all_reduce", 16 * MIB, n) == pytest.approx(99.0 * US, rel=1e-3)


def test_nvl72_groups_across_trays_cost_at_least_the_measured_tray() -> None:
    """GB200 NVL72, 16 MiB all-reduce: measured TP4 in a tray 100.2 us; the model gives TP8
    over two trays 69.3 us and the same 4 ranks on 4 trays (stride 4) 61.4 us. Every GPU
    reaches the NVSwitch over the same links, so both are floored at the tray's 100.2 us."""
    g = load_cluster("gb200-nvl72")
    tray = measured_nccl_s("all_reduce", 16 * MIB, 4, g)
    assert tray == pytest.approx(100.2 * US, rel=1e-3)
    assert measured_nccl_s("all_reduce", 16 * MIB, 8, g) is None
    assert estimate_collective("all_reduce", 16 * MIB, 8, g).duration_s == pytest.approx(
        69.3 * US, rel=2e-3)
    assert _site(g, "all_reduce", 16 * MIB, 8) == pytest.approx(tray)
    assert measured_nccl_s("all_reduce", 16 * MIB, 4, g, stride=4) is None
    assert _site(g, "all_reduce", 16 * MIB, 4, stride=4) == pytest.approx(tray)
    # all-gather: TP4 59.2 us measured, TP8 model 46.8 us -> 59.2 us
    assert _site(g, "all_gather", 16 * MIB, 8) == pytest.approx(59.2 * US, rel=1e-3)


@pytest.mark.parametrize("cluster", ["dgx-h100-ib400", "gb200-nvl72", "dgx-b200-ib400",
                                     "a100-80gb-roce1600"])
def test_no_model_priced_group_beats_a_measured_group_it_contains(cluster: str) -> None:
    """Scan: every group the model prices (5-32 ranks, or a 4-rank group strided across NVL72
    trays) costs at least each measured 2/4/8-rank group at the same bytes. Without the floor
    this fails on every one of these clusters (e.g. H100 16 ranks at 64 KiB)."""
    cl = load_cluster(cluster)
    gpn = cl.gpus_per_node
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for e in range(6, 31, 3):
            s = 2.0**e
            for g in (2, 4, 8):
                meas = measured_nccl_s(kind, s, g, cl)
                if meas is None:
                    continue
                shapes = [(n, 1) for n in range(g + 1, 33)]
                if cl.tiers[0].num_devices > gpn:
                    shapes.append((g, gpn))
                for n, stride in shapes:
                    if measured_nccl_s(kind, s, n, cl, stride=stride) is not None:
                        continue  # measured against measured: the rows stand
                    assert _site(cl, kind, s, n, stride) >= meas * (1 - 1e-12), (kind, e, g, n)


def test_floor_needs_profile_use_and_nvlink() -> None:
    h = load_cluster("dgx-h100-ib400")
    model = FusedCostModel(h)
    assert cost_model_nccl_floor_s(model, "all_reduce", 16 * MIB, 16, h) == pytest.approx(
        measured_nccl_s("all_reduce", 16 * MIB, 8, h))
    no_profile = FusedCostModel(h, use_profile=False)
    assert cost_model_nccl_floor_s(no_profile, "all_reduce", 16 * MIB, 16, h) == 0.0
    # one rank per node (stride 8): no two ranks share an NVSwitch, nothing measured applies
    assert measured_floor_s("all_reduce", 16 * MIB, 16, h, stride=8) is None
    # PCIe box: the measured 8-GPU row (19.376 ms at 16 MiB) bounds a larger group
    assert measured_floor_s("all_reduce", 16 * MIB, 16, load_cluster("l40s-8gpu")) == \
        pytest.approx(19.376e-3)
    assert measured_floor_s("send_recv", 16 * MIB, 16, h) is None


# ------------------------------------------------------------------ 2. NCCL tree / ring latency
def _candidates(cl: Any, kind: str, nbytes: float, n: int, **kw: Any) -> dict[str, float]:
    return dict(estimate_collective(kind, nbytes, n, cl, **kw).candidates)


def test_two_node_tree_is_a_chain_inside_the_node() -> None:
    """dgx-h100-ib400, 64 B, 16 ranks on 2 nodes (α nvlink 0.8 us, leaf 3.0 us, launch
    4.5 us). NCCL: tree 2·((16/2 − 1)·0.8 + log2(2)·3.0) = 17.2 us (was 2·(3·0.8 + 3.0) =
    10.8 us); ring (30 − 2·2)·0.8 + 2·2·3.0 = 32.8 us (was 30·3.0 = 90 us)."""
    h = load_cluster("dgx-h100-ib400")
    c = _candidates(h, "all_reduce", 64, 16)
    assert c["tree"] == pytest.approx(17.2 * US, abs=0.01 * US)
    assert c["ring"] == pytest.approx(32.8 * US, abs=0.01 * US)
    t = estimate_collective("all_reduce", 64, 16, h)
    assert t.duration_s == pytest.approx(21.7 * US, abs=0.01 * US)
    # now dearer than the one-node all-reduce (ring 2·7·0.8 = 11.2 us + 4.5 = 15.7 us)
    assert estimate_collective("all_reduce", 64, 8, h).duration_s == pytest.approx(
        15.7 * US, abs=0.01 * US)
    # all-gather ring: (15 − 1)·0.8 + (2 − 1)·3.0 = 14.2 us
    assert _candidates(h, "all_gather", 64, 16)["ring"] == pytest.approx(14.2 * US,
                                                                           abs=0.01 * US)


def test_three_tier_tree_and_ring_latency() -> None:
    """512 ranks on dgx-h100-ib400 (8 per node, 256 per leaf, α spine 3.5 us), 64 B.
    Tree: 2·(7·0.8 + log2(32)·3.0 + log2(2)·3.5) = 48.2 us. Ring: one trip crosses 64 node
    boundaries, 2 of them leaf boundaries; two trips: 4 spine steps, 2·(64 − 2) = 124 leaf
    steps, 1022 − 128 = 894 NVLink steps: 894·0.8 + 124·3.0 + 4·3.5 = 1101.2 us."""
    h = load_cluster("dgx-h100-ib400")
    c = _candidates(h, "all_reduce", 64, 512)
    assert c["tree"] == pytest.approx(48.2 * US, abs=0.01 * US)
    assert c["ring"] == pytest.approx(1101.2 * US, abs=0.01 * US)


def test_nvl72_domain_is_not_a_chain() -> None:
    """Two GB200 NVL72 racks (144 ranks, no job size: whole racks), 64 B: the NVLink domain
    spans 18 trays, where NCCL runs NVLS(-tree), not a 71-step chain; the tree keeps
    2·(ceil(log2 72)·2.218 + log2(2)·3.0) = 37.05 us (a chain would be 2·(71·2.218 + 3.0) =
    320.96 us)."""
    g = load_cluster("gb200-nvl72")
    assert _candidates(g, "all_reduce", 64, 144)["tree"] == pytest.approx(37.05 * US,
                                                                          abs=0.01 * US)


def test_single_tier_tree_unchanged() -> None:
    """One tier: still 2·ceil(log2 n)·α (the fitted calibrations were fitted with it).
    GB200 NVL72 TP8 at 64 B: 2·3·2.218 = 13.308 us."""
    g = load_cluster("gb200-nvl72")
    assert _candidates(g, "all_reduce", 64, 8)["tree"] == pytest.approx(13.308 * US,
                                                                        abs=0.01 * US)


# ------------------------------------------------------------------ 4. fp32 / tf32 matmuls
@pytest.mark.parametrize("gpu", ["h100-sxm-80gb", "h800-sxm-80gb"])
def test_fp32_and_tf32_gemms_run_at_their_own_peak(gpu: str) -> None:
    """4096^3 = 1.374e11 FLOP. fp32 (PyTorch's default, no TF32): /(67e12·0.7) + 4 us =
    2934.5 us on H100 (which has bf16 rows) as on H800 (which has none); tf32:
    /(494.5e12·0.7) + 4 us = 401.0 us. bf16 rows gave H100 166 us (828 TFLOP/s)."""
    fm = FusedCostModel(toy_cluster(gpu=gpu))
    fp32 = fm.cost(gemm_node(4096, 4096, 4096, dtype="fp32"), ShapePoint(1, 1, 1))
    assert fp32.provenance == "roofline"
    assert fp32.duration_s == pytest.approx(2 * 4096**3 / (67e12 * 0.7) + 4 * US, rel=1e-9)
    assert fp32.duration_s == pytest.approx(2934.5 * US, rel=1e-4)
    tf32 = fm.cost(gemm_node(4096, 4096, 4096, dtype="tf32"), ShapePoint(1, 1, 1))
    assert tf32.duration_s == pytest.approx(401.0 * US, rel=1e-3)
    # never faster than the spec's peak
    assert 2 * 4096**3 / fp32.duration_s <= 67e12


def test_an_fp32_router_gemm_keeps_the_bf16_rows() -> None:
    """HF's DeepSeek-V3 code upcasts the router GEMM (8192 tokens x 7168 -> 256 experts) to
    fp32; the engines and Megatron run it on bf16 inputs, so it is priced as the bf16 one."""
    from charon_search.ir.ops import Role

    fm = FusedCostModel(toy_cluster(gpu="h100-sxm-80gb"))
    bf16 = fm.cost(gemm_node(8192, 256, 7168).replace(role=Role.MOE_ROUTER),
                   ShapePoint(1, 1, 1))
    fp32 = fm.cost(gemm_node(8192, 256, 7168, dtype="fp32").replace(role=Role.MOE_ROUTER),
                   ShapePoint(1, 1, 1))
    assert fp32.provenance != "roofline"
    assert fp32.duration_s < 2 * 8192 * 256 * 7168 / 67e12  # faster than the fp32 peak allows
    assert fp32.duration_s == pytest.approx(bf16.duration_s, rel=0.5)


# ------------------------------------------------------------------ 5. fp4 without FP4 cores
def test_fp4_without_fp4_tensor_cores_is_weight_only_at_bf16_rate() -> None:
    """8192^3 = 1.0995e12 FLOP on H800 (roofline only): fp4 = bf16 = /(989.5e12·0.7) + 4 us =
    1591.4 us (it was /(1979e12·0.7) + 4 = 797.7 us, faster than fp8's 885.9 us)."""
    fm = FusedCostModel(toy_cluster(gpu="h800-sxm-80gb"))
    p = ShapePoint(1, 1, 1)
    t = {dt: fm.cost(gemm_node(8192, 8192, 8192, dtype=dt), p).duration_s
         for dt in ("bf16", "fp8", "fp4")}
    assert t["fp4"] == pytest.approx(1591.4 * US, rel=1e-4)
    assert t["fp4"] == pytest.approx(t["bf16"], rel=1e-12)
    assert t["fp8"] == pytest.approx(885.9 * US, rel=1e-4)
    h100 = load_gpu("h100-sxm-80gb")
    node = gemm_node(8192, 8192, 8192, dtype="fp4")
    assert h100.compute_dtype("fp4") == "bf16"
    assert node_compute_efficiency(node, h100) == 0.7  # bf16's, not fp8's 0.63


def test_fp4_peak_chains_to_bf16_and_keeps_real_fp4_peaks() -> None:
    a100 = load_gpu("a100-sxm-80gb")  # no fp8, no fp4
    assert a100.peak_flops("fp4") == 312e12
    assert a100.peak_flops("fp8") == 312e12
    assert load_gpu("b200").peak_flops("fp4") == 9000e12  # FP4 tensor cores: unchanged
    assert load_gpu("h100-sxm-80gb").peak_flops("fp8") == 1979e12
    odd = GpuSpec(name="odd", peak_flops_per_s={"fp32": 1e12}, hbm_capacity_bytes=1.0,
                  hbm_bandwidth_bytes_per_s=1.0, nvlink_bandwidth_bytes_per_s=0.0,
                  nic_bandwidth_bytes_per_s=0.0, num_sms=1)
    with pytest.raises(ConfigError, match="no peak FLOP/s for dtype 'fp4'"):
        odd.peak_flops("fp4")  # bf16 <-> fp16 cycle ends in an error, not a hang


# ------------------------------------------------------------------ 10. input and spec checks
@pytest.mark.parametrize("nbytes", [math.nan, math.inf])
def test_non_finite_bytes_are_rejected(nbytes: float) -> None:
    h = load_cluster("dgx-h100-ib400")
    with pytest.raises(ConfigError, match="nbytes >= 0"):
        collective_time("all_reduce", nbytes, 8, h)
    with pytest.raises(ConfigError, match="nbytes >= 0"):
        measured_nccl_s("all_reduce", nbytes, 8, h)


def test_fractional_sizes_and_no_groups_are_rejected() -> None:
    h = load_cluster("dgx-h100-ib400")
    with pytest.raises(ConfigError,
                       match=r"`group_size` must be a whole number >= 1, but got 2\.5"):
        collective_time("all_reduce", 1e6, 2.5, h)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"`concurrent_groups` must be a whole number >= 1"):
        collective_time("all_reduce", 1e6, 8, h, concurrent_groups=0)
    with pytest.raises(ConfigError, match=r"`stride` must be a whole number >= 1"):
        collective_time("all_reduce", 1e6, 2, h, stride=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`group_size` must be a whole number"):
        measured_nccl_s("all_reduce", 1e6, 2.5, h)  # type: ignore[arg-type]
    # whole floats and numpy-like values still work, the same as ints
    assert collective_time("all_reduce", 1e6, 8.0, h) == collective_time(  # type: ignore[arg-type]
        "all_reduce", 1e6, 8, h)


@pytest.fixture
def gpu_raw() -> dict[str, Any]:
    return yaml.safe_load((SPECS / "gpus" / "h100-sxm-80gb.yaml").read_text())


@pytest.mark.parametrize(("peaks", "message"), [
    ({"bf16": 9895}, "fp16 and bf16 must be equal (same tensor-core rate), but got fp16 989.5 "
                     "and bf16 9895"),
    ({"fp8": 900}, "fp8 must be >= bf16, but got fp8 900 < bf16 989.5"),
    ({"tf32": 4945}, "tf32 must be <= bf16, but got tf32 4945 > bf16 989.5"),
    ({"bf16": 9895, "fp16": 9895, "fp8": 19790, "int8": 19790},
     "`peak_tflops_per_s.bf16` must be <= 5000 (dense TFLOP/s per GPU), but got 9895"),
])
def test_spec_peaks_are_cross_checked(gpu_raw: dict[str, Any], peaks: dict[str, float],
                                      message: str) -> None:
    bad = copy.deepcopy(gpu_raw)
    bad["peak_tflops_per_s"].update(peaks)
    with pytest.raises(ConfigError) as info:
        gpu_from_dict(bad, file="bad.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("bad.yaml: `peak_tflops_per_s")


def test_missing_source_names_the_key_the_file_wrote(gpu_raw: dict[str, Any]) -> None:
    bad = copy.deepcopy(gpu_raw)
    del bad["sources"]["nic_bandwidth_gbit_per_s"]
    with pytest.raises(ConfigError, match=r"missing: \['nic_bandwidth_gbit_per_s'\]"):
        gpu_from_dict(bad, file="bad.yaml")
