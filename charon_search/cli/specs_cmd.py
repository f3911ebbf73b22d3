"""Validate GPU and cluster spec files (`specs check [FILE...]`) and print them as a table.

With no FILE, every YAML in the spec folders (the repository's ``cluster_specs/`` and
``$CHARON_CLUSTER_SPECS``) is checked. A file is a GPU spec if it has a ``peak_tflops_per_s`` key,
a cluster spec otherwise. Exit code 2 if any file is invalid (each error on one line).
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


def run(args: argparse.Namespace) -> int:
    if getattr(args, "specs_action", None) != "check":
        raise ConfigError("`specs` needs an action; allowed: check")
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
