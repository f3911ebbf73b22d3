"""Text, HTML and markdown renderings of a ``ValidationResult``."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from charon_search.validation.ranking import ordering_lines
from charon_search.validation.runner import ValidationResult
from charon_search.validation.stats import METRIC_GROUPS, error_stats, request_latency_rows

__all__ = ["format_pct", "render_html", "render_text", "summary_table_rows", "text_table"]


def format_pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def _num(x: float) -> str:
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1e6 or a < 1e-3:
        return f"{x:.4g}"
    return f"{x:.4g}"


def summary_table_rows(summary: Mapping[str, Any], by: str) -> list[list[str]]:
    """Rows ``[name, expressed/total, group, n, median, p90, max, bias]`` of one block."""
    return block_table_rows(summary.get(by, {}))


def block_table_rows(blocks: Mapping[str, Any]) -> list[list[str]]:
    """Rows ``[name, expressed/total, group, n, median, p90, max, bias]`` of a ``by_*`` block
    (``stats.summarize``) or of ``stats.grouped_summary``'s ``groups``."""
    out = []
    for name, block in blocks.items():
        groups = block.get("groups") or {}
        if not groups:
            out.append([name, f"{block['expressed']}/{block['total']}", "-", "0", "-", "-", "-",
                        "-"])
            continue
        for g, st in groups.items():
            out.append([name, f"{block['expressed']}/{block['total']}", g, str(st["n"]),
                        format_pct(st["median_abs"]), format_pct(st["p90_abs"]),
                        format_pct(st["max_abs"]), format_pct(st["bias"], signed=True)])
    return out


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in header]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def render_grouped(grouped: Mapping[str, Any]) -> str:
    """The table of ``stats.grouped_summary`` (``charon-search validate --group-by``)."""
    header = ["", "expressed", "group", "n", "median|e|", "p90|e|", "max|e|", "bias"]
    return (f"\nby {' / '.join(grouped['fields'])}\n"
            + text_table(header, block_table_rows(grouped["groups"])))


def _reason_lines(items: Sequence[tuple[str, str]], top: int = 25) -> list[str]:
    """One line per reason, most frequent first: its count and the first ids it covers; the
    reasons past ``top`` in one closing line (every id is in --json)."""
    by_reason: dict[str, list[str]] = {}
    for what, reason in items:
        by_reason.setdefault(reason, []).append(what)
    ranked = sorted(by_reason.items(), key=lambda kv: -len(kv[1]))
    out = []
    for reason, whats in ranked[:top]:
        first = ", ".join(whats[:2]) + (", ..." if len(whats) > 2 else "")
        out.append(f"  {len(whats):5d} x {reason}  [{first}]")
    rest = ranked[top:]
    if rest:
        out.append(f"  ... {sum(len(w) for _, w in rest)} more under {len(rest)} other "
                   "reason(s) (use --json for all)")
    return out


