"""Validate GPU and cluster spec files (`specs check [FILE...]`) or show one (`specs show NAME`).

`check`: with no FILE, every YAML in the spec folders (the repository's ``cluster_specs/`` and
``$CHARON_CLUSTER_SPECS``) is checked. A file is a GPU spec if it has a ``peak_tflops_per_s`` key,
a cluster spec otherwise. Exit code 2 if any file is invalid (each error on one line).
`show`: a GPU (name or alias) or cluster (name or path) with every figure and its source.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from charon_search.errors import ConfigError
from charon_search.units import format_bytes

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="specs_action", metavar="ACTION")
    check = sub.add_parser("check", help="validate spec files (all by default)")
    check.add_argument("files", nargs="*", type=Path, help="GPU or cluster YAML files")
    show = sub.add_parser("show", help="print one GPU or cluster with its sources")
    show.add_argument("name", help="GPU name/alias, cluster name, or a YAML path")


def _all_files() -> list[Path]:
    from charon_search.hardware.loader import spec_dirs

    out: list[Path] = []
    for d in spec_dirs():
        out += sorted((d / "gpus").glob("*.yaml")) + sorted(d.glob("*.yaml"))
    return out


def _check_one(path: Path) -> tuple[str, str, str]:
    """(kind, name, summary) of a valid file; raises ConfigError otherwise."""
    from charon_search.hardware.loader import cluster_from_dict, gpu_from_dict, read_yaml

    raw = read_yaml(path)
    if isinstance(raw, dict) and "peak_tflops_per_s" in raw:
        gpu = gpu_from_dict(raw, file=str(path))
        summary = (f"{gpu.peak_flops('bf16') / 1e12:.0f} TFLOP/s bf16, "
                   f"{format_bytes(gpu.hbm_capacity_bytes)}, "
                   f"{gpu.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s")
        return "gpu", gpu.name, summary
    cluster = cluster_from_dict(raw, file=str(path))
    tiers = " > ".join(
        f"{t.name}:{t.num_devices}@{t.bandwidth_bytes_per_s / 1e9:g}GB/s" for t in cluster.tiers
    )
    return "cluster", cluster.name, f"{cluster.num_gpus}x {cluster.gpu.name}; {tiers}"


def _show(name: str) -> None:
    from charon_search.hardware import list_clusters, list_gpus, load_cluster, load_gpu
    from charon_search.units import format_seconds

    path = Path(name)
    is_cluster = (name.lower() in list_clusters()
                  or (path.is_file() and "peak_tflops_per_s" not in path.read_text()))
    if is_cluster:
        gpu = load_cluster(name).gpu
    else:
        try:
            gpu = load_gpu(name)
        except ConfigError as e:
            if path.suffix in (".yaml", ".yml"):
                raise
            import difflib

            close = difflib.get_close_matches(name.lower(), [*list_clusters(), *list_gpus()],
                                              n=3)
            hint = f"did you mean {close}? " if close else ""
            raise ConfigError(f"unknown GPU or cluster {name!r}; {hint}clusters: "
                              f"{list_clusters()}; GPUs: {list_gpus()} (or an alias)") from e
    if is_cluster:
        c = load_cluster(name)
        print(f"cluster {c.name}: {c.num_gpus} GPUs, {c.gpus_per_node} per node, "
              f"${c.cost_per_gpu_hour_usd:g}/GPU-hour")
        print(f"  source: {c.source}")
        for k, v in c.sources.items():
            print(f"  source of {k}: {v}")
        for t in c.tiers:
            over = f", oversubscription 1:{t.oversubscription:g}" if t.oversubscription > 1 else ""
            print(f"  tier {t.name}: {t.num_devices} devices, "
                  f"{t.bandwidth_bytes_per_s / 1e9:g} GB/s per GPU per direction, "
                  f"latency {format_seconds(t.latency_s)}, {'/'.join(t.algorithms)}{over}")
            print(f"    source: {t.source}")
        cal = c.calibration
        print("  calibration:")
        for field in ("collective_launch_s", "collective_alpha_s", "collective_bw_efficiency",
                      "overlap_compute_slowdown", "overlap_comm_slowdown",
                      "iteration_cpu_overhead_s", "allocator_reserved_factor",
                      "allocator_reserved_extra_bytes", "comm_buffer_bytes"):
            value = getattr(cal, field)
            if isinstance(value, dict):
                value = ", ".join(f"{k}: {v:g}" for k, v in value.items())
            print(f"    {field} = {value}")
        for k, v in cal.provenance.items():
            print(f"    provenance of {k}: {v}")
    print(f"gpu {gpu.name} ({', '.join(gpu.aliases)})")
    peaks = ", ".join(f"{d} {v / 1e12:g}" for d, v in gpu.peak_flops_per_s.items())
    print(f"  peak dense TFLOP/s: {peaks}")
    print(f"  HBM {format_bytes(gpu.hbm_capacity_bytes)} at "
          f"{gpu.hbm_bandwidth_bytes_per_s / 1e12:g} TB/s; NVLink "
          f"{gpu.nvlink_bandwidth_bytes_per_s / 1e9:g} GB/s, NIC "
          f"{gpu.nic_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s per direction; {gpu.num_sms} SMs")
    print(f"  roofline: compute efficiency {gpu.compute_efficiency:g}, memory efficiency "
          f"{gpu.memory_efficiency:g}, launch {format_seconds(gpu.launch_overhead_s)}")
    for k, v in gpu.sources.items():
        print(f"  source of {k}: {v}")


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "specs_action", None)
    if action == "show":
        _show(args.name)
        return 0
    if action != "check":
        raise ConfigError("`specs` needs an action; allowed: check, show")
    files = list(args.files) or _all_files()
    if not files:
        raise ConfigError("no spec files found (cluster_specs/ or $CHARON_CLUSTER_SPECS)")
    rows: list[tuple[str, str, str, str]] = []
    errors: list[str] = []
    for path in files:
        try:
            kind, name, summary = _check_one(path)
            rows.append(("ok", kind, name, summary))
        except ConfigError as e:
            rows.append(("FAIL", "?", path.name, str(e).splitlines()[0][:120]))
            errors.append(str(e))
    w_kind = max(len(r[1]) for r in rows)
    w_name = max(len(r[2]) for r in rows)
    print(f"{'status':<6} {'kind':<{w_kind}} {'name':<{w_name}} summary")
    for status, kind, name, summary in rows:
        print(f"{status:<6} {kind:<{w_kind}} {name:<{w_name}} {summary}")
    for message in errors:
        print(f"charon-search specs: error: {message}", file=sys.stderr)
    print(f"{len(rows) - len(errors)} of {len(rows)} spec files valid")
    return 2 if errors else 0
