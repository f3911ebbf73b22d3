"""Per-GPU memory of a training layout, per pipeline stage, without timing.

Example::

    charon-search memory --model llama-3.1-70b --cluster dgx-h100-ib400 \\
        --gpus 64 --tp 8 --pp 4 --dp 2 --schedule 1f1b --sp --zero 1 \\
        --mbs 1 --gbs 64 --seq 8192 --recompute selective --json mem.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from charon_search.errors import ConfigError
from charon_search.layout import PRECISIONS, RECOMPUTE_MODES, SCHEDULES, Layout
from charon_search.units import format_bytes

__all__ = ["add_arguments", "add_layout_arguments", "layout_from_args", "run"]

#: Flag -> Layout field for the layout flags shared with `charon-search train`.
_FLAG_FIELDS = {
    "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "vpp": "vpp",
    "schedule": "schedule", "sp": "sequence_parallel", "zero": "zero_stage",
    "mbs": "micro_batch_size", "gbs": "global_batch_size", "seq": "seq_len",
    "recompute": "recompute", "precision": "precision",
}


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """The layout flags of `train` (a `--layout` YAML, overridden by individual flags)."""
    g = parser.add_argument_group("layout")
    g.add_argument("--layout", type=Path, help="layout YAML (keys of charon_search.Layout)")
    g.add_argument("--gpus", type=int, help="GPUs in the job; dp defaults to gpus/(tp*pp*cp)")
    for flag in ("tp", "pp", "dp", "cp", "ep", "vpp"):
        g.add_argument(f"--{flag}", type=int, help=f"{flag} degree")
    g.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule")
    g.add_argument("--sp", action="store_true", default=None, help="sequence parallelism")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage")
    g.add_argument("--mbs", type=int, help="micro-batch size (sequences)")
    g.add_argument("--gbs", type=int, help="global batch size (sequences)")
    g.add_argument("--seq", type=int, help="sequence length (tokens)")
    g.add_argument("--recompute", choices=RECOMPUTE_MODES, help="activation recompute")
    g.add_argument("--precision", choices=PRECISIONS, help="GEMM precision")


def layout_from_args(args: argparse.Namespace) -> Layout:
    """Build a ``Layout`` from ``--layout`` plus flag overrides; ``--gpus`` fills in ``dp``."""
    data: dict[str, Any] = {}
    if args.layout is not None:
        import yaml

        try:
            loaded = yaml.safe_load(args.layout.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"--layout {args.layout}: cannot read YAML ({e})") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"--layout {args.layout}: must be a mapping of Layout fields")
        data.update(loaded.get("layout", loaded))
    for flag, name in _FLAG_FIELDS.items():
        value = getattr(args, flag, None)
        if value is not None:
            data[name] = value
    gpus = getattr(args, "gpus", None)
    if gpus is not None and "dp" not in data:
        other = data.get("tp", 1) * data.get("pp", 1) * data.get("cp", 1)
        if gpus % other:
            raise ConfigError(f"`tp * pp * cp` must divide --gpus, but got "
                              f"(gpus={gpus}, tp*pp*cp={other})")
        data["dp"] = gpus // other
    if data.get("pp", 1) > 1 and "schedule" not in data:
        data["schedule"] = "1f1b"
    if "global_batch_size" not in data:
        data["global_batch_size"] = data.get("micro_batch_size", 1) * data.get("dp", 1)
    layout = Layout.from_dict(data, where="layout")
    if gpus is not None and layout.num_gpus != gpus:
        raise ConfigError(f"`tp * pp * dp * cp == gpus` must hold, but got "
                          f"(product={layout.num_gpus}, gpus={gpus})")
    return layout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="catalog name or HF config path")
    parser.add_argument("--cluster", required=True, help="cluster name or YAML path")
    add_layout_arguments(parser)
    parser.add_argument("--json", type=Path, dest="json_path", help="write the report as JSON")


def run(args: argparse.Namespace) -> int:
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster
    from charon_search.memory import memory_report

    spec = load_model(args.model)
    cluster = load_cluster(args.cluster)
    layout = layout_from_args(args)
    rep = memory_report(spec, layout, cluster)
    print(f"{spec.name} on {cluster.gpu.name} ({format_bytes(rep.device_memory_bytes)}); "
          f"tp={layout.tp} pp={layout.pp} dp={layout.dp} cp={layout.cp} ep={layout.ep} "
          f"zero={layout.zero_stage} mbs={layout.micro_batch_size} seq={layout.seq_len} "
          f"recompute={layout.recompute}")
    cols = ("params", "grads", "optimizer", "activations", "buffers", "allocated", "reserved")
    print(f"{'stage':>5} " + " ".join(f"{c:>11}" for c in cols))
    for st in rep.stages:
        vals = (st.params_bytes, st.grads_bytes, st.optimizer_bytes, st.activations_bytes,
                st.buffers_bytes, st.peak_allocated_bytes, st.peak_reserved_bytes)
        print(f"{st.stage:>5} " + " ".join(f"{format_bytes(v):>11}" for v in vals))
    verdict = "fits" if rep.fits else f"does not fit: {rep.reason}"
    print(f"peak reserved {format_bytes(rep.peak_reserved_bytes)} "
          f"(stage {rep.bottleneck_stage}); {verdict}")
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(rep.to_dict(), indent=2) + "\n")
    return 0
