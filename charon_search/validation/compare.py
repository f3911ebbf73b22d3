"""How a validation run's errors moved against a baseline run (``validate --baseline``).

Both runs are ``validate --json`` documents (or ``ValidationResult``s). Rows are matched by
record id and metric, and each comparison counts one row per record and metric group, as the
run's own summary does (``stats.representative_rows``): a training record's MFU and tokens/s
are one prediction, not two.

A row whose *measured* value differs between the runs compares two different data sets, not two
simulators, so it is left out and counted (``measured_changed``). A row's |error| that moved by
less than ``CHANGE_TOLERANCE`` counts as unchanged: the simulator is deterministic, so an
unchanged simulator compared with itself gives 0 better and 0 worse.

>>> base = {"records": [{"id": "a", "metric": "ttft_s", "measured": 1.0, "predicted": 0.8,
...                      "error": -0.2}], "cases": {"a": {"kind": "serving"}}}
>>> new = {"records": [{"id": "a", "metric": "ttft_s", "measured": 1.0, "predicted": 0.95,
...                     "error": -0.05}], "cases": {"a": {"kind": "serving"}}}
>>> c = compare_runs(base, new)
>>> c["groups"]["serving_ttft"]["better"], c["groups"]["serving_ttft"]["after"]["median_abs"]
(1, 0.05)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from charon_search.validation.report import format_pct, text_table
from charon_search.validation.stats import (
    METRIC_GROUPS,
    check_group_fields,
    error_stats,
    group_label,
    group_of,
    representative_rows,
)

__all__ = ["CHANGE_TOLERANCE", "compare_runs", "regressions", "render_comparison"]

#: A row whose |error| moved by less than this (a ratio: 0.001 = 0.1 point) is unchanged.
CHANGE_TOLERANCE = 1e-3


def _parts(run: Any) -> tuple[Sequence[Mapping[str, Any]], Mapping[str, Any],
                              Sequence[Mapping[str, Any]]]:
    """(rows, cases, skipped) of a ``ValidationResult`` or of its ``to_json`` dict."""
    if isinstance(run, Mapping):
        return run.get("records", []), run.get("cases", {}), run.get("skipped", [])
    return run.rows, run.cases, run.skipped


def _stats(pairs: Sequence[tuple[float, float]]) -> dict[str, Any]:
    before = [b for b, _ in pairs]
    after = [a for _, a in pairs]
    moved = [abs(a) - abs(b) for b, a in pairs]
    return {"n": len(pairs), "before": error_stats(before), "after": error_stats(after),
            "sum_abs_before": float(sum(map(abs, before))),
            "sum_abs_after": float(sum(map(abs, after))),
            "better": sum(1 for d in moved if d <= -CHANGE_TOLERANCE),
            "worse": sum(1 for d in moved if d >= CHANGE_TOLERANCE),
            "unchanged": sum(1 for d in moved if abs(d) < CHANGE_TOLERANCE)}


def compare_runs(base: Any, new: Any, *, group_by: Sequence[str] = (),
                 top: int = 10) -> dict[str, Any]:
    """Compare ``new`` against ``base`` (each a ``ValidationResult`` or ``validate --json``).

    Args:
        group_by: record fields (``stats.GROUP_FIELDS``) to break the comparison down by, read
            from ``new``'s cases (``base``'s where ``new`` lacks the record).
        top: how many of the largest improvements and regressions to list.

    Returns:
        ``{"matched", "measured_changed", "groups", "by_fields", "improved", "regressed",
        "only_base", "not_selected", "only_new"}``: ``groups`` maps each metric group with
        matched rows to ``{"n", "before", "after"`` (``stats.error_stats``), ``"sum_abs_before",
        "sum_abs_after", "better", "worse", "unchanged"}``; ``by_fields`` (with ``group_by``)
        is ``{"fields", "groups": {"<v1> / <v2>": {metric group: same}}}``; ``improved`` /
        ``regressed`` list ``{"id", "metric", "measured", "before", "after"}`` (predictions)
        with ``error_before`` / ``error_after``, largest |error| change first; ``only_base``
        lists ``{"id", "reason"}`` for records ``base`` predicted and ``new`` skipped (with
        ``new``'s reason), ``not_selected`` counts those ``new`` did not run at all (a run of
        a subset), ``only_new`` lists the ids predicted in ``new`` only.
    """
    if group_by:
        check_group_fields(group_by)
    rows_b, cases_b, _ = _parts(base)
    rows_n, cases_n, skipped_n = _parts(new)
    rep_b = {(r["id"], r["metric"]): r for r in representative_rows(rows_b)}
    rep_n = {(r["id"], r["metric"]): r for r in representative_rows(rows_n)}
    matched: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
    measured_changed = 0
    for key in sorted(rep_b.keys() & rep_n.keys()):
        b, n = rep_b[key], rep_n[key]
        if not math.isclose(float(b["measured"]), float(n["measured"]), rel_tol=1e-9):
            measured_changed += 1
            continue
        matched.append((b, n))

    def by_group(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]
                 ) -> dict[str, Any]:
        per: dict[str, list[tuple[float, float]]] = {}
        for b, n in pairs:
            per.setdefault(str(group_of(b["metric"])), []).append(
                (float(b["error"]), float(n["error"])))
        return {g: _stats(per[g]) for g in METRIC_GROUPS if g in per}

    out: dict[str, Any] = {"matched": len(matched), "measured_changed": measured_changed,
                           "groups": by_group(matched)}
    if group_by:
        keyed: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
        for b, n in matched:
            info = cases_n.get(n["id"]) or cases_b.get(b["id"]) or {}
            keyed.setdefault(group_label(info, group_by), []).append((b, n))
        out["by_fields"] = {"fields": list(group_by),
                            "groups": {k: by_group(keyed[k]) for k in sorted(keyed)}}
    def moved(pair: tuple[Mapping[str, Any], Mapping[str, Any]]) -> float:
        """How much the pair's |error| grew (negative: it shrank)."""
        return abs(float(pair[1]["error"])) - abs(float(pair[0]["error"]))

    def mover(pair: tuple[Mapping[str, Any], Mapping[str, Any]]) -> dict[str, Any]:
        b, n = pair
        return {"id": n["id"], "metric": n["metric"], "measured": float(n["measured"]),
                "before": float(b["predicted"]), "after": float(n["predicted"]),
                "error_before": float(b["error"]), "error_after": float(n["error"])}

    moves = sorted(matched, key=moved)
    out["improved"] = [mover(p) for p in moves[:top] if moved(p) <= -CHANGE_TOLERANCE]
    out["regressed"] = [mover(p) for p in reversed(moves[-top:] if top else [])
                        if moved(p) >= CHANGE_TOLERANCE]
    ids_b = {r["id"] for r in rows_b}
    ids_n = {r["id"] for r in rows_n}
    reasons = {s["id"]: str(s.get("reason", "")) for s in skipped_n}
    # A record the new run skipped lost its prediction; one it did not select is just absent.
    out["only_base"] = [{"id": i, "reason": reasons[i]} for i in sorted(ids_b - ids_n)
                        if i in reasons]
    out["not_selected"] = len([i for i in ids_b - ids_n if i not in reasons])
    out["only_new"] = sorted(ids_n - ids_b)
    return out


