"""Strict YAML loaders for ``cluster_specs/``: GPUs (``gpus/<name>.yaml``) and clusters.

Every numeric key in a YAML file carries a unit suffix from ``units.SUFFIX_TO_SI``
(``hbm_capacity_gib``, ``bandwidth_gbyte_per_s``, ``latency_us``) or none for plain numbers
(``num_sms``, ``compute_efficiency``). The loader converts each value to SI exactly once, so code
never sees ``_gib``. Unknown keys, missing fields, wrong types and non-positive bandwidths raise
``ConfigError`` naming the file, the field and the allowed keys.

Spec folders: the shipped ``charon_search/cluster_specs/`` (package data, so wheels and container
images carry it; the repository's top-level ``cluster_specs`` is a link to it) plus every folder
listed in the ``CHARON_CLUSTER_SPECS`` environment variable (``os.pathsep``-separated), searched
first.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from charon_search.errors import ConfigError
from charon_search.hardware.spec import (
    ENGINE_KEYED_TIMES,
    FRONTEND_KEYED_TIMES,
    SERVING_ENGINES,
    SERVING_FRONTENDS,
    TIER_FABRICS,
    Calibration,
    ClusterSpec,
    GpuSpec,
    TopologyTier,
)
from charon_search.units import to_si

__all__ = [
    "DTYPES",
    "TIER_ALGORITHMS",
    "cluster_from_dict",
    "gpu_from_dict",
    "list_clusters",
    "list_gpus",
    "load_cluster",
    "load_gpu",
    "read_yaml",
    "resolve_gpu_name",
    "spec_dirs",
]

#: Dtype keys allowed under ``peak_tflops_per_s``.
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
#: Collective algorithms a tier may list.
TIER_ALGORITHMS = ("ring", "tree", "nvls", "pairwise", "p2p")
#: Algorithms every tier runs whether it lists them or not (``cost.collectives``: all-to-all
#: and send/recv), so calibration may key them on any tier.
ALWAYS_ALGORITHMS = ("pairwise", "p2p")
#: Ceiling of a ``fabric: pcie`` tier's bandwidth per GPU and direction: PCIe 6.0 x16,
#: 64 GT/s x 16 lanes / 8 = 128 GB/s (PCI-SIG PCIe 6.0 Base Specification, 2022); a figure above
#: it is a unit slip (e.g. a bidirectional or bit figure written as GB/s per direction).
PCIE_MAX_BYTES_PER_S = 128e9

_SHIPPED_SPECS = Path(__file__).resolve().parents[1] / "cluster_specs"


def spec_dirs() -> list[Path]:
    """Folders searched for specs: ``$CHARON_CLUSTER_SPECS`` entries first, then the shipped."""
    dirs = [Path(p) for p in os.environ.get("CHARON_CLUSTER_SPECS", "").split(os.pathsep) if p]
    dirs.append(_SHIPPED_SPECS)
    return [d for d in dirs if d.is_dir()]


# --------------------------------------------------------------------------- field schemas
@dataclass(frozen=True, slots=True)
class _Field:
    """One allowed key: SI name, YAML spellings, type check and value rule."""

    si_name: str
    yaml_hint: str
    """The YAML spelling shown in error messages (``hbm_capacity_<gib|gb|bytes>``)."""
    kind: str
    """``number``, ``int``, ``str``, ``strlist``, ``mapping``, ``list`` or ``any``."""
    required: bool = True
    rule: str = ""
    """``positive``, ``nonneg``, ``ratio`` (0 < x <= 1), ``ge1`` (x >= 1) or empty."""
    figure: bool = False
    """A hardware figure that needs an entry in ``sources``."""


_BYTES = "<gib|gb|bytes>"
_RATE = "<gbyte_per_s|gbit_per_s>"
_TIME = "<s|ms|us|ns>"

_GPU_FIELDS = (
    _Field("name", "name", "str"),
    _Field("aliases", "aliases", "strlist", required=False),
    _Field("description", "description", "str", required=False),
    _Field("peak_flops_per_s", "peak_tflops_per_s", "mapping", figure=True),
    _Field("hbm_capacity_bytes", f"hbm_capacity_{_BYTES}", "number", rule="positive",
           figure=True),
    _Field("hbm_bandwidth_bytes_per_s", f"hbm_bandwidth_{_RATE}", "number", rule="positive",
           figure=True),
    _Field("nvlink_bandwidth_bytes_per_s", f"nvlink_bandwidth_{_RATE}", "number",
           rule="nonneg", figure=True),
    _Field("nic_bandwidth_bytes_per_s", f"nic_bandwidth_{_RATE}", "number", rule="nonneg",
           figure=True),
    _Field("num_sms", "num_sms", "int", rule="positive", figure=True),
    _Field("launch_overhead_s", f"launch_overhead_{_TIME}", "number", required=False,
           rule="nonneg", figure=True),
    _Field("compute_efficiency", "compute_efficiency", "number", required=False, rule="ratio",
           figure=True),
    _Field("memory_efficiency", "memory_efficiency", "number", required=False, rule="ratio",
           figure=True),
    _Field("compute_efficiency_by_dtype", "compute_efficiency_by_dtype", "mapping",
           required=False, figure=True),
    _Field("sustained_clock_ratio", "sustained_clock_ratio", "number", required=False,
           rule="ratio", figure=True),
    _Field("attention_kernel_gen", "attention_kernel_gen", "int", required=False,
           rule="positive", figure=True),
    _Field("nccl_profile_gpu", "nccl_profile_gpu", "str", required=False, figure=True),
    _Field("sources", "sources", "mapping"),
)

_TIER_FIELDS = (
    _Field("name", "name", "str"),
    _Field("num_devices", "num_devices", "int", rule="positive"),
    _Field("bandwidth_bytes_per_s", f"bandwidth_{_RATE}", "number", rule="positive"),
    _Field("latency_s", f"latency_{_TIME}", "number", rule="nonneg"),
    _Field("algorithms", "algorithms", "strlist", required=False),
    _Field("oversubscription", "oversubscription", "number", required=False, rule="ge1"),
    _Field("fabric", "fabric", "str", required=False),
    _Field("job_devices", "job_devices", "int", required=False, rule="positive"),
    _Field("source", "source", "str"),
)

_CALIBRATION_FIELDS = (
    _Field("collective_alpha_s", f"collective_alpha_{_TIME}", "mapping", required=False),
    _Field("collective_bw_efficiency", "collective_bw_efficiency", "mapping", required=False),
    _Field("overlap_compute_slowdown", "overlap_compute_slowdown", "number", required=False,
           rule="ge1"),
    _Field("overlap_comm_slowdown", "overlap_comm_slowdown", "number", required=False,
           rule="ge1"),
    _Field("iteration_cpu_overhead_s", f"iteration_cpu_overhead_{_TIME}", "number",
           required=False, rule="nonneg"),
    _Field("frontend_latency_s", f"frontend_latency_{_TIME}", "mapping", required=False),
    _Field("frontend_prompt_token_s", f"frontend_prompt_token_{_TIME}", "mapping",
           required=False),
    _Field("frontend_output_token_s", f"frontend_output_token_{_TIME}", "mapping",
           required=False),
    _Field("frontend_output_stream_s", f"frontend_output_stream_{_TIME}", "mapping",
           required=False),
    _Field("prefill_iteration_overhead_s", f"prefill_iteration_overhead_{_TIME}", "mapping",
           required=False),
    _Field("eager_kernel_host_s", f"eager_kernel_host_{_TIME}", "mapping", required=False),
    _Field("disagg_handoff_s", f"disagg_handoff_{_TIME}", "mapping", required=False),
    _Field("allocator_reserved_factor", "allocator_reserved_factor", "number", required=False,
           rule="ge1"),
    _Field("allocator_reserved_extra_bytes", f"allocator_reserved_extra_{_BYTES}", "number",
           required=False, rule="nonneg"),
    _Field("comm_buffer_bytes", f"comm_buffer_{_BYTES}", "number", required=False,
           rule="nonneg"),
    _Field("collective_launch_s", f"collective_launch_{_TIME}", "number", required=False,
           rule="nonneg"),
    _Field("provenance", "provenance", "mapping"),
)

_CLUSTER_FIELDS = (
    _Field("name", "name", "str"),
    _Field("description", "description", "str", required=False),
    _Field("source", "source", "str"),
    _Field("sources", "sources", "mapping", required=False),
    _Field("gpu", "gpu", "any"),
    _Field("num_gpus", "num_gpus", "int", rule="positive"),
    _Field("gpus_per_node", "gpus_per_node", "int", rule="positive"),
    _Field("tiers", "tiers", "list"),
    _Field("calibration", "calibration", "mapping"),
    _Field("cost_per_gpu_hour_usd", "cost_per_gpu_hour_usd", "number", rule="nonneg"),
)


def _where(file: str, path: str) -> str:
    return f"{file}: `{path}`" if path else file


def _check_value(f: _Field, value: Any, file: str, path: str, shown: Any = None) -> Any:
    """Type- and rule-check one value (already in SI); return it normalized. ``shown``: the
    value as the file wrote it (before a unit conversion), for the error message."""
    loc = _where(file, path)
    shown = value if shown is None else shown
    if f.kind in ("number", "int"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{loc} must be a number, but got {value!r}")
        if f.kind == "int":
            if float(value) != int(value):
                raise ConfigError(f"{loc} must be an integer, but got {value!r}")
            value = int(value)
        rules: dict[str, tuple[Callable[[float], bool], str]] = {
            "positive": (lambda v: v > 0, "> 0"),
            "nonneg": (lambda v: v >= 0, ">= 0"),
            "ratio": (lambda v: 0 < v <= 1, "in (0, 1]"),
            "ge1": (lambda v: v >= 1, ">= 1"),
        }
        if f.rule:
            ok, text = rules[f.rule]
            if not ok(value):
                raise ConfigError(f"{loc} must be {text}, but got {shown!r}")
        return value
    if f.kind == "str":
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{loc} must be a non-empty string, but got {value!r}")
        return value
    if f.kind == "strlist":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{loc} must be a list of strings, but got {value!r}")
        return tuple(value)
    if f.kind == "mapping":
        if not isinstance(value, Mapping):
            raise ConfigError(f"{loc} must be a mapping, but got {value!r}")
        return value
    if f.kind == "list":
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{loc} must be a non-empty list, but got {value!r}")
        return value
    return value


def _parse_block(
    raw: Any, fields: tuple[_Field, ...], file: str, path: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """Check keys of one mapping against ``fields``; convert units to SI.

    Returns ``(values by SI name, YAML key by SI name)``.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{_where(file, path)} must be a mapping, but got {type(raw).__name__}")
    by_si = {f.si_name: f for f in fields}
    allowed = ", ".join(f.yaml_hint for f in fields)
    out: dict[str, Any] = {}
    yaml_keys: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise ConfigError(f"{_where(file, path)}: keys must be strings, but got {key!r}")
        si_key, factor = _si_key(key)
        sub = f"{path}.{key}" if path else key
        f = by_si.get(si_key)
        if f is None:
            raise ConfigError(f"{_where(file, sub)} is not an allowed key; allowed: {allowed}")
        if si_key in out:
            raise ConfigError(
                f"{_where(file, sub)} sets `{si_key}` a second time (also `{yaml_keys[si_key]}`)"
            )
        written = value
        if factor != 1.0:
            if f.kind == "mapping":
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{_where(file, sub)} must be a mapping, but got {value!r}")
                value = {k: _scaled(v, factor, file, f"{sub}.{k}") for k, v in value.items()}
            else:
                value = _scaled(value, factor, file, sub)
        out[si_key] = _check_value(f, value, file, sub,
                                   written if f.kind in ("number", "int") else None)
        yaml_keys[si_key] = key
    missing = [f.yaml_hint for f in fields if f.required and f.si_name not in out]
    if missing:
        raise ConfigError(
            f"{_where(file, path) if path else file}: missing required field(s) "
            f"{', '.join(f'`{m}`' for m in missing)}; allowed: {allowed}"
        )
    return out, yaml_keys


