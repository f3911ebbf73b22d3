"""Loader checks from the second collective review: messages name the YAML key in the YAML's
unit (F8), cross-checks of the tiers against the GPU and the nodes (F8), the tier's explicit
``fabric`` (F7) and the GPU's ``nccl_profile_gpu`` (F3)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from charon_search.errors import ConfigError
from charon_search.hardware import cluster_from_dict, load_cluster, load_gpu

SPECS = Path(__file__).resolve().parents[2] / "charon_search" / "cluster_specs"
ROOT_SPECS = Path(__file__).resolve().parents[2] / "cluster_specs"


def _raw(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@pytest.fixture
def dgx() -> dict[str, Any]:
    return _raw(SPECS / "dgx-h100-ib400.yaml")


def _error(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        cluster_from_dict(data, file="bad.yaml")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("bad.yaml"), msg
    return msg


# ------------------------------------------------------------------ every shipped spec loads
@pytest.mark.parametrize("folder", [SPECS, ROOT_SPECS], ids=["package", "repo-root"])
def test_every_shipped_spec_loads_and_states_its_fabric(folder: Path) -> None:
    files = sorted(folder.glob("*.yaml"))
    assert len(files) >= 20
    for f in files:
        spec = load_cluster(f)
        raw = _raw(f)
        assert all("fabric" in t for t in raw["tiers"]), f
        assert [t.fabric for t in spec.tiers][1:] == ["network"] * (len(spec.tiers) - 1)
    for f in sorted((folder / "gpus").glob("*.yaml")):
        load_gpu(f)


# ------------------------------------------------------------------------- F8: the messages
def test_alpha_error_names_the_yaml_key_in_its_unit(dgx: dict) -> None:
    dgx["calibration"]["collective_alpha_us"]["leaf"] = -1
    msg = _error(dgx)
    assert "`calibration.collective_alpha_us.leaf` must be >= 0, but got -1" in msg


def test_engine_time_error_names_the_yaml_key_in_its_unit(dgx: dict) -> None:
    dgx["calibration"]["frontend_latency_ms"] = {"vllm": -2.5}
    msg = _error(dgx)
    assert "`calibration.frontend_latency_ms.vllm` must be >= 0, but got -2.5" in msg


def test_empty_algorithm_list(dgx: dict) -> None:
    dgx["tiers"][1]["algorithms"] = []
    msg = _error(dgx)
    assert "`tiers[1].algorithms` must list at least one algorithm" in msg
    assert "allowed: ring, tree, nvls, pairwise, p2p" in msg


# --------------------------------------------------------------------- F8: the cross-checks
def test_nvlink_tier_must_match_the_gpu(dgx: dict) -> None:
    """h100-sxm-80gb.yaml: NVLink 450 GB/s per direction; a 10x typo (4,500) is refused."""
    dgx["tiers"][0]["bandwidth_gbyte_per_s"] = 4500
    msg = _error(dgx)
    assert "`tiers[0].bandwidth_gbyte_per_s` must equal the NVLink bandwidth" in msg
    assert "450 GB/s" in msg and "got 4500" in msg


def test_network_tier_above_the_nic_warns(dgx: dict) -> None:
    """400 Gb/s NIC = 50 GB/s; ``bandwidth_gbyte_per_s: 400`` (a unit slip, 8x, or a server
    with faster NICs than the GPU spec's) loads with a warning naming the field and the unit;
    ``bandwidth_gbit_per_s: 400`` is the shipped value."""
    del dgx["tiers"][1]["bandwidth_gbit_per_s"]
    dgx["tiers"][1]["bandwidth_gbyte_per_s"] = 400
    with pytest.warns(UserWarning) as rec:
        cl = cluster_from_dict(dgx, file="bad.yaml")
    msg = str(rec[0].message)
    assert "`tiers[1].bandwidth_gbyte_per_s` is above the NIC bandwidth" in msg
    assert "400 Gb/s = 50 GB/s" in msg and "got 400" in msg
    assert cl.tiers[1].bandwidth_bytes_per_s == 400e9


def test_outermost_tier_may_be_ragged(dgx: dict) -> None:
    """A 127-node SuperPOD of 256-GPU leaves: 1,016 GPUs, not a multiple of 256."""
    dgx["num_gpus"] = dgx["tiers"][2]["num_devices"] = 1016
    assert cluster_from_dict(dgx).tiers[2].num_devices == 1016


def test_pcie_tier_at_most_pcie6_x16() -> None:
    raw = _raw(SPECS / "l40s-8gpu.yaml")
    raw["tiers"][0]["bandwidth_gbyte_per_s"] = 320
    msg = _error(raw)
    assert "`tiers[0].bandwidth_gbyte_per_s` must be <= 128 GB/s" in msg


def test_nvls_only_on_the_innermost_nvlink_tier(dgx: dict) -> None:
    dgx["tiers"][1]["algorithms"] = ["ring", "nvls"]
    assert "`tiers[1].algorithms` lists nvls" in _error(dgx)
    raw = _raw(SPECS / "l40s-8gpu.yaml")
    raw["tiers"][0]["algorithms"] = ["ring", "nvls"]
    assert "`tiers[0].algorithms` lists nvls" in _error(raw)


def test_calibration_algorithm_must_run_on_its_tier(dgx: dict) -> None:
    dgx["calibration"]["collective_bw_efficiency"]["leaf.nvls"] = 0.5
    msg = _error(dgx)
    assert "`calibration.collective_bw_efficiency.leaf.nvls`: tier leaf does not run 'nvls'" in msg
    assert "['p2p', 'pairwise', 'ring', 'tree']" in msg
    ok = copy.deepcopy(dgx)
    del ok["calibration"]["collective_bw_efficiency"]["leaf.nvls"]
    ok["calibration"]["collective_bw_efficiency"]["leaf.pairwise"] = 0.5  # runs everywhere
    assert cluster_from_dict(ok).calibration.collective_bw_efficiency["leaf.pairwise"] == 0.5


@pytest.mark.parametrize(("tier", "size", "fragment"), [
    (0, 4, "`tiers[0].num_devices` must be a multiple of `gpus_per_node` (8)"),
    (1, 12, "`tiers[1].num_devices` must be a multiple of `tiers[0].num_devices` (8)"),
])
def test_tier_domains_nest_whole_nodes(dgx: dict, tier: int, size: int, fragment: str) -> None:
    dgx["tiers"][tier]["num_devices"] = size
    msg = _error(dgx)
    assert fragment in msg and f"got {size}" in msg


# ------------------------------------------------------------------------------ F7: fabric
def test_innermost_tier_of_another_name_must_state_its_fabric(dgx: dict) -> None:
    dgx["tiers"][0]["name"] = "nvswitch"
    del dgx["tiers"][0]["fabric"]
    cal = dgx["calibration"]
    for block in (cal["collective_alpha_us"], cal["collective_bw_efficiency"], cal["provenance"]):
        for k in list(block):
            if k.startswith(("nvlink", "collective.nvlink")):
                block[k.replace("nvlink", "nvswitch", 1)] = block.pop(k)
    msg = _error(copy.deepcopy(dgx))
    assert "`tiers[0].fabric` must be given" in msg
    assert "allowed: nvlink, pcie, network" in msg
    dgx["tiers"][0]["fabric"] = "nvlink"
    spec = cluster_from_dict(dgx)
    assert spec.tiers[0].name == "nvswitch" and spec.tiers[0].fabric == "nvlink"


@pytest.mark.parametrize(("tier", "fabric", "fragment"), [
    (0, "infiniband", "`tiers[0].fabric` must be one of nvlink, pcie, network"),
    (1, "nvlink", "`tiers[1].fabric` must be network on an outer tier"),
])
def test_fabric_values(dgx: dict, tier: int, fabric: str, fragment: str) -> None:
    dgx["tiers"][tier]["fabric"] = fabric
    assert fragment in _error(dgx)


# ------------------------------------------------------------------- F3: nccl_profile_gpu
def _inline_gpu(dgx: dict, **changes: Any) -> dict:
    gpu = _raw(SPECS / "gpus" / "h100-sxm-80gb.yaml")
    gpu["name"], gpu["aliases"] = "h100-test", []
    gpu.update(changes)
    gpu["sources"]["nccl_profile_gpu"] = "test"
    dgx["gpu"] = gpu
    return dgx


@pytest.mark.parametrize(("twin", "fragment"), [
    ("h800-sxm-80gb", "same fabric (NVLink bandwidth 450 GB/s), but h800-sxm-80gb has 200 GB/s"),
    ("h100_sxm", "must be the normalized name of another GPU"),
    ("tpu-v5", "must name a GPU spec"),
])
def test_nccl_profile_gpu_is_checked(dgx: dict, twin: str, fragment: str) -> None:
    msg = _error(_inline_gpu(dgx, nccl_profile_gpu=twin))
    assert "`gpu.nccl_profile_gpu`" in msg and fragment in msg, msg


def test_nccl_profile_gpu_no_chain(dgx: dict) -> None:
    """a100-sxm-40gb itself borrows the 80 GB rows."""
    dgx["tiers"][0]["bandwidth_gbyte_per_s"] = 300
    msg = _error(_inline_gpu(dgx, nccl_profile_gpu="a100-sxm-40gb",
                             nvlink_bandwidth_gbyte_per_s=300))
    assert "borrows those of a100-sxm-80gb" in msg


def test_nccl_profile_gpu_needs_a_source(dgx: dict) -> None:
    raw = _inline_gpu(dgx, nccl_profile_gpu="h100-sxm-80gb")
    del raw["gpu"]["sources"]["nccl_profile_gpu"]
    assert re.search(r"missing: \['nccl_profile_gpu'\]", _error(raw))
    raw["gpu"]["sources"]["nccl_profile_gpu"] = "same board"
    assert cluster_from_dict(raw).gpu.nccl_profile_gpu == "h100-sxm-80gb"


def test_shipped_siblings() -> None:
    assert {g: load_gpu(g).nccl_profile_gpu for g in (
        "a100-sxm-40gb", "h100-sxm-96gb-500w", "h20-96gb", "l20-48gb", "h100-sxm-80gb")} == {
        "a100-sxm-40gb": "a100-sxm-80gb", "h100-sxm-96gb-500w": "h100-sxm-80gb",
        "h20-96gb": "h100-sxm-80gb", "l20-48gb": "l40s-48gb", "h100-sxm-80gb": ""}


def test_a100_40gb_and_80gb_share_the_nccl_fit() -> None:
    """Both A100 RoCE specs carry the nccl_fit of the a100_sxm rows (launch 17.747 us, NVLink
    α 0.185 us, efficiency 0.586); the 40 GB one had a different hand fit (8 us, 1.1 us,
    0.74) for the same node."""
    a40 = load_cluster("a100-40gb-roce1600").calibration
    a80 = load_cluster("a100-80gb-roce1600").calibration
    for cal in (a40, a80):
        assert cal.collective_launch_s == pytest.approx(17.747e-6)
        assert cal.collective_alpha_s["nvlink"] == pytest.approx(0.185e-6)
        assert cal.collective_bw_efficiency["nvlink"] == pytest.approx(0.586)


@pytest.mark.parametrize(("tier", "value", "fragment"), [
    (1, 512, "`tiers[1].job_devices` is allowed on the innermost tier only"),
    (0, 66, "`tiers[0].job_devices` must be a multiple of `gpus_per_node` (4) and <= "
            "`num_devices` (72), but got 66"),
    (0, 76, "`tiers[0].job_devices` must be <= `num_devices` (72), but got 76"),
])
def test_job_devices_rules(tier: int, value: int, fragment: str) -> None:
    """gb200-nvl72.yaml: ``job_devices: 64`` on the NVLink tier (16 of 18 trays)."""
    raw = _raw(SPECS / "gb200-nvl72.yaml")
    assert raw["tiers"][0]["job_devices"] == 64
    raw["tiers"][tier]["job_devices"] = value
    assert fragment in _error(raw)
