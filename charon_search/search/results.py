"""Search outputs: flat trial rows, ``trials.parquet``, ``pareto.parquet`` and ``pareto.html``.

Rows are built from the study's storage (not from driver memory), so the files show exactly what
the storage holds. Each trial's user attributes carry its config (``c:<key>``) and its record
(``m:<key>``: metrics plus bookkeeping such as ``feasible``, ``prune_reason``, ``worker_id``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from charon_search.search.pareto import non_dominated

if TYPE_CHECKING:
    import optuna

    from charon_search.search.objective import Objective
    from charon_search.search.space import SearchSpace

__all__ = ["CONFIG_PREFIX", "RECORD_PREFIX", "pareto_rows", "trial_rows", "write_outputs"]

CONFIG_PREFIX = "c:"
RECORD_PREFIX = "m:"
#: Columns every trial row has, first in the Parquet file.
BASE_COLUMNS = ("trial_number", "uid", "feasible", "valid", "prune_reason",
                "constraint_violation", "memo_hit", "error", "eval_wall_s", "worker_id",
                "node_id", "family")


def split_attrs(attrs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """User attributes -> (config, record)."""
    cfg = {k[len(CONFIG_PREFIX):]: v for k, v in attrs.items() if k.startswith(CONFIG_PREFIX)}
    rec = {k[len(RECORD_PREFIX):]: v for k, v in attrs.items() if k.startswith(RECORD_PREFIX)}
    return cfg, rec


def trial_rows(trials: Sequence[optuna.trial.FrozenTrial], objective: Objective,
               space: SearchSpace | None = None) -> list[dict[str, Any]]:
    """One flat row per finished trial: config columns, metrics, feasibility, bookkeeping."""
    rows = []
    for t in trials:
        if not t.state.is_finished():
            continue
        cfg, rec = split_attrs(t.user_attrs)
        row: dict[str, Any] = {"trial_number": t.number}
        row.update(cfg)
        for k, v in rec.items():
            if k in cfg and cfg[k] != v:
                row[f"{k}_metric"] = v
            else:
                row.setdefault(k, v)
        if space is not None:
            row["family"] = space.family_of(cfg)
        rows.append(row)
    return rows


def pareto_rows(rows: Sequence[Mapping[str, Any]], objective: Objective,
                config_keys: Sequence[str]) -> list[dict[str, Any]]:
    """Feasible non-dominated rows, de-duplicated.

    A config proposed twice (memo hit) appears once, and configs with identical objective values
    (knobs that do not matter for this workload) are collapsed into the earliest trial, with
    ``num_equivalent`` counting the distinct configs it stands for.
    """
    seen: set[tuple] = set()
    by_values: dict[tuple, int] = {}
    cands: list[Mapping[str, Any]] = []
    losses: list[list[float]] = []
    counts: list[int] = []
    for r in sorted(rows, key=lambda r: r["trial_number"]):
        if not r.get("feasible"):
            continue
        vals = objective.values(r)
        if vals is None:
            continue
        key = tuple(repr(r.get(k)) for k in config_keys)
        if key in seen:
            continue
        seen.add(key)
        vkey = tuple(vals)
        if vkey in by_values:
            counts[by_values[vkey]] += 1
            continue
        by_values[vkey] = len(cands)
        cands.append(r)
        losses.append(objective.minimized(vals))
        counts.append(1)
    idx = non_dominated(losses)
    front = [{**cands[i], "num_equivalent": counts[i]} for i in idx]
    return sorted(front, key=lambda r: [r[m] for m in objective.metrics])


def _column_type(values: list[Any]) -> Any:
    import pyarrow as pa

    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return pa.null()
    if kinds <= {bool}:
        return pa.bool_()
    if kinds <= {int}:
        return pa.int64()
    if kinds <= {int, float, bool}:
        return pa.float64()
    return pa.string()


def to_table(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Rows with differing keys -> a pyarrow Table (missing values null, mixed types coerced)."""
    import pyarrow as pa

    names: list[str] = [c for c in BASE_COLUMNS if any(c in r for r in rows)]
    for r in rows:
        for k in r:
            if k not in names:
                names.append(k)
    cols = {}
    for name in names:
        vals = [r.get(name) for r in rows]
        typ = _column_type(vals)
        if typ == pa.string():
            vals = [None if v is None else str(v) for v in vals]
        elif typ == pa.float64():
            vals = [None if v is None else float(v) for v in vals]
        cols[name] = pa.array(vals, type=typ)
    return pa.table(cols) if cols else pa.table({"trial_number": pa.array([], pa.int64())})


