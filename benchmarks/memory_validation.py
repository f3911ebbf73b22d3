"""Predict every published peak-memory measurement and print predicted vs measured.

Reads the training records with ``measured.peak_memory_bytes`` from the package copy of the
published measurements (``charon_search/data/validation/published-dev.yaml``, shipped by the
validation area); all are torchtitan runs, whose ``Memory(GiB)`` is the caching allocator's
peak *reserved* bytes.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/memory_validation.py``; the last line is
one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from charon_search.layout import Layout
from charon_search.memory import MemoryOptions

#: GPU key of the records -> cluster spec with that GPU.
CLUSTER_FOR_GPU = {"h100-sxm-96gb-500w": "h100-96gb-grand-teton",
                   "h200-sxm-141gb": "h200-sxm-8gpu", "h100-sxm-80gb": "h100-sxm-8gpu"}


def load_records(path: Path | None = None) -> list[dict[str, Any]]:
    """Training records with ``measured.peak_memory_bytes`` from the shipped validation data."""
    if path is None:
        import charon_search

        root = Path(next(iter(charon_search.__path__)))
        path = root / "data" / "validation" / "published-dev.yaml"
    data = yaml.safe_load(path.read_text())
    out = []
    for r in data["records"]:
        if r["kind"] != "training" or "peak_memory_bytes" not in r["measured"]:
            continue
        out.append({
            "id": r["id"], "catalog": r["model"]["catalog"], "gpu": r["hardware"]["gpu"],
            "num_gpus": r["hardware"]["num_gpus"], "training": r["training"],
            "extra": r["training"].get("extra") or {},
            "peak_memory_bytes": r["measured"]["peak_memory_bytes"],
        })
    return out


def record_setup(rec: dict[str, Any]) -> tuple[Layout, MemoryOptions, list[str]]:
    """Layout and modelling options of a torchtitan record, with the assumptions made."""
    t, extra = rec["training"], rec.get("extra", {})
    notes: list[str] = []
    mbs = t["micro_batch_size"]
    if mbs is None:
        # torchtitan's pipeline_parallel_microbatch_size defaults to 1: the local batch is
        # split into local_batch_size micro-batches.
        mbs = 1
        notes.append("micro_batch_size=1 (torchtitan PP default)")
    layout = Layout(
        tp=t["tp"], pp=t["pp"], dp=t["dp"], cp=t["cp"], ep=t["ep"], vpp=t["vpp"] or 1,
        sequence_parallel=bool(t["sequence_parallel"]), zero_stage=t["zero_stage"],
        schedule=t["schedule"], micro_batch_size=mbs, global_batch_size=t["global_batch_size"],
        seq_len=t["seq_len"], recompute=t["recompute"], precision=t["precision"],
        async_tp=bool(t["async_tp"]),
    )
    # torchtitan: FSDP2 state, per-op SAC ("op"), torchao float8 saving bf16 GEMM inputs.
    overrides = {}
    if extra.get("selective_ac_option", "op") != "op":
        overrides["selective_policy"] = "attention"
    opts = MemoryOptions.for_framework(extra.get("framework"), **overrides)
    if extra.get("torch_compile"):
        notes.append("torch.compile fusion not modelled")
    return layout, opts, notes


def predict(rec: dict[str, Any]) -> dict[str, Any]:
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster
    from charon_search.memory import memory_report

    layout, opts, notes = record_setup(rec)
    rep = memory_report(load_model(rec["catalog"]), layout, load_cluster(
        CLUSTER_FOR_GPU[rec["gpu"]]), options=opts)
    measured = rec["peak_memory_bytes"]
    return {
        "id": rec["id"],
        "measured_gib": measured / 2**30,
        "predicted_reserved_gib": rep.peak_reserved_bytes / 2**30,
        "predicted_allocated_gib": rep.peak_allocated_bytes / 2**30,
        "error": rep.peak_reserved_bytes / measured - 1,
        "stage": rep.bottleneck_stage,
        "breakdown_gib": {k: v / 2**30 for k, v in rep.stages[rep.bottleneck_stage].to_dict()
                          .items() if k.endswith("_bytes")},
        "assumptions": notes,
    }


def main() -> None:
    rows = [predict(r) for r in load_records()]
    for r in rows:
        print(f"{r['id']:<58} measured {r['measured_gib']:6.1f} GiB  predicted "
              f"{r['predicted_reserved_gib']:6.1f} GiB (alloc {r['predicted_allocated_gib']:6.1f})"
              f"  {100 * r['error']:+6.1f} %", file=sys.stderr)
    errs = [abs(r["error"]) for r in rows]
    print(json.dumps({"bench": "memory_validation", "n": len(rows),
                      "mean_abs_error": sum(errs) / len(errs), "max_abs_error": max(errs),
                      "rows": rows}))


if __name__ == "__main__":
    main()
