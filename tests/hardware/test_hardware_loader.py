"""cluster_specs/ loaders: unit conversion by value, aliases, strict errors naming file+field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from charon_search.errors import ConfigError
from charon_search.hardware import (
    clear_caches,
    cluster_from_dict,
    gpu_from_dict,
    list_clusters,
    list_gpus,
    load_cluster,
    load_gpu,
    resolve_gpu_name,
)

SPECS = Path(__file__).resolve().parents[2] / "cluster_specs"


def _raw(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@pytest.fixture
def cluster_raw() -> dict[str, Any]:
    return _raw(SPECS / "dgx-h100-ib400.yaml")


@pytest.fixture
def gpu_raw() -> dict[str, Any]:
    return _raw(SPECS / "gpus" / "h100-sxm-80gb.yaml")


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


# ------------------------------------------------------------------ values converted once to SI
def test_h100_figures_in_si_units() -> None:
    gpu = load_gpu("h100-sxm-80gb")
    # 79.18 GiB, as CUDA reports an H100 80GB HBM3 (the datasheet's 80 GB counts the stacks)
    assert gpu.hbm_capacity_bytes == 85018877624
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)  # 3,350 GB/s
    assert gpu.nvlink_bandwidth_bytes_per_s == pytest.approx(450e9)  # 900 GB/s bidirectional
    assert gpu.nic_bandwidth_bytes_per_s == pytest.approx(50e9)  # 400 Gb/s / 8
    assert gpu.peak_flops("bf16") == pytest.approx(989.5e12)
    assert gpu.peak_flops("fp8") == pytest.approx(1979e12)
    assert gpu.peak_flops("fp32") == pytest.approx(67e12)  # CUDA cores, not TF32
    assert gpu.launch_overhead_s == pytest.approx(4e-6)
    assert gpu.num_sms == 132
    assert set(gpu.sources) >= {"peak_flops_per_s", "hbm_capacity_bytes",
                                "hbm_bandwidth_bytes_per_s", "nvlink_bandwidth_bytes_per_s"}


def test_a100_40gb_capacity_and_fp4_absent() -> None:
    gpu = load_gpu("A100-SXM4-40GB")
    assert gpu.hbm_capacity_bytes == 40 * 2**30 == 42949672960
    assert "fp8" not in gpu.peak_flops_per_s and "fp4" not in gpu.peak_flops_per_s
    assert load_gpu("gb200").peak_flops("fp4") == pytest.approx(10e15)  # NVL72 1440 PF sparse/72/2


def test_cluster_values_in_si_units() -> None:
    c = load_cluster("dgx-h100-ib400")
    assert [t.name for t in c.tiers] == ["nvlink", "leaf", "spine"]
    assert c.tiers[1].bandwidth_bytes_per_s == pytest.approx(50e9)  # 400 Gb/s
    assert c.tiers[0].latency_s == pytest.approx(0.7e-6)
    cal = c.calibration
    assert cal.collective_alpha_s["nvlink"] == pytest.approx(0.8e-6)
    assert cal.collective_launch_s == pytest.approx(4.5e-6)
    assert cal.allocator_reserved_extra_bytes == 2**30
    assert cal.provenance["collective_alpha_s"].startswith("default:")
    assert c.sources["cost_per_gpu_hour_usd"]


def test_llama3_cluster_oversubscription() -> None:
    c = load_cluster("h100-roce-24k")
    assert c.num_gpus == 24576
    assert [t.num_devices for t in c.tiers] == [8, 16, 3072, 24576]
    assert [t.oversubscription for t in c.tiers] == [1, 1, 1, 7]


# ------------------------------------------------------------------ names and aliases
@pytest.mark.parametrize(
    ("alias", "name"),
    [("h100_sxm", "h100-sxm-80gb"), ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
     ("H100", "h100-sxm-80gb"), ("h200_sxm", "h200-sxm-141gb"), ("a100_sxm", "a100-sxm-80gb"),
     ("A100-SXM4-80GB", "a100-sxm-80gb"), ("b200_sxm", "b200-sxm-180gb"), ("GB200", "gb200"),
     ("l40s", "l40s-48gb"), ("h800", "h800-sxm-80gb"), ("h20", "h20-96gb"), ("L20", "l20-48gb"),
     ("h100-sxm-96gb-500w", "h100-sxm-96gb-500w")],
)
def test_aliases_resolve_case_insensitively(alias: str, name: str) -> None:
    assert resolve_gpu_name(alias) == name
    assert load_gpu(alias).name == name


def test_required_specs_exist() -> None:
    assert set(list_gpus()) >= {
        "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h100-sxm-96gb-500w", "h800-sxm-80gb",
        "h200-sxm-141gb", "h20-96gb", "l20-48gb", "l40s-48gb", "b200-sxm-180gb", "gb200"}
    assert set(list_clusters()) >= {
        "dgx-a100-superpod", "dgx-h100-ib400", "h800-cluster", "h100-roce-24k", "gb200-nvl72",
        "a100-sxm-8gpu", "h100-sxm-8gpu", "h200-sxm-8gpu", "b200-8gpu", "h20-8gpu", "l40s-8gpu",
        "l20-8gpu", "h100-96gb-grand-teton"}


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"unknown GPU 'v100'.*h100-sxm-80gb"):
        load_gpu("v100")
    with pytest.raises(ConfigError, match=r"unknown cluster 'nope'.*dgx-h100-ib400"):
        load_cluster("nope")
    with pytest.raises(ConfigError, match="does not exist"):
        load_cluster("/no/such/file.yaml")


def test_load_by_path_and_inline_gpu(tmp_path: Path, cluster_raw: dict, gpu_raw: dict) -> None:
    data = copy.deepcopy(cluster_raw)
    data["name"] = "inline"
    data["gpu"] = gpu_raw
    spec = load_cluster(_write(tmp_path, "inline", data))
    assert spec.name == "inline" and spec.gpu.hbm_capacity_bytes == 85018877624


def test_extra_spec_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 cluster_raw: dict) -> None:
    data = copy.deepcopy(cluster_raw)
    data["name"] = "my-lab-cluster"
    _write(tmp_path, "my-lab-cluster", data)
    monkeypatch.setenv("CHARON_CLUSTER_SPECS", str(tmp_path))
    clear_caches()
    try:
        assert "my-lab-cluster" in list_clusters()
        assert load_cluster("my-lab-cluster").num_gpus == cluster_raw["num_gpus"]
    finally:
        monkeypatch.delenv("CHARON_CLUSTER_SPECS")
        clear_caches()


# ------------------------------------------------------------------ malformed files
def _expect(tmp_path: Path, data: Any, *fragments: str) -> None:
    path = _write(tmp_path, "bad", data)
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)


def test_unknown_top_level_key(tmp_path: Path, cluster_raw: dict) -> None:
    cluster_raw["nvlink_speed"] = 5
    _expect(tmp_path, cluster_raw, "`nvlink_speed` is not an allowed key", "allowed:", "num_gpus")


def test_unknown_tier_key(tmp_path: Path, cluster_raw: dict) -> None:
    cluster_raw["tiers"][1]["speed"] = 1
    _expect(tmp_path, cluster_raw, "tiers[1].speed", "allowed:", "bandwidth_<gbyte_per_s")


def test_missing_field(tmp_path: Path, cluster_raw: dict) -> None:
    del cluster_raw["num_gpus"]
    _expect(tmp_path, cluster_raw, "missing required field", "`num_gpus`")


def test_missing_tier_bandwidth(tmp_path: Path, cluster_raw: dict) -> None:
    del cluster_raw["tiers"][0]["bandwidth_gbyte_per_s"]
    _expect(tmp_path, cluster_raw, "tiers[0]", "bandwidth_<gbyte_per_s|gbit_per_s>")


@pytest.mark.parametrize("value", [-400, 0])
def test_non_positive_bandwidth(tmp_path: Path, cluster_raw: dict, value: float) -> None:
    cluster_raw["tiers"][1]["bandwidth_gbit_per_s"] = value
    _expect(tmp_path, cluster_raw, "tiers[1].bandwidth_gbit_per_s", "must be > 0")


def test_wrong_type(tmp_path: Path, cluster_raw: dict) -> None:
    cluster_raw["num_gpus"] = "eight"
    _expect(tmp_path, cluster_raw, "`num_gpus` must be a number")
    cluster_raw["num_gpus"] = 8.5
    _expect(tmp_path, cluster_raw, "`num_gpus` must be an integer")


def test_tiers_must_grow_and_cover_cluster(tmp_path: Path, cluster_raw: dict) -> None:
    bad = copy.deepcopy(cluster_raw)
    bad["tiers"][1]["num_devices"] = 4
    _expect(tmp_path, bad, "strictly growing", "[8, 4, 8192]")
    bad = copy.deepcopy(cluster_raw)
    bad["num_gpus"] = 16384
    _expect(tmp_path, bad, "outermost tier must hold all GPUs")
    bad = copy.deepcopy(cluster_raw)
    bad["gpus_per_node"] = 3
    _expect(tmp_path, bad, "`gpus_per_node` must divide `num_gpus`")


def test_unknown_algorithm(tmp_path: Path, cluster_raw: dict) -> None:
    cluster_raw["tiers"][0]["algorithms"] = ["ring", "butterfly"]
    _expect(tmp_path, cluster_raw, "tiers[0].algorithms", "butterfly", "allowed: ring")


def test_calibration_rules(tmp_path: Path, cluster_raw: dict) -> None:
    bad = copy.deepcopy(cluster_raw)
    bad["calibration"]["collective_alpha_us"]["infiniband"] = 3
    _expect(tmp_path, bad, "calibration.collective_alpha_us.infiniband", "tiers: ['leaf'")
    bad = copy.deepcopy(cluster_raw)
    bad["calibration"]["collective_bw_efficiency"]["leaf"] = 1.5
    _expect(tmp_path, bad, "collective_bw_efficiency.leaf", "(0, 1]")
    bad = copy.deepcopy(cluster_raw)
    del bad["calibration"]["provenance"]["overlap_comm_slowdown"]
    _expect(tmp_path, bad, "calibration.provenance", "overlap_comm_slowdown")
    bad = copy.deepcopy(cluster_raw)
    bad["calibration"]["overlap_compute_slowdown"] = 0.9
    _expect(tmp_path, bad, "calibration.overlap_compute_slowdown", ">= 1")


@pytest.mark.parametrize("field", ["frontend_latency", "frontend_prompt_token",
                                   "frontend_output_token", "prefill_iteration_overhead",
                                   "eager_kernel_host", "disagg_handoff"])
def test_per_engine_times(tmp_path: Path, cluster_raw: dict, field: str) -> None:
    """``<field>_<unit>`` maps serving engines to seconds (ms converted once); an unknown engine
    or a negative time names the entry."""
    cal = cluster_raw["calibration"]
    for unit in ("s", "ms", "us", "ns"):  # the shipped spec may set the field in another unit
        cal.pop(f"{field}_{unit}", None)
        cal["provenance"].pop(f"{field}_{unit}", None)
    cal[f"{field}_ms"] = {"trtllm": 45, "vllm": 2.5}
    cal["provenance"][f"{field}_ms"] = "test value"
    spec = load_cluster(_write(tmp_path, "front", cluster_raw))
    assert getattr(spec.calibration, f"{field}_s") == {"trtllm": pytest.approx(0.045),
                                                       "vllm": pytest.approx(0.0025)}
    for value, fragments in (({"tgi": 10}, (f"{field}_ms.tgi", "allowed: vllm, sglang, trtllm")),
                             ({"sglang": -1}, (f"{field}_ms.sglang", ">= 0, but got -1"))):
        bad = copy.deepcopy(cluster_raw)
        bad["calibration"][f"{field}_ms"] = value
        _expect(tmp_path, bad, *fragments)


def test_price_needs_a_source(tmp_path: Path, cluster_raw: dict) -> None:
    del cluster_raw["sources"]
    _expect(tmp_path, cluster_raw, "sources.cost_per_gpu_hour_usd")


def test_unknown_gpu_in_cluster(tmp_path: Path, cluster_raw: dict) -> None:
    cluster_raw["gpu"] = "tpu-v9"
    _expect(tmp_path, cluster_raw, "`gpu`", "unknown GPU 'tpu-v9'")


def test_malformed_yaml(tmp_path: Path) -> None:
    p = tmp_path / "broken.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_cluster(p)


def test_gpu_rules(gpu_raw: dict) -> None:
    def expect(data: dict, *fragments: str) -> None:
        with pytest.raises(ConfigError) as info:
            gpu_from_dict(data, file="h100.yaml")
        msg = str(info.value)
        assert "h100.yaml" in msg
        for f in fragments:
            assert f in msg, (f, msg)

    bad = copy.deepcopy(gpu_raw)
    del bad["hbm_capacity_bytes"]
    expect(bad, "missing required field", "hbm_capacity_<gib|gb|bytes>")
    bad = copy.deepcopy(gpu_raw)
    bad["hbm_bandwidth_gbyte_per_s"] = -1
    expect(bad, "hbm_bandwidth_gbyte_per_s", "must be > 0")
    bad = copy.deepcopy(gpu_raw)
    bad["peak_tflops_per_s"]["fp6"] = 1
    expect(bad, "peak_tflops_per_s.fp6", "allowed: fp64")
    bad = copy.deepcopy(gpu_raw)
    del bad["sources"]["hbm_bandwidth_gbyte_per_s"]
    expect(bad, "source for every figure", "hbm_bandwidth_gbyte_per_s")  # the key the file wrote
    bad = copy.deepcopy(gpu_raw)
    bad["hbm_capacity_gb"] = 85.9
    expect(bad, "second time", "hbm_capacity_bytes")
    bad = copy.deepcopy(gpu_raw)
    bad["compute_efficiency"] = 1.2
    expect(bad, "compute_efficiency", "(0, 1]")


def test_cluster_from_dict_default_file_name(cluster_raw: dict) -> None:
    cluster_raw["tiers"][0]["latency_us"] = -1
    with pytest.raises(ConfigError, match=r"<dict>: `tiers\[0\].latency_us` must be >= 0"):
        cluster_from_dict(cluster_raw)


def test_fitted_provenance_keys(tmp_path: Path, cluster_raw: dict) -> None:
    """`charon-search calibrate` writes per-tier provenance (`collective.<tier>`)."""
    prov = cluster_raw["calibration"]["provenance"]
    del prov["collective_alpha_us"], prov["collective_bw_efficiency"]
    prov["collective.nvlink"] = "fit to nccl_perf h100_sxm, 30 points, MAPE 4%"
    prov["collective_alpha_us.leaf"] = "default: assumed"
    spec = load_cluster(_write(tmp_path, "fitted", cluster_raw))
    assert spec.calibration.provenance["collective.nvlink"].startswith("fit")
    assert "collective_alpha_s.leaf" in spec.calibration.provenance
    prov["collective.infiniband"] = "fit"
    _expect(tmp_path, cluster_raw, "collective.<tier>", "tiers:")


def test_specs_pickle_round_trip() -> None:
    """Specs cross process boundaries (Ray workers): they must pickle to equal objects."""
    import pickle

    for name in ("h100-roce-24k", "gb200-nvl72", "l40s-8gpu"):
        spec = load_cluster(name)
        assert pickle.loads(pickle.dumps(spec)) == spec


def test_per_dtype_efficiency_rules(gpu_raw: dict) -> None:
    gpu = gpu_from_dict(gpu_raw, file="h100.yaml")
    assert gpu.compute_efficiency_by_dtype == {"fp8": 0.63}
    bad = copy.deepcopy(gpu_raw)
    bad["compute_efficiency_by_dtype"] = {"fp4": 0.5}  # H100 has no fp4 peak
    with pytest.raises(ConfigError, match=r"compute_efficiency_by_dtype.fp4.*allowed"):
        gpu_from_dict(bad, file="h100.yaml")
    bad = copy.deepcopy(gpu_raw)
    bad["compute_efficiency_by_dtype"] = {"fp8": 1.5}
    with pytest.raises(ConfigError, match=r"compute_efficiency_by_dtype.fp8.*\(0, 1\]"):
        gpu_from_dict(bad, file="h100.yaml")
