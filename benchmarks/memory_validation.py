"""Predict every published memory measurement and print predicted vs measured.

Reads the training records that state a memory figure (``peak_memory_bytes``: the caching
allocator's peak *reserved* bytes as torchtitan prints it; ``activation_memory_bytes`` and
``params_grads_optimizer_memory_bytes`` as Korthikanti et al. chart them) from the package copy
of the published measurements, maps each to a case exactly as ``charon-search validate`` does
(``validation.translate.to_case``: layout, cluster and ``MemoryOptions`` of the framework), and
runs ``memory_report``.

``--fit-allocator`` also prints the reserved/allocated ratio of every fully specified
``peak_memory_bytes`` record, their median (how ``allocator_reserved_factor`` of the
``h100-96gb-grand-teton`` cluster was set) and the leave-one-out error of that median.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/memory_validation.py [--fit-allocator]``
(about 6 s); the last line is one JSON object. Errors in the JSON are fractions
(``predicted / measured - 1``: 0.0154 = +1.54 %; the keys end in ``_fraction``), the table on
stderr prints them in percent.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from typing import Any

#: Memory metrics of the records and the ``StageMemory`` quantity each is compared with.
METRICS = ("peak_memory_bytes", "activation_memory_bytes", "params_grads_optimizer_memory_bytes")
GIB = 2**30


def load_records() -> list[Any]:
    """Training records (variants included) that state a memory metric."""
    from charon_search.validation import default_files, load_files, select_records

    return [r for r in select_records(load_files(default_files()), kind="training")
            if any(k in r.measured for k in METRICS)]


def predict(rec: Any) -> list[dict[str, Any]]:
    """One row per memory metric of ``rec``: measured, predicted and the breakdown."""
    from charon_search.memory import memory_report
    from charon_search.validation.runner import _fully_specified
    from charon_search.validation.translate import to_case

    case = to_case(rec)
    rep = memory_report(case.model, case.layout, case.cluster, options=case.memory_options)
    st = rep.stages[rep.bottleneck_stage]
    values = {
        "peak_memory_bytes": rep.peak_reserved_bytes,
        "activation_memory_bytes": max(s.saved_activations_bytes for s in rep.stages),
        "params_grads_optimizer_memory_bytes": max(
            s.params_bytes + s.grads_bytes + s.optimizer_bytes for s in rep.stages),
    }
    rows = []
    for metric in METRICS:
        if metric not in rec.measured:
            continue
        measured = float(rec.measured[metric])
        rows.append({
            "id": rec.id, "metric": metric, "measured_gib": measured / GIB,
            "predicted_gib": values[metric] / GIB, "error": values[metric] / measured - 1,
            "allocated_gib": rep.peak_allocated_bytes / GIB,
            "fully_specified": _fully_specified(rec, case.assumptions),
            "cluster": case.cluster.name, "stage": st.stage,
            "breakdown_gib": {k: v / GIB for k, v in st.to_dict().items()
                              if k.endswith("_bytes")},
            "assumptions": {k: v for k, v in rep.assumptions.items()},
        })
    return rows


def fit_allocator(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median reserved/allocated ratio of the fully specified peak-memory rows, with the
    leave-one-out error of each row under the median of the others."""
    peak = [r for r in rows if r["metric"] == "peak_memory_bytes" and r["fully_specified"]]
    ratios = {r["id"]: r["measured_gib"] / r["allocated_gib"] for r in peak}
    loo = {}
    for r in peak:
        others = [v for k, v in ratios.items() if k != r["id"]]
        loo[r["id"]] = r["allocated_gib"] * statistics.median(others) / r["measured_gib"] - 1
    return {"ratios": ratios, "median": statistics.median(ratios.values()),
            "loo_error_fraction": loo,
            "loo_median_abs_error_fraction": statistics.median(abs(v) for v in loo.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit-allocator", action="store_true")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rows = [row for rec in load_records() for row in predict(rec)]
    for r in rows:
        flag = "*" if r["fully_specified"] else " "
        print(f"{flag} {r['id']:<52} {r['metric']:<36} measured {r['measured_gib']:6.1f} GiB "
              f"predicted {r['predicted_gib']:6.1f} GiB (alloc {r['allocated_gib']:6.1f})  "
              f"{100 * r['error']:+6.1f} %", file=sys.stderr)
    peak = [abs(r["error"]) for r in rows
            if r["metric"] == "peak_memory_bytes" and r["fully_specified"]]
    out: dict[str, Any] = {
        "bench": "memory_validation", "n": len(rows),
        "peak_fully_specified_n": len(peak),
        "errors_are": "fractions: predicted / measured - 1 (rows' `error` as well)",
        "peak_fully_specified_median_abs_error_fraction":
            statistics.median(peak) if peak else None,
        "median_abs_error_fraction": statistics.median(abs(r["error"]) for r in rows),
        "max_abs_error_fraction": max(abs(r["error"]) for r in rows), "rows": rows,
    }
    if args.fit_allocator:
        fit = fit_allocator(rows)
        for k, v in fit["ratios"].items():
            print(f"  reserved/allocated {k:<52} {v:.3f}  leave-one-out error "
                  f"{100 * fit['loo_error_fraction'][k]:+.1f} %", file=sys.stderr)
        print(f"  median ratio {fit['median']:.4f}; leave-one-out median |error| "
              f"{100 * fit['loo_median_abs_error_fraction']:.1f} %", file=sys.stderr)
        out["allocator_fit"] = fit
    print(json.dumps(out))


if __name__ == "__main__":
    main()
