"""Every file under cluster_specs/ loads, validates and prices one GEMM and one collective."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from charon_search.cli import main as cli_main
from charon_search.cost.base import ShapePoint
from charon_search.cost.collectives import collective_time
from charon_search.cost.roofline import RooflineCostBackend
from charon_search.hardware import load_cluster, load_gpu
from charon_search.testing import gemm_node

SPECS = Path(__file__).resolve().parents[2] / "cluster_specs"
GPU_FILES = sorted((SPECS / "gpus").glob("*.yaml"))
CLUSTER_FILES = sorted(SPECS.glob("*.yaml"))


def test_spec_folder_is_populated() -> None:
    assert len(GPU_FILES) >= 11 and len(CLUSTER_FILES) >= 13
    assert sorted(SPECS.rglob("*.yaml")) == sorted(GPU_FILES + CLUSTER_FILES)


@pytest.mark.parametrize("path", GPU_FILES, ids=lambda p: p.stem)
def test_gpu_file(path: Path) -> None:
    gpu = load_gpu(path)
    assert gpu.name == path.stem
    assert load_gpu(gpu.name) is gpu
    for alias in gpu.aliases:
        assert load_gpu(alias.upper()).name == gpu.name
    # dense bf16 GEMM of 8192^3: compute-bound on every listed part.
    node = gemm_node(8192, 8192, 8192)
    cost = RooflineCostBackend().cost(node, ShapePoint(1, 1, 1), gpu)
    assert cost is not None and cost.detail == "compute"
    expected = 2 * 8192**3 / (gpu.peak_flops("bf16") * gpu.compute_efficiency)
    assert cost.duration_s == pytest.approx(expected + gpu.launch_overhead_s)
    # Sanity ranges (catch unit slips such as GB vs GiB or TB vs GB).
    assert 16 * 2**30 <= gpu.hbm_capacity_bytes <= 320 * 2**30  # B300/GB300: 288 GB
    assert 0.5e12 <= gpu.hbm_bandwidth_bytes_per_s <= 10e12
    assert 50e12 <= gpu.peak_flops("bf16") <= 5e15


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.stem)
def test_cluster_file(path: Path) -> None:
    cluster = load_cluster(path)
    assert cluster.name == path.stem
    assert cluster.source and cluster.sources["cost_per_gpu_hour_usd"]
    assert cluster.cost_per_gpu_hour_usd > 0
    assert cluster.tiers[-1].num_devices >= cluster.num_gpus
    assert all(t.source for t in cluster.tiers)
    cal = cluster.calibration
    for tier in cluster.tiers:
        assert tier.name in cal.collective_alpha_s and tier.name in cal.collective_bw_efficiency
    node = gemm_node(4096, 4096, 4096)
    cost = RooflineCostBackend().cost(node, ShapePoint(1, 1, 1), cluster.gpu)
    assert cost is not None and cost.duration_s > 0
    # One collective inside a node and one over the whole cluster.
    per_node = cluster.gpus_per_node
    t_node = collective_time("all_reduce", 2**28, per_node, cluster)
    t_all = collective_time("all_reduce", 2**28, cluster.num_gpus, cluster)
    assert math.isfinite(t_all) and 0 < t_node <= t_all


def test_specs_check_cli_all_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["specs", "check"]) == 0
    out = capsys.readouterr().out
    assert f"{len(GPU_FILES) + len(CLUSTER_FILES)} of {len(GPU_FILES) + len(CLUSTER_FILES)}" in out
    assert "h100-roce-24k" in out


def test_specs_check_cli_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((SPECS / "h100-sxm-8gpu.yaml").read_text() + "\nsurprise: 1\n")
    assert cli_main(["specs", "check", str(bad), str(SPECS / "gpus" / "gb200.yaml")]) == 2
    captured = capsys.readouterr()
    assert "1 of 2 spec files valid" in captured.out
    assert "`surprise` is not an allowed key" in captured.err and str(bad) in captured.err


def test_specs_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["specs", "show", "h100-roce-24k"]) == 0
    out = capsys.readouterr().out
    assert "oversubscription 1:7" in out and "gpu h100-sxm-80gb" in out
    assert cli_main(["specs", "show", "NVIDIA H200"]) == 0
    assert "HBM 139.8 GiB at 4.8 TB/s" in capsys.readouterr().out
    assert cli_main(["specs", "show", "nope"]) == 2
    assert "unknown GPU or cluster 'nope'" in capsys.readouterr().err