def _si_key(key: str) -> tuple[str, float]:
    """SI name and factor of a YAML key (factor 1.0 when the key has no unit suffix)."""
    si_key, _ = to_si(key, 0.0)
    if si_key == key:
        return key, 1.0
    _, one = to_si(key, 1.0)
    return si_key, one


def _scaled(value: Any, factor: float, file: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{_where(file, path)} must be a number, but got {value!r}")
    return float(value) * factor


def _sources(raw: Mapping[str, Any], allowed_si: set[str], file: str, path: str) -> dict[str, str]:
    """Normalize a ``sources``/``provenance`` mapping to SI field names and check its keys."""
    out: dict[str, str] = {}
    for key, text in raw.items():
        si_key, _ = _si_key(str(key))
        if si_key not in allowed_si:
            raise ConfigError(
                f"{_where(file, f'{path}.{key}')} names no field of this block; "
                f"allowed: {sorted(allowed_si)}"
            )
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{_where(file, f'{path}.{key}')} must be a non-empty string")
        out[si_key] = text
    return out


def _provenance(raw: Mapping[str, Any], fields: set[str], tier_names: set[str], file: str,
                path: str) -> dict[str, str]:
    """Calibration provenance: keys are a field (``overlap_comm_slowdown``), a field with a
    detail (``collective_alpha_us.nvlink``) or ``collective.<tier>`` (α and efficiency of a
    fitted tier). Field names are normalized to SI (``collective_alpha_s.nvlink``)."""
    out: dict[str, str] = {}
    for key, text in raw.items():
        head, dot, rest = str(key).partition(".")
        where = _where(file, f"{path}.{key}")
        if head == "collective":
            if rest.partition(".")[0] not in tier_names:
                raise ConfigError(f"{where}: `collective.<tier>` must name a tier; "
                                  f"tiers: {sorted(tier_names)}")
            si_head = head
        else:
            si_head, _ = _si_key(head)
            if si_head not in fields:
                raise ConfigError(f"{where} names no calibration field; allowed: "
                                  f"{sorted(fields)} (optionally `.<detail>`) or "
                                  "`collective.<tier>`")
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{where} must be a non-empty string")
        out[si_head + dot + rest] = text
    return out


# --------------------------------------------------------------------------- GPUs
#: Ceiling of a plausible dense bf16 peak per GPU (FLOP/s): GB300 lists 2,500 TFLOP/s; 5 PFLOP/s
#: leaves a generation of headroom and still catches a misplaced decimal point.
MAX_BF16_PEAK_FLOPS = 5000e12


def _check_peaks(peak: Mapping[str, float], file: str, where: str) -> None:
    """Cross-check the peaks of one GPU (a typo in one of them, e.g. a factor 10, passes every
    per-value rule): fp16 == bf16 (same tensor-core rate on every NVIDIA part since Ampere),
    fp8 >= bf16, tf32 <= bf16, bf16 <= ``MAX_BF16_PEAK_FLOPS``."""
    tf = {k: v / 1e12 for k, v in peak.items()}
    loc = _where(file, where)
    if "bf16" in tf and "fp16" in tf and abs(tf["bf16"] - tf["fp16"]) > 1e-6 * tf["bf16"]:
        raise ConfigError(f"{loc}: fp16 and bf16 must be equal (same tensor-core rate), but "
                          f"got fp16 {tf['fp16']:g} and bf16 {tf['bf16']:g}")
    if "bf16" in tf and "fp8" in tf and tf["fp8"] < tf["bf16"]:
        raise ConfigError(f"{loc}: fp8 must be >= bf16, but got fp8 {tf['fp8']:g} < "
                          f"bf16 {tf['bf16']:g}")
    if "bf16" in tf and "tf32" in tf and tf["tf32"] > tf["bf16"]:
        raise ConfigError(f"{loc}: tf32 must be <= bf16, but got tf32 {tf['tf32']:g} > "
                          f"bf16 {tf['bf16']:g}")
    if "bf16" in tf and tf["bf16"] > MAX_BF16_PEAK_FLOPS / 1e12:
        raise ConfigError(f"{_where(file, where + '.bf16')} must be <= "
                          f"{MAX_BF16_PEAK_FLOPS / 1e12:g} (dense "
                          f"TFLOP/s per GPU), but got {tf['bf16']:g}")


def gpu_from_dict(raw: Any, *, file: str = "<dict>", path: str = "") -> GpuSpec:
    """Build a ``GpuSpec`` from a parsed GPU YAML mapping (strict; units converted).

    Besides each value's own rule, the peaks are cross-checked (``_check_peaks``)."""
    values, yaml_keys = _parse_block(raw, _GPU_FIELDS, file, path)
    p = f"{path}." if path else ""
    peak: dict[str, float] = {}
    for dtype, v in values["peak_flops_per_s"].items():
        if dtype not in DTYPES:
            raise ConfigError(
                f"{_where(file, f'{p}peak_tflops_per_s.{dtype}')} is not a known dtype; "
                f"allowed: {', '.join(DTYPES)}"
            )
        where = f"{p}peak_tflops_per_s.{dtype}"
        if isinstance(v, int | float) and not isinstance(v, bool) and not v > 0:
            # ``v`` is already in FLOP/s: say it in the file's TFLOP/s.
            raise ConfigError(f"{_where(file, where)} must be > 0, but got {v / 1e12:g}")
        peak[dtype] = float(_check_value(_Field(where, where, "number", rule="positive"), v,
                                         file, where))
    if not peak:
        raise ConfigError(f"{_where(file, f'{p}peak_tflops_per_s')} must list at least one dtype")
    _check_peaks(peak, file, f"{p}peak_tflops_per_s")
    by_dtype: dict[str, float] = {}
    for dtype, v in values.get("compute_efficiency_by_dtype", {}).items():
        where = f"{p}compute_efficiency_by_dtype.{dtype}"
        if dtype not in peak:
            raise ConfigError(f"{_where(file, where)} names a dtype without a peak; "
                              f"allowed: {sorted(peak)}")
        by_dtype[dtype] = float(_check_value(
            _Field(where, where, "number", rule="ratio"), v, file, where))
    values["compute_efficiency_by_dtype"] = by_dtype
    figures = {f.si_name for f in _GPU_FIELDS if f.figure}
    sources = _sources(values["sources"], figures, file, f"{p}sources")
    unsourced = sorted(k for k in values if k in figures and k not in sources
                       and not (k == "compute_efficiency_by_dtype" and not values[k]))
    if unsourced:
        # Name each figure by the key the file wrote (``nic_bandwidth_gbit_per_s``).
        raise ConfigError(
            f"{_where(file, f'{p}sources')} must give a source for every figure; "
            f"missing: {[yaml_keys.get(k, k) for k in unsourced]}"
        )
    kwargs = {k: v for k, v in values.items() if k not in ("peak_flops_per_s", "sources")}
    return GpuSpec(peak_flops_per_s=peak, sources=sources, **kwargs)


@functools.cache
def _gpu_files() -> dict[str, Path]:
    """Normalized GPU name -> file, for every ``gpus/*.yaml`` in the spec folders."""
    out: dict[str, Path] = {}
    for d in spec_dirs():
        for f in sorted((d / "gpus").glob("*.yaml")):
            out.setdefault(f.stem.lower(), f)
    return out


@functools.cache
def _load_gpu_file(path: Path) -> GpuSpec:
    return gpu_from_dict(read_yaml(path), file=str(path))


@functools.cache
def _alias_table() -> dict[str, str]:
    """Lower-cased name or alias -> normalized GPU name."""
    table: dict[str, str] = {}
    for name, path in _gpu_files().items():
        spec = _load_gpu_file(path)
        for alias in (name, spec.name, *spec.aliases):
            key = alias.lower()
            if key in table and table[key] != spec.name:
                raise ConfigError(
                    f"{path}: alias {alias!r} is already used by GPU {table[key]!r}"
                )
            table[key] = spec.name
    return table


def list_gpus() -> list[str]:
    """Normalized names of every GPU spec (``a100-sxm-80gb``, ``h100-sxm-80gb``...)."""
    return sorted(_load_gpu_file(p).name for p in _gpu_files().values())


def resolve_gpu_name(name: str) -> str:
    """Normalized GPU name for a name or alias (case-insensitive), or ``ConfigError``."""
    table = _alias_table()
    key = name.strip().lower()
    if key in table:
        return table[key]
    raise ConfigError(f"unknown GPU {name!r}; must be one of {list_gpus()} (or an alias)")


def load_gpu(name_or_alias: str | os.PathLike[str]) -> GpuSpec:
    """The ``GpuSpec`` of a GPU by normalized name, alias or YAML path.

    Example:
        >>> load_gpu("H100_SXM").name
        'h100-sxm-80gb'
    """
    p = Path(name_or_alias)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise ConfigError(f"GPU spec file {p} does not exist")
        spec = _load_gpu_file(p.resolve())
        _check_nccl_profile_gpu(spec, str(p), "nccl_profile_gpu")
        return spec
    spec = _find_gpu(resolve_gpu_name(str(name_or_alias)))
    _check_nccl_profile_gpu(spec, str(_gpu_path(spec.name)), "nccl_profile_gpu")
    return spec


def _gpu_path(name: str) -> Path:
    """The file of the GPU spec with normalized name ``name``."""
    for path in _gpu_files().values():
        if _load_gpu_file(path).name == name:
            return path
    raise AssertionError(f"alias table points to missing GPU {name}")  # internal invariant


def _find_gpu(name: str) -> GpuSpec:
    """The GPU spec with normalized name ``name`` (its cross-references unchecked)."""
    return _load_gpu_file(_gpu_path(name))


# --------------------------------------------------------------------------- clusters
def _tier_from_dict(raw: Any, file: str, path: str, index: int
                    ) -> tuple[TopologyTier, dict[str, str]]:
    """One tier (strict), and the YAML key of each of its fields by SI name.

    ``fabric`` may be left out where the name says it (``nvlink``, ``pcie``) and on outer tiers
    (``network``); an innermost tier of another name must state it, and only the innermost
    tier may be ``nvlink`` or ``pcie`` (or list ``nvls``, which runs in its NVSwitches)."""
    values, yaml_keys = _parse_block(raw, _TIER_FIELDS, file, path)
    algos = values.get("algorithms", ("ring", "tree"))
    if not algos:
        raise ConfigError(f"{_where(file, f'{path}.algorithms')} must list at least one "
                          f"algorithm; allowed: {', '.join(TIER_ALGORITHMS)}")
    bad = [a for a in algos if a not in TIER_ALGORITHMS]
    if bad:
        raise ConfigError(
            f"{_where(file, f'{path}.algorithms')} has unknown algorithm(s) {bad}; "
            f"allowed: {', '.join(TIER_ALGORITHMS)}"
        )
    values["algorithms"] = tuple(algos)
    name = values["name"]
    fabric = values.get("fabric")
    if fabric is None:
        if index == 0 and name not in ("nvlink", "pcie"):
            raise ConfigError(
                f"{_where(file, f'{path}.fabric')} must be given for an innermost tier not "
                f"named nvlink or pcie (got name {name!r}); allowed: {', '.join(TIER_FABRICS)}")
        fabric = name if name in ("nvlink", "pcie") else "network"
    if fabric not in TIER_FABRICS:
        raise ConfigError(f"{_where(file, f'{path}.fabric')} must be one of "
                          f"{', '.join(TIER_FABRICS)}, but got {fabric!r}")
    if index > 0 and fabric != "network":
        raise ConfigError(f"{_where(file, f'{path}.fabric')} must be network on an outer tier "
                          f"(only the innermost tier is nvlink or pcie), but got {fabric!r}")
    if "nvls" in algos and (index > 0 or fabric != "nvlink"):
        raise ConfigError(f"{_where(file, f'{path}.algorithms')} lists nvls, which runs only in "
                          "the NVSwitches of the innermost `fabric: nvlink` tier; allowed here: "
                          f"{', '.join(a for a in TIER_ALGORITHMS if a != 'nvls')}")
    values["fabric"] = fabric
    job = values.get("job_devices", 0)
    if job > values["num_devices"]:
        raise ConfigError(f"{_where(file, f'{path}.job_devices')} must be <= `num_devices` "
                          f"({values['num_devices']}), but got {job}")
    return TopologyTier(**values), yaml_keys


def _check_tiers_against_gpu(tiers: tuple[TopologyTier, ...], keys: list[dict[str, str]],
                             raws: list[Any], gpu: GpuSpec, per_node: int, file: str) -> None:
    """Cross-check the tiers with the GPU and the node size (a unit slip or a factor 10 passes
    each value's own rule): an ``nvlink`` tier's bandwidth equals the GPU's NVLink bandwidth, a
    ``pcie`` tier's is at most ``PCIE_MAX_BYTES_PER_S``, a ``network`` tier above the GPU's NIC
    bandwidth warns; the innermost domain holds whole nodes and every domain but the outermost
    whole domains of the tier below (the collective model counts group ranks per domain on that
    nesting)."""
    def shown(i: int) -> tuple[str, Any]:
        key = keys[i].get("bandwidth_bytes_per_s", "bandwidth_gbyte_per_s")
        return f"{_where(file, f'tiers[{i}].{key}')}", raws[i].get(key)

    for i, t in enumerate(tiers):
        bw = t.bandwidth_bytes_per_s
        if t.fabric == "nvlink":
            ref = gpu.nvlink_bandwidth_bytes_per_s
            if not math.isclose(bw, ref, rel_tol=1e-6):
                loc, written = shown(i)
                raise ConfigError(
                    f"{loc} must equal the NVLink bandwidth of GPU {gpu.name} "
                    f"(`nvlink_bandwidth` {ref / 1e9:g} GB/s per direction) on a `fabric: "
                    f"nvlink` tier, but got {written!r}")
        elif t.fabric == "pcie" and bw > PCIE_MAX_BYTES_PER_S:
            loc, written = shown(i)
            raise ConfigError(f"{loc} must be <= {PCIE_MAX_BYTES_PER_S / 1e9:g} GB/s (PCIe 6.0 "
                              f"x16 per direction) on a `fabric: pcie` tier, but got {written!r}")
        elif t.fabric == "network" and bw > gpu.nic_bandwidth_bytes_per_s * (1 + 1e-6):
            # A warning, not an error: the NIC belongs to the server (a B200 with ConnectX-8
            # 800G, an L40S box on 400G RoCE), but a GB/s-for-Gb/s slip lands here too.
            loc, written = shown(i)
            nic = gpu.nic_bandwidth_bytes_per_s
            warnings.warn(
                f"{loc} is above the NIC bandwidth of GPU {gpu.name} (`nic_bandwidth` "
                f"{nic * 8 / 1e9:g} Gb/s = {nic / 1e9:g} GB/s per direction): got {written!r}; "
                "check the unit (bandwidth_gbit_per_s vs bandwidth_gbyte_per_s)", stacklevel=2)
    for i, t in enumerate(tiers):
        if not t.job_devices:
            continue
        where = _where(file, f"tiers[{i}].job_devices")
        if i > 0:
            raise ConfigError(f"{where} is allowed on the innermost tier only, but tier {i} "
                              f"sets {t.job_devices}")
        if t.job_devices > t.num_devices or t.job_devices % per_node:
            raise ConfigError(f"{where} must be a multiple of `gpus_per_node` ({per_node}) "
                              f"and <= `num_devices` ({t.num_devices}), but got "
                              f"{t.job_devices}")
    if tiers[0].num_devices % per_node:
        raise ConfigError(
            f"{_where(file, 'tiers[0].num_devices')} must be a multiple of `gpus_per_node` "
            f"({per_node}): the innermost domain holds whole nodes, but got "
            f"{tiers[0].num_devices}")
    # The outermost tier may be ragged (a 127-node SuperPOD of 256-GPU leaves): it holds every
    # rank and cuts no group, so only the tiers inside it must nest.
    for i in range(1, len(tiers) - 1):
        inner, outer = tiers[i - 1].num_devices, tiers[i].num_devices
        if outer % inner:
            raise ConfigError(
                f"{_where(file, f'tiers[{i}].num_devices')} must be a multiple of "
                f"`tiers[{i - 1}].num_devices` ({inner}): each domain holds whole domains of "
                f"the tier below, but got {outer}")


def _check_nccl_profile_gpu(gpu: GpuSpec, file: str, where: str) -> None:
    """``nccl_profile_gpu`` names another GPU spec by its normalized name, on the same fabric
    (equal NVLink bandwidth), that has its own rows (no chain)."""
    twin = gpu.nccl_profile_gpu
    if not twin:
        return
    loc = _where(file, where)
    try:
        resolved = resolve_gpu_name(twin)
    except ConfigError:
        raise ConfigError(f"{loc} must name a GPU spec; allowed: "
                          f"{[g for g in list_gpus() if g != gpu.name]}, but got "
                          f"{twin!r}") from None
    if resolved != twin or resolved == gpu.name:
        raise ConfigError(f"{loc} must be the normalized name of another GPU; allowed: "
                          f"{[g for g in list_gpus() if g != gpu.name]}, but got {twin!r}")
    other = _find_gpu(resolved)
    if other.nccl_profile_gpu:
        raise ConfigError(f"{loc} must name a GPU with its own NCCL rows, but {twin} borrows "
                          f"those of {other.nccl_profile_gpu}")
    if not math.isclose(other.nvlink_bandwidth_bytes_per_s, gpu.nvlink_bandwidth_bytes_per_s,
                        rel_tol=1e-6):
        raise ConfigError(
            f"{loc} must name a GPU on the same fabric (NVLink bandwidth "
            f"{gpu.nvlink_bandwidth_bytes_per_s / 1e9:g} GB/s), but {twin} has "
            f"{other.nvlink_bandwidth_bytes_per_s / 1e9:g} GB/s")


def _calibration_from_dict(
    raw: Any, tiers: tuple[TopologyTier, ...], file: str, path: str
) -> Calibration:
    values, yaml_keys = _parse_block(raw, _CALIBRATION_FIELDS, file, path)
    by_name = {t.name: t for t in tiers}
    tier_names = set(by_name)
    alpha = values.get("collective_alpha_s", {})
    eff = values.get("collective_bw_efficiency", {})

    def written(si_name: str, key: Any) -> tuple[str, Any]:
        """(YAML key of mapping ``si_name``, the value of ``key`` as the file wrote it)."""
        ykey = yaml_keys[si_name]
        return ykey, raw[ykey][key]

    for si_name, mapping, rule in (("collective_alpha_s", alpha, "nonneg"),
                                   ("collective_bw_efficiency", eff, "ratio")):
        for key, v in mapping.items():
            block, as_written = written(si_name, key)
            where = f"{path}.{block}.{key}"
            tier, _, algo = str(key).partition(".")
            if tier not in tier_names:
                raise ConfigError(
                    f"{_where(file, where)} must be a tier name or `<tier>.<algorithm>`; "
                    f"tiers: {sorted(tier_names)}"
                )
            # pairwise (all-to-all) and p2p run on every tier; the others where it lists them
            runs = sorted({*by_name[tier].algorithms, *ALWAYS_ALGORITHMS})
            if algo and algo not in runs:
                raise ConfigError(
                    f"{_where(file, where)}: tier {tier} does not run {algo!r}; algorithms "
                    f"there: {runs}"
                )
            _check_value(_Field(block, block, "number", rule=rule), v, file, where, as_written)
    fields = {f.si_name for f in _CALIBRATION_FIELDS} - {"provenance"}
    provenance = _provenance(values["provenance"], fields, tier_names, file,
                             f"{path}.provenance")
    covered = {k.partition(".")[0] for k in provenance}
    if "collective" in covered:  # `collective.<tier>` explains that tier's α and efficiency
        covered |= {"collective_alpha_s", "collective_bw_efficiency"}
    unexplained = sorted(k for k in values if k in fields and k not in covered)
    if unexplained:
        raise ConfigError(
            f"{_where(file, f'{path}.provenance')} must say where every calibrated value comes "
            f"from (`default: <reason>` or the fit); missing: {unexplained}"
        )
    for mapping in ENGINE_KEYED_TIMES:
        per_engine = mapping.removesuffix("_s")
        given = values.get(mapping, {})
        allowed = SERVING_ENGINES + (SERVING_FRONTENDS if mapping in FRONTEND_KEYED_TIMES
                                     else ())
        for key, v in given.items():
            block, as_written = written(mapping, key)
            where = f"{path}.{block}.{key}"
            if key not in allowed:
                raise ConfigError(f"{_where(file, where)}: unknown serving engine {key!r}; "
                                  f"allowed: {', '.join(allowed)}")
            _check_value(_Field(per_engine, per_engine, "number", rule="nonneg"), v, file,
                         where, as_written)
        values[mapping] = {str(k): float(v) for k, v in given.items()}
    values["provenance"] = provenance
    values["collective_alpha_s"] = {str(k): float(v) for k, v in alpha.items()}
    values["collective_bw_efficiency"] = {str(k): float(v) for k, v in eff.items()}
    return Calibration(**values)


def cluster_from_dict(raw: Any, *, file: str = "<dict>") -> ClusterSpec:
    """Build a ``ClusterSpec`` from a parsed cluster YAML mapping (strict; units converted)."""
    values, _ = _parse_block(raw, _CLUSTER_FIELDS, file, "")
    gpu_raw = values["gpu"]
    if isinstance(gpu_raw, str):
        try:
            gpu = load_gpu(gpu_raw)
        except ConfigError as e:
            raise ConfigError(f"{_where(file, 'gpu')}: {e}") from None
    elif isinstance(gpu_raw, Mapping):
        gpu = gpu_from_dict(gpu_raw, file=file, path="gpu")
    else:
        raise ConfigError(f"{_where(file, 'gpu')} must be a GPU name or an inline GPU mapping")
    parsed = [_tier_from_dict(t, file, f"tiers[{i}]", i) for i, t in enumerate(values["tiers"])]
    tiers = tuple(t for t, _ in parsed)
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ConfigError(f"{_where(file, 'tiers')}: tier names must be unique, got {names}")
    sizes = [t.num_devices for t in tiers]
    if sizes != sorted(set(sizes)):
        raise ConfigError(
            f"{_where(file, 'tiers')}: tiers must be innermost first with strictly growing "
            f"`num_devices`, but got {sizes}"
        )
    num_gpus, per_node = values["num_gpus"], values["gpus_per_node"]
    if num_gpus % per_node:
        raise ConfigError(
            f"{file}: `gpus_per_node` must divide `num_gpus`, but got "
            f"(num_gpus={num_gpus}, gpus_per_node={per_node})"
        )
    if sizes[-1] < num_gpus:
        raise ConfigError(
            f"{_where(file, 'tiers')}: the outermost tier must hold all GPUs, but got "
            f"(num_devices={sizes[-1]}, num_gpus={num_gpus})"
        )
    _check_tiers_against_gpu(tiers, [k for _, k in parsed], values["tiers"], gpu, per_node, file)
    if isinstance(gpu_raw, Mapping):
        _check_nccl_profile_gpu(gpu, file, "gpu.nccl_profile_gpu")
    calibration = _calibration_from_dict(values["calibration"], tiers, file, "calibration")
    sources = values.get("sources", {})
    sources = _sources(sources, {f.si_name for f in _CLUSTER_FIELDS}, file, "sources")
    if "cost_per_gpu_hour_usd" not in sources:
        raise ConfigError(
            f"{_where(file, 'sources.cost_per_gpu_hour_usd')}: the price needs a source "
            "(a public price list, or `assumed list price`)"
        )
    return ClusterSpec(
        name=values["name"],
        description=values.get("description", ""),
        source=values["source"],
        sources=sources,
        gpu=gpu,
        num_gpus=num_gpus,
        gpus_per_node=per_node,
        tiers=tiers,
        calibration=calibration,
        cost_per_gpu_hour_usd=float(values["cost_per_gpu_hour_usd"]),
    )


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; unreadable or malformed files raise ``ConfigError`` naming the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except OSError as e:
        raise ConfigError(f"cannot read spec file {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: malformed YAML: {str(e).splitlines()[0]}") from e


@functools.cache
def _cluster_files() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for d in spec_dirs():
        for f in sorted(d.glob("*.yaml")):
            out.setdefault(f.stem.lower(), f)
    return out


@functools.cache
def _load_cluster_file(path: Path) -> ClusterSpec:
    spec = cluster_from_dict(read_yaml(path), file=str(path))
    return spec


def list_clusters() -> list[str]:
    """Names of every cluster spec (``dgx-h100-ib400``, ``h100-sxm-8gpu``...)."""
    return sorted(_cluster_files())


def load_cluster(name_or_path: str | os.PathLike[str]) -> ClusterSpec:
    """The ``ClusterSpec`` of a cluster by name (file stem in a spec folder) or YAML path.

    Example:
        >>> spec = load_cluster("dgx-h100-ib400")
        >>> spec.gpus_per_node, spec.tiers[0].name
        (8, 'nvlink')
    """
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise ConfigError(f"cluster spec file {p} does not exist")
        return _load_cluster_file(p.resolve())
    key = str(name_or_path).strip().lower()
    files = _cluster_files()
    if key not in files:
        raise ConfigError(
            f"unknown cluster {str(name_or_path)!r}; must be one of {list_clusters()} "
            "or a path to a YAML file"
        )
    return _load_cluster_file(files[key])


def clear_caches() -> None:
    """Forget cached spec files (tests that write specs, or after editing a YAML)."""
    for fn in (_gpu_files, _load_gpu_file, _alias_table, _cluster_files, _load_cluster_file):
        fn.cache_clear()
