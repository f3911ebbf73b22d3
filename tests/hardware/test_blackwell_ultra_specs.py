"""B300 / GB300 (Blackwell Ultra) and multi-node B200/B300 specs: figures match their sources
and the silicon CSV system names resolve to them."""

from __future__ import annotations

import pytest

from charon_search.hardware import load_cluster, load_gpu, resolve_gpu_name
from charon_search.validation.names import resolve_gpu


def test_b300_figures_match_sources() -> None:
    gpu = load_gpu("b300-sxm-288gb")
    # aiconfigurator-core 0.12.0 systems/b300_sxm.yaml
    assert gpu.peak_flops("bf16") == pytest.approx(2250e12)  # 4.5 PF sparse / 2
    assert gpu.peak_flops("fp8") == pytest.approx(4500e12)  # 9 PF sparse / 2
    assert gpu.peak_flops("fp4") == pytest.approx(14000e12)
    assert gpu.hbm_capacity_bytes == 288400343040  # 275040 MiB (nvidia-smi)
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(7.75e12)
    assert gpu.nic_bandwidth_bytes_per_s == pytest.approx(100e9)  # CX8 800 Gb/s
    # HGX B300 datasheet: NVLink 5, 1.8 TB/s bidirectional; FP64 10 TF per 8 GPUs
    assert gpu.nvlink_bandwidth_bytes_per_s == pytest.approx(900e9)
    assert gpu.peak_flops("fp64") == pytest.approx(1.25e12)
    assert gpu.memory_efficiency == pytest.approx(0.8)  # mem_bw_empirical_scaling_factor


def test_gb300_figures_match_sources() -> None:
    gpu = load_gpu("gb300")
    # aiconfigurator-core 0.12.0 systems/gb300.yaml; GB300 NVL72 datasheet (/72 /2)
    assert gpu.peak_flops("bf16") == pytest.approx(2500e12)
    assert gpu.peak_flops("fp8") == pytest.approx(5000e12)
    assert gpu.peak_flops("fp4") == pytest.approx(15000e12)  # 1,080 PF dense / 72
    assert gpu.hbm_capacity_bytes == 298013687808  # 284208 MiB (nvidia-smi)
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(8e12)  # 576 TB/s / 72
    assert gpu.nvlink_bandwidth_bytes_per_s == pytest.approx(900e9)  # 130 TB/s / 72 / 2
    assert gpu.nic_bandwidth_bytes_per_s == pytest.approx(100e9)


@pytest.mark.parametrize(("system", "name"), [
    ("b300_sxm", "b300-sxm-288gb"), ("NVIDIA B300 SXM6 AC", "b300-sxm-288gb"),
    ("gb300", "gb300"), ("gb300_nvl72", "gb300")])
def test_silicon_system_names_resolve(system: str, name: str) -> None:
    assert resolve_gpu_name(system) == name
    assert resolve_gpu(system).name == name  # validation's names.yaml path


def test_profile_db_keys_match_gpu_specs() -> None:
    from charon_search.cost.profile_db import default_profile_db

    db = default_profile_db()
    for spec in ("b300-sxm-288gb", "gb300"):
        gpu = load_gpu(spec)
        assert db.resolve_gpu(gpu.name, *gpu.aliases) == spec


@pytest.mark.parametrize(("cluster", "gpu", "num_gpus", "per_node", "nic_bytes_per_s"), [
    ("b300-8gpu", "b300-sxm-288gb", 8, 8, None),
    ("dgx-b300-ib800", "b300-sxm-288gb", 1024, 8, 100e9),
    ("dgx-b200-ib400", "b200-sxm-180gb", 1024, 8, 50e9),
    ("gb300-nvl72", "gb300", 2304, 4, 100e9)])
def test_new_clusters(cluster: str, gpu: str, num_gpus: int, per_node: int,
                      nic_bytes_per_s: float | None) -> None:
    c = load_cluster(cluster)
    assert c.gpu.name == gpu and c.num_gpus == num_gpus and c.gpus_per_node == per_node
    assert c.tiers[0].name == "nvlink" and "nvls" in c.tiers[0].algorithms
    assert c.tiers[0].bandwidth_bytes_per_s == pytest.approx(900e9)
    assert c.tiers[0].num_devices == (72 if gpu == "gb300" else 8)
    if nic_bytes_per_s is not None:
        assert c.tiers[1].bandwidth_bytes_per_s == pytest.approx(nic_bytes_per_s)
    # NVLink tier fitted to the aiconfigurator NCCL tables (charon_search.cost.nccl_fit)
    assert c.calibration.provenance["collective_launch_s"].startswith("fit (")
    assert "nccl_perf.parquet" in c.calibration.provenance["collective_alpha_s"]


def test_multinode_clusters_share_the_node_calibration() -> None:
    for node, multi in (("b200-8gpu", "dgx-b200-ib400"), ("b300-8gpu", "dgx-b300-ib800")):
        a, b = load_cluster(node).calibration, load_cluster(multi).calibration
        assert a.collective_launch_s == b.collective_launch_s
        for key in ("nvlink", "nvlink.nvls"):
            assert a.collective_alpha_s[key] == b.collective_alpha_s[key]
            assert a.collective_bw_efficiency[key] == b.collective_bw_efficiency[key]
        assert a.iteration_cpu_overhead_s == b.iteration_cpu_overhead_s


@pytest.mark.parametrize(("system", "num_gpus", "cluster"), [
    ("b300_sxm", 4, "b300-8gpu"), ("b300_sxm", 8, "b300-8gpu"), ("b300_sxm", 64, "dgx-b300-ib800"),
    ("b200_sxm", 8, "b200-8gpu"), ("b200_sxm", 16, "dgx-b200-ib400"),
    ("gb300", 36, "gb300-nvl72")])
def test_validation_picks_the_new_clusters(system: str, num_gpus: int, cluster: str) -> None:
    from charon_search.validation.names import choose_cluster
    from charon_search.validation.records import Record

    record = Record(id="x", kind="serving", source="silicon", confidence="high",
                    model={"name": "m", "catalog": None},
                    hardware={"gpu": system, "num_gpus": num_gpus, "gpus_per_node": None,
                              "interconnect": None},
                    config={}, measured={}, origin="silicon")
    assert choose_cluster(record, num_gpus).cluster.name == cluster