def write_parquet(rows: Sequence[Mapping[str, Any]], path: Path,
                  transform: Callable[[Any], Any] | None = None) -> None:
    """``rows`` as a Parquet file (``to_table``; ``transform`` may recast the table first)."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = to_table(rows)
    pq.write_table(table if transform is None else transform(table), path)


def write_pareto_html(rows: Sequence[Mapping[str, Any]], front: Sequence[Mapping[str, Any]],
                      objective: Objective, config_keys: Sequence[str], path: Path,
                      title: str) -> None:
    """Plotly scatter of the feasible trials (grey) and the front coloured by config family.

    The plotly.js bundle is embedded (``include_plotlyjs=True``) so the file opens offline.
    """
    import plotly.graph_objects as go

    metrics = list(objective.metrics)
    x_m = metrics[0]
    y_m = metrics[1] if len(metrics) > 1 else "trial_number"

    def hover(r: Mapping[str, Any]) -> str:
        parts = [f"trial {r['trial_number']}"]
        parts += [f"{k}={r.get(k)}" for k in config_keys]
        parts += [f"{m}={_fmt(r.get(m))}" for m in metrics]
        return "<br>".join(parts)

    fig = go.Figure()
    feas = [r for r in rows if r.get("feasible") and objective.values(r) is not None]
    if feas:
        fig.add_trace(go.Scatter(
            x=[r[x_m] for r in feas], y=[r.get(y_m) for r in feas], mode="markers",
            name="feasible trials", marker={"color": "lightgrey", "size": 5},
            text=[hover(r) for r in feas], hoverinfo="text"))
    families: dict[str, list[Mapping[str, Any]]] = {}
    for r in front:
        families.setdefault(str(r.get("family", "front")), []).append(r)
    for fam, rs in sorted(families.items()):
        fig.add_trace(go.Scatter(
            x=[r[x_m] for r in rs], y=[r.get(y_m) for r in rs], mode="markers",
            name=fam, marker={"size": 10, "line": {"width": 1, "color": "black"}},
            text=[hover(r) for r in rs], hoverinfo="text"))
    if front:
        line = sorted(front, key=lambda r: r[x_m])
        fig.add_trace(go.Scatter(x=[r[x_m] for r in line], y=[r.get(y_m) for r in line],
                                 mode="lines", name="Pareto front", hoverinfo="skip",
                                 line={"color": "black", "width": 1, "dash": "dot"}))
    dirs = dict(zip(metrics, objective.directions))
    fig.update_layout(
        title=title, template="plotly_white", legend_title_text="config family",
        xaxis_title=f"{x_m} ({dirs.get(x_m, '')})",
        yaxis_title=f"{y_m} ({dirs.get(y_m, '')})" if y_m in dirs else y_m)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v):
        return f"{v:.4g}"
    return str(v)


def write_outputs(trials: Sequence[optuna.trial.FrozenTrial], objective: Objective,
                  space: SearchSpace, out_dir: Path, *, html: bool = True
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Write ``trials.parquet``, ``pareto.parquet`` (and ``pareto.html``); return both row sets."""
    rows = trial_rows(trials, objective, space)
    keys = config_columns(trials)
    front = pareto_rows(rows, objective, keys)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_parquet(rows, out_dir / "trials.parquet")
    write_parquet(front, out_dir / "pareto.parquet")
    if html:
        write_pareto_html(rows, front, objective, [k for k in keys if k in _varied(rows, keys)],
                          out_dir / "pareto.html", f"{space.name}: Pareto front")
    return rows, front


def config_columns(trials: Sequence[optuna.trial.FrozenTrial]) -> list[str]:
    """Config keys of the trials (their ``c:`` attributes), in first-seen order."""
    keys: dict[str, None] = {}
    for t in trials:
        for k in t.user_attrs:
            if k.startswith(CONFIG_PREFIX):
                keys.setdefault(k[len(CONFIG_PREFIX):], None)
    return list(keys)


def _varied(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> set[str]:
    return {k for k in keys if len({repr(r.get(k)) for r in rows}) > 1}
