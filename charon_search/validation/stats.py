"""Error statistics of a validation run: per kind, per source, per metric group.

``error = (predicted - measured) / measured`` (signed ratio). A record's throughput metrics
(``tokens_per_s``, ``mfu``, ``model_tflops_per_gpu``...) are all rescalings of one predicted step
time, so summaries count one error per record and metric group (the first metric of the group's
priority list the record measures) instead of weighting a record by how many of them it prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from charon_search.validation.ranking import configuration_ordering

__all__ = ["GROUP_FIELDS", "METRIC_GROUPS", "check_group_fields", "error_stats", "group_label",
           "group_of", "grouped_summary", "request_latency_rows", "run_to_run", "summarize"]

#: Metric group -> metrics in priority order (the first one a record has represents it).
METRIC_GROUPS: dict[str, tuple[str, ...]] = {
    "training_time": (
        "step_time_s", "tokens_per_s_per_gpu", "tokens_per_s", "model_tflops_per_gpu",
        "hardware_tflops_per_gpu", "mfu", "hfu", "model_tflops_total", "hardware_tflops_total",
        "wall_time_per_trillion_tokens_s", "gpu_time_per_trillion_tokens_s",
    ),
    "training_layer_time": ("layer_forward_backward_time_s", "layer_forward_time_s",
                            "layer_backward_time_s"),
    "training_memory": ("peak_memory_bytes", "params_grads_optimizer_memory_bytes",
                        "activation_memory_bytes"),
    "serving_ttft": ("ttft_s",),
    "serving_tpot": ("tpot_s",),
    "serving_throughput": ("output_tokens_per_s", "output_tokens_per_s_per_gpu",
                           "output_tokens_per_s_per_node", "requests_per_s"),
}

#: Targets of issue 8 (median / p90 of |error|), per group, for the report.
TARGETS: dict[str, tuple[float, float | None]] = {
    "training_time": (0.05, 0.10),
    "training_memory": (0.05, None),
    "serving_ttft": (0.10, 0.20),
    "serving_tpot": (0.10, 0.20),
}


def group_of(metric: str) -> str | None:
    for group, metrics in METRIC_GROUPS.items():
        if metric in metrics:
            return group
    return None


def error_stats(errors: Sequence[float]) -> dict[str, Any]:
    """``n``, ``median_abs``, ``p90_abs``, ``max_abs``, ``bias`` (mean signed) of ratios."""
    if not errors:
        return {"n": 0, "median_abs": None, "p90_abs": None, "max_abs": None, "bias": None}
    e = np.asarray(errors, dtype=float)
    a = np.abs(e)
    return {"n": int(e.size), "median_abs": float(np.median(a)),
            "p90_abs": float(np.percentile(a, 90)), "max_abs": float(a.max()),
            "bias": float(e.mean())}


def representative_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One row per (record id, metric group): the group's highest-priority metric."""
    best: dict[tuple[str, str], tuple[int, Mapping[str, Any]]] = {}
    for r in rows:
        g = group_of(r["metric"])
        if g is None:
            continue
        prio = METRIC_GROUPS[g].index(r["metric"])
        key = (r["id"], g)
        if key not in best or prio < best[key][0]:
            best[key] = (prio, r)
    return [v[1] for v in best.values()]