def render_text(result: ValidationResult, *, max_rows: int | None = 200) -> str:
    """Per-record table, skipped records with reasons, and the summary tables."""
    parts = []
    rows = [[r["id"], r["metric"], _num(r["measured"]), _num(r["predicted"]),
             format_pct(r["error"], signed=True),
             str(result.cases.get(r["id"], {}).get("cluster", ""))] for r in result.rows]
    shown = rows if max_rows is None else rows[:max_rows]
    if shown or max_rows != 0:
        parts.append(text_table(["id", "metric", "measured", "predicted", "error", "cluster"],
                                shown))
    if len(shown) < len(rows):
        parts.append(f"... {len(rows) - len(shown)} more rows (use --json for all)")
    assumed = [(rid, c["assumptions"]) for rid, c in result.cases.items()
               if c.get("assumptions") and c.get("origin") == "published" and not c.get("skipped")]
    if assumed:
        parts.append("\nassumptions (published records; silicon rows: see --json)")
        for rid, notes in assumed:
            parts.append(f"  {rid}: " + "; ".join(notes))
    if result.skipped:
        parts.append(f"\nnot expressed: {len(result.skipped)} records")
        parts += _reason_lines([(s["id"], s["reason"]) for s in result.skipped])
    if result.skipped_metrics:
        parts.append(f"\nmeasured metrics not compared: {len(result.skipped_metrics)}")
        parts += _reason_lines([(f"{s['id']} {s['metric']}", s["reason"])
                                for s in result.skipped_metrics])
    s = result.summary
    t = s.get("totals", {})
    parts.append("\n" + totals_line(t))
    if t.get("repeated_measurements"):
        parts.append(f"repeated measurements: {t['repeated_measurements']} records repeat an "
                     f"earlier record's measured values ({t.get('repeated_other_setup', 0)} under "
                     "another model or configuration; `repeats` in --json cases); all are "
                     "predicted and counted")
    for g, rr in s.get("run_to_run", {}).items():
        parts.append(f"run to run ({g}): {rr['pairs']} pairs of runs of one setup on different "
                     f"days differ by median {format_pct(rr['median'])}, p90 "
                     f"{format_pct(rr['p90'])}; predictions of those {rr['records']} records: "
                     f"median |e| {format_pct(rr['error_median_abs'])}, p90 "
                     f"{format_pct(rr['error_p90_abs'])}")
    order = ordering_lines(s.get("ordering") or {})
    if order:
        parts.append("\nordering of serving configurations (what a search relies on)")
        parts += [f"  {line}" for line in order]
    header = ["", "expressed", "group", "n", "median|e|", "p90|e|", "max|e|", "bias"]
    parts.append("\nby kind\n" + text_table(header, summary_table_rows(s, "by_kind")))
    parts.append("\nby source\n" + text_table(header, summary_table_rows(s, "by_source")))
    grp = []
    for g in METRIC_GROUPS:
        for label, key in (("all", "by_group"), ("fully specified", "by_group_fully_specified")):
            st = s.get(key, {}).get(g)
            if st and st["n"]:
                tgt = s.get("targets", {}).get(g, {})
                grp.append([g, label, str(st["n"]), format_pct(st["median_abs"]),
                            format_pct(st["p90_abs"]), format_pct(st["max_abs"]),
                            format_pct(st["bias"], signed=True),
                            f"{format_pct(tgt.get('median_abs'))}/"
                            f"{format_pct(tgt.get('p90_abs'))}" if tgt else "-"])
    parts.append("\nby metric group\n" + text_table(
        ["group", "records", "n", "median|e|", "p90|e|", "max|e|", "bias", "target med/p90"],
        grp))
    e2e = error_stats([r["error"] for r in request_latency_rows(result.rows, result.cases)])
    if e2e["n"]:
        parts.append(f"serving request latency E2E = TTFT + (osl - 1) x TPOT (derived, "
                     f"{e2e['n']} records): median|e| {format_pct(e2e['median_abs'])}, p90|e| "
                     f"{format_pct(e2e['p90_abs'])}, bias {format_pct(e2e['bias'], signed=True)}")
    parts.append(f"\nwall time {result.wall_s:.1f} s")
    return "\n".join(parts)


def totals_line(t: Mapping[str, Any]) -> str:
    """``records N: expressed E, skipped S; predicted metrics M`` of ``summary["totals"]``."""
    return (f"records {t.get('records')}: expressed {t.get('expressed')}, skipped "
            f"{t.get('skipped')}; predicted metrics {t.get('predicted_metrics')}")


def render_html(result: ValidationResult) -> str:
    """A self-contained HTML page: summary tables, per-record table, skipped records."""
    esc = html.escape

    def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
        h = "".join(f"<th>{esc(c)}</th>" for c in header)
        body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>"
                       for r in rows)
        return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"

    s = result.summary
    header = ["", "expressed", "group", "n", "median |err|", "p90 |err|", "max |err|", "bias"]
    rec_rows = []
    for r in result.rows:
        info = result.cases.get(r["id"], {})
        rec_rows.append([r["id"], r["metric"], _num(r["measured"]), _num(r["predicted"]),
                         format_pct(r["error"], signed=True), info.get("cluster", ""),
                         "; ".join(info.get("assumptions", []))])
    skip_rows = [[x["id"], x["reason"]] for x in result.skipped]
    metric_rows = [[x["id"], x["metric"], x["reason"]] for x in result.skipped_metrics]
    order = ordering_lines(s.get("ordering") or {})
    order_html = ("<h2>Ordering of serving configurations</h2>"
                  + "".join(f"<p>{esc(line)}</p>" for line in order)) if order else ""
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;text-align:left}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>charon-search validate"
        f"</title><style>{style}</style></head><body><h1>charon-search validate</h1>"
        f"<p>{esc(totals_line(s.get('totals') or {}))}</p>"
        f"<h2>By kind</h2>{table(header, summary_table_rows(s, 'by_kind'))}"
        f"<h2>By source</h2>{table(header, summary_table_rows(s, 'by_source'))}"
        f"{order_html}"
        f"<h2>Records</h2>{table(['id', 'metric', 'measured', 'predicted', 'error', 'cluster', 'assumptions'], rec_rows)}"  # noqa: E501
        f"<h2>Not expressed</h2>{table(['id', 'reason'], skip_rows)}"
        f"<h2>Measured metrics not compared</h2>"
        f"{table(['id', 'metric', 'reason'], metric_rows)}"
        "</body></html>"
    )