def _group_rows(name: str, groups: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for g, s in groups.items():
        b, a = s["before"], s["after"]
        rows.append([name, g, str(s["n"]),
                     f"{format_pct(b['median_abs'])} -> {format_pct(a['median_abs'])}",
                     f"{format_pct(b['p90_abs'])} -> {format_pct(a['p90_abs'])}",
                     f"{format_pct(b['bias'], True)} -> {format_pct(a['bias'], True)}",
                     f"{s['sum_abs_before']:.2f} -> {s['sum_abs_after']:.2f}",
                     f"{s['better']} / {s['worse']} / {s['unchanged']}"])
    return rows


def render_comparison(comp: Mapping[str, Any], *, baseline: str = "baseline") -> str:
    """Text tables of ``compare_runs`` output."""
    header = ["", "metric group", "n", "median |err|", "p90 |err|", "bias", "sum |err|",
              "better / worse / same"]
    lines = [f"against {baseline}: {comp['matched']} rows matched by record and metric"
             + (f", {comp['measured_changed']} left out (their measured value differs)"
                if comp["measured_changed"] else "")]
    lines.append(text_table(header, _group_rows("all", comp["groups"])))
    fields = comp.get("by_fields")
    if fields:
        rows = [r for k, g in fields["groups"].items() for r in _group_rows(k, g)]
        header[0] = " / ".join(fields["fields"])
        lines += ["", text_table(header, rows)]
    for title, key in (("largest improvements", "improved"), ("largest regressions",
                                                                "regressed")):
        movers = comp.get(key) or []
        if movers:
            lines += ["", f"{title} (signed error before -> after):"]
            lines += [f"  {m['id']}  {m['metric']}: {format_pct(m['error_before'], True)} -> "
                      f"{format_pct(m['error_after'], True)}" for m in movers]
    if comp.get("not_selected"):
        lines += ["", f"{comp['not_selected']} records predicted in {baseline} are not in this "
                  "run's selection"]
    if comp["only_base"]:
        lines += ["", f"predicted in {baseline}, skipped by this run "
                  f"({len(comp['only_base'])}):"]
        lines += [f"  {s['id']}: {s['reason']}" for s in comp["only_base"][:20]]
        if len(comp["only_base"]) > 20:
            lines.append(f"  ... and {len(comp['only_base']) - 20} more")
    if comp["only_new"]:
        lines += ["", f"predicted in this run only ({len(comp['only_new'])}): "
                  + ", ".join(comp["only_new"][:20])
                  + (" ..." if len(comp["only_new"]) > 20 else "")]
    return "\n".join(lines)


def regressions(comp: Mapping[str, Any], max_points: float) -> list[str]:
    """Why a gate on ``compare_runs`` output fails, one line each (empty: it passes).

    A metric group whose median or p90 |error| grew by more than ``max_points`` percentage
    points fails it; so does a record the baseline predicted and this run skipped (a simulator
    that now raises on every record must not pass), and a comparison with no matched row at
    all (nothing was compared: the ids changed, or the runs share no record)."""
    out = []
    if comp["only_base"]:
        first = comp["only_base"][0]
        out.append(f"{len(comp['only_base'])} record(s) predicted in the baseline are skipped "
                   f"by this run (first: {first['id']}: {first['reason']})")
    if not comp["matched"]:
        out.append("no row of this run matches the baseline by record id and metric, so "
                   "nothing was compared")
    for g, st in comp["groups"].items():
        for stat, name in (("median_abs", "median"), ("p90_abs", "p90")):
            before, after = st["before"][stat], st["after"][stat]
            if before is None or after is None:
                continue
            grew = (after - before) * 100
            if grew > max_points:
                out.append(f"{g} {name} |error| {before * 100:.1f}% -> {after * 100:.1f}% "
                           f"(+{grew:.1f} points > {max_points:g})")
    return out