def run_to_run(rep: Sequence[Mapping[str, Any]],
               records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """How far the measurements themselves move between runs, per metric group.

    ``rep``: the run's ``representative_rows`` (one metric per record and group). For every
    predicted record that reruns an earlier predicted record's setup on another day (``reruns``
    in its case, ``records.independent_reruns``), the spread of each metric the two share is
    ``|a - b| / ((a + b) / 2)``. Returns group -> ``{"pairs", "median", "p90", "max"}`` of
    those spreads and ``records``, ``error_median_abs``, ``error_p90_abs``: the prediction
    errors of the records in the pairs (only groups with pairs). A prediction that hit the mean
    of two such runs would still be off each by half their spread.
    """
    measured: dict[str, dict[str, float]] = {}
    error: dict[tuple[str, str], float] = {}
    for r in rep:
        measured.setdefault(r["id"], {})[r["metric"]] = float(r["measured"])
        error[(r["id"], r["metric"])] = float(r["error"])
    spreads: dict[str, list[float]] = {}
    errors: dict[str, dict[tuple[str, str], float]] = {}
    for rid, info in records.items():
        other = info.get("reruns") or ""
        mine, theirs = measured.get(rid, {}), measured.get(other, {})
        for metric in mine.keys() & theirs.keys():
            a, b = mine[metric], theirs[metric]
            if a + b > 0:
                g = str(group_of(metric))
                spreads.setdefault(g, []).append(abs(a - b) / ((a + b) / 2))
                for key in ((rid, metric), (other, metric)):
                    errors.setdefault(g, {})[key] = abs(error[key])
    out: dict[str, Any] = {}
    for g in METRIC_GROUPS:
        v = np.asarray(spreads.get(g, []), dtype=float)
        if v.size:
            e = np.asarray(list(errors[g].values()), dtype=float)
            out[g] = {"pairs": int(v.size), "median": float(np.median(v)),
                      "p90": float(np.percentile(v, 90)), "max": float(v.max()),
                      "records": int(e.size), "error_median_abs": float(np.median(e)),
                      "error_p90_abs": float(np.percentile(e, 90))}
    return out


def summarize(rows: Sequence[Mapping[str, Any]], skipped: Sequence[Mapping[str, Any]],
              records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Summary of a run.

    Args:
        rows: ``{"id", "metric", "measured", "predicted", "error"}`` per predicted metric.
        skipped: ``{"id", "reason"}`` per record that was not expressed.
        records: id -> ``{"kind", "source", "confidence", "fully_specified"}`` (and
            ``repeats`` / ``repeats_same_setup`` for a record whose measured values repeat an
            earlier record's, ``records.repeated_measurements``).

    Returns:
        ``{"totals", "by_kind", "by_source", "by_group", "by_group_fully_specified", ...,
        "run_to_run", "ordering"}``; each ``by_*`` entry has ``expressed``, ``total`` and the
        stats of ``error_stats`` per group; ``ordering`` is
        ``ranking.configuration_ordering`` (how well the serving configurations are ordered).
    """
    expressed = {r["id"] for r in rows}
    rep = representative_rows(rows)

    def block(filter_key: str) -> dict[str, Any]:
        return _block(rep, expressed, records, lambda info: str(info.get(filter_key)))

    by_group: dict[str, Any] = {}
    by_group_full: dict[str, Any] = {}
    for g in METRIC_GROUPS:
        grows = [r for r in rep if group_of(r["metric"]) == g]
        by_group[g] = error_stats([r["error"] for r in grows])
        by_group_full[g] = error_stats([r["error"] for r in grows
                                        if records[r["id"]].get("fully_specified")])
    return {
        "totals": {"records": len(records), "expressed": len(expressed & set(records)),
                   "skipped": len(skipped), "predicted_metrics": len(rows),
                   "repeated_measurements": sum(1 for info in records.values()
                                                if info.get("repeats")),
                   "repeated_other_setup": sum(1 for info in records.values()
                                               if info.get("repeats")
                                               and not info.get("repeats_same_setup"))},
        "by_kind": block("kind"),
        "by_source": block("source"),
        "by_gpu": block("gpu"),
        "by_model": block("model"),
        "by_group": by_group,
        "by_group_fully_specified": by_group_full,
        "run_to_run": run_to_run(rep, records),
        "ordering": configuration_ordering(rows, records),
        "targets": {g: {"median_abs": t[0], "p90_abs": t[1]} for g, t in TARGETS.items()},
    }


#: ``cases`` fields ``grouped_summary`` (``charon-search validate --group-by``) accepts.
GROUP_FIELDS = ("kind", "source", "origin", "confidence", "model", "gpu", "cluster", "engine",
                "fully_specified", "mode", "engine_version", "measured_month", "precision")


def _block(rep: Sequence[Mapping[str, Any]], expressed: set[str],
           records: Mapping[str, Mapping[str, Any]],
           key_of: Callable[[Mapping[str, Any]], str]) -> dict[str, Any]:
    """``{key: {"expressed", "total", "all", "groups"}}`` over the records grouped by
    ``key_of(case info)``; stats of the representative rows (one per record and group)."""
    ids_of: dict[str, set[str]] = {}
    for i, info in records.items():
        ids_of.setdefault(key_of(info), set()).add(i)
    errs_of: dict[str, dict[str, list[float]]] = {}
    key_of_id = {i: k for k, ids in ids_of.items() for i in ids}
    for r in rep:
        k = key_of_id.get(r["id"])
        if k is not None:
            errs_of.setdefault(k, {}).setdefault(str(group_of(r["metric"])), []).append(
                r["error"])
    out: dict[str, Any] = {}
    for key in sorted(ids_of):
        ids = ids_of[key]
        per = errs_of.get(key, {})
        groups = {g: error_stats(per[g]) for g in METRIC_GROUPS if g in per}
        out[key] = {"expressed": len(ids & expressed), "total": len(ids),
                    "all": error_stats([e for g in groups for e in per[g]]), "groups": groups}
    return out


def check_group_fields(fields: Sequence[str]) -> None:
    """Raise ``ConfigError`` unless ``fields`` is a non-empty choice of ``GROUP_FIELDS``."""
    from charon_search.errors import ConfigError

    if not fields or any(f not in GROUP_FIELDS for f in fields):
        raise ConfigError(f"group-by fields must be among {list(GROUP_FIELDS)}, but got "
                          f"{list(fields)}")


def grouped_summary(rows: Sequence[Mapping[str, Any]],
                    records: Mapping[str, Mapping[str, Any]],
                    fields: Sequence[str]) -> dict[str, Any]:
    """Stats per combination of the records' ``fields`` (``GROUP_FIELDS``; e.g. model,
    cluster, engine): ``{"fields", "groups": {"<v1> / <v2>": {"expressed", "total", "all",
    "groups"}}}`` as ``summarize``'s ``by_*`` blocks. A record without a field counts as
    ``-`` (a training record has no engine, a silicon row may name no engine version)."""
    check_group_fields(fields)
    rep = representative_rows(rows)
    expressed = {r["id"] for r in rows}
    return {"fields": list(fields),
            "groups": _block(rep, expressed, records,
                             lambda info: group_label(info, fields))}


def group_label(info: Mapping[str, Any], fields: Sequence[str]) -> str:
    """A record's group under ``fields`` (its case info's values joined by `` / ``): ``-`` for
    a field the record has not or leaves empty (a serving record without a named engine)."""
    values = (info.get(f) for f in fields)
    return " / ".join("-" if v is None or v == "" else str(v) for v in values)


def request_latency_rows(rows: Sequence[Mapping[str, Any]],
                         cases: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean request latency of the serving records that measure both TTFT and TPOT, derived the
    same way on both sides: ``e2e = ttft + (output_len - 1) * tpot`` with the record's nominal
    output length (``cases[id]["output_len"]``; records without one are left out).

    For a fixed output length (the silicon rows' clients ignore EOS) this is exactly the mean
    request latency the client saw, since TPOT is (E2E - TTFT) / (output_len - 1) per request;
    by Little's law a closed loop's throughput is concurrency / E2E, so predicted / measured
    throughput is measured / predicted E2E. It separates how much work the simulator prices
    (E2E) from how the schedule splits it between the first token and the rest.

    Returns ``{"id", "metric": "e2e_s", "measured", "predicted", "error"}`` per record.
    """
    pairs: dict[str, dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        if r["metric"] in ("ttft_s", "tpot_s"):
            pairs.setdefault(r["id"], {})[r["metric"]] = r
    out = []
    for rid, m in pairs.items():
        osl = (cases.get(rid) or {}).get("output_len")
        if len(m) < 2 or not osl:
            continue
        steps = float(osl) - 1.0
        meas = m["ttft_s"]["measured"] + steps * m["tpot_s"]["measured"]
        pred = m["ttft_s"]["predicted"] + steps * m["tpot_s"]["predicted"]
        if meas > 0:
            out.append({"id": rid, "metric": "e2e_s", "measured": meas, "predicted": pred,
                        "error": (pred - meas) / meas})
    return out
