"""Search outputs: flat trial rows, ``trials.parquet``, ``pareto.parquet`` and ``pareto.html``.

Rows are built from the study's storage (not from driver memory), so the files show exactly what
the storage holds. Each trial's user attributes carry its config (``c:<key>``) and its record
(``m:<key>``: metrics plus bookkeeping such as ``feasible``, ``prune_reason``, ``worker_id``);
a non-finite float is stored as ``{"__float__": "inf"}`` (``-inf``, ``nan``), which JSON storages
keep, and read back as the float: Parquet columns stay float64 (inf as inf, NaN as null).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from charon_search.search.pareto import non_dominated

if TYPE_CHECKING:
    import optuna

    from charon_search.search.objective import Objective
    from charon_search.search.space import SearchSpace

__all__ = ["CONFIG_PREFIX", "RECORD_PREFIX", "axis_title", "front_flags", "pareto_rows",
           "trial_rows", "write_outputs"]

CONFIG_PREFIX = "c:"
RECORD_PREFIX = "m:"
#: Columns every trial row has, first in the Parquet file.
BASE_COLUMNS = ("trial_number", "uid", "feasible", "valid", "prune_reason",
                "constraint_violation", "memo_hit", "error", "eval_wall_s", "worker_id",
                "node_id", "family")


#: Key of the JSON object a non-finite float is stored as in a trial's user attributes
#: (``{"__float__": "inf"}``): JSON has no infinity or NaN, and a study's storage is JSON.
NONFINITE_KEY = "__float__"
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def encode_attr(v: Any) -> Any:
    """A config or record value as stored in a user attribute: builtins (numpy scalars
    unwrapped), inf, -inf and NaN as ``{"__float__": "inf"}`` (``decode_attr`` reverses)."""
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", None) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return {NONFINITE_KEY: str(v)}
    return v


def decode_attr(v: Any, *, legacy: bool = False) -> Any:
    """``encode_attr`` reversed. ``legacy``: also read the strings ``"inf"``/``"-inf"`` that
    studies written before the encoding stored for infinite record values."""
    if isinstance(v, dict) and len(v) == 1 and v.get(NONFINITE_KEY) in _NONFINITE:
        return _NONFINITE[v[NONFINITE_KEY]]
    if legacy and v in ("inf", "-inf"):
        return _NONFINITE[v]
    return v


def split_attrs(attrs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """User attributes -> (config, record), non-finite values decoded (``decode_attr``)."""
    cfg = {k[len(CONFIG_PREFIX):]: decode_attr(v) for k, v in attrs.items()
           if k.startswith(CONFIG_PREFIX)}
    rec = {k[len(RECORD_PREFIX):]: decode_attr(v, legacy=True) for k, v in attrs.items()
           if k.startswith(RECORD_PREFIX)}
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


def front_flags(rows: Sequence[Mapping[str, Any]], front: Sequence[Mapping[str, Any]],
                objective: Objective) -> list[bool]:
    """Per row of ``rows``: on the Pareto front ``front`` (``pareto_rows`` of them), i.e.
    feasible with the objective values of a front row. The configs a front row stands for
    (``num_equivalent``) and memo-hit repeats of a front config are on it too."""
    on_front = {tuple(objective.values(r) or ()) for r in front}
    flags = []
    for r in rows:
        vals = objective.values(r) if r.get("feasible") else None
        flags.append(vals is not None and tuple(vals) in on_front)
    return flags


def _text(v: Any) -> str:
    """A value of a text column: mappings and lists as JSON (sorted keys), others ``str``."""
    import json

    if isinstance(v, Mapping | list | tuple):
        return json.dumps(v, sort_keys=True, default=str)
    return str(v)


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
            vals = [None if v is None else _text(v) for v in vals]
        elif typ == pa.float64():  # NaN written as null; +-inf as themselves
            vals = [None if v is None or v != v else float(v) for v in vals]
        cols[name] = pa.array(vals, type=typ)
    return pa.table(cols) if cols else pa.table({"trial_number": pa.array([], pa.int64())})


def write_parquet(rows: Sequence[Mapping[str, Any]], path: Path,
                  transform: Callable[[Any], Any] | None = None) -> None:
    """``rows`` as a Parquet file (``to_table``; ``transform`` may recast the table first)."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = to_table(rows)
    pq.write_table(table if transform is None else transform(table), path)


#: Metric-name suffix -> (axis unit, factor applied to the plotted values); first match wins.
#: Rates (``_per_s``) and ratios carry no unit of their own.
_UNITS = (("_per_s", "", 1.0), ("_bytes", "GiB", 1 / 2**30), ("_usd", "USD", 1.0),
          ("_ms", "ms", 1.0), ("_s", "s", 1.0))
_STATISTIC = re.compile(r"^(p\d+|mean|median|min|max|std|avg)$")


def axis_unit(metric: str) -> tuple[str, float]:
    """``(unit, factor)`` of ``metric`` from its name's suffix (``ttft_s.p90`` -> s; bytes
    plotted as GiB); ``("", 1.0)`` when the name has no known unit suffix."""
    parts = [p for p in metric.split(".") if not _STATISTIC.match(p)] or [metric]
    for suffix, unit, factor in _UNITS:
        if parts[-1].endswith(suffix):
            return unit, factor
    return "", 1.0


def axis_title(metric: str, direction: str | None = None) -> str:
    """``step_time_s [s] (minimize)``: the metric, its unit, its direction."""
    unit = axis_unit(metric)[0]
    return metric + (f" [{unit}]" if unit else "") + (f" ({direction})" if direction else "")


def write_pareto_html(rows: Sequence[Mapping[str, Any]], front: Sequence[Mapping[str, Any]],
                      objective: Objective, config_keys: Sequence[str], path: Path,
                      title: str) -> None:
    """Plotly scatter of the feasible trials (grey) and the front coloured by config family,
    on the first two objectives (units from the metric names; a subtitle names the others).

    The plotly.js bundle is embedded (``include_plotlyjs=True``) so the file opens offline.
    """
    import plotly.graph_objects as go

    metrics = list(objective.metrics)
    x_m = metrics[0]
    y_m = metrics[1] if len(metrics) > 1 else "trial_number"
    fx, fy = axis_unit(x_m)[1], (axis_unit(y_m)[1] if y_m in metrics else 1.0)

    def xs(rs: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [r[x_m] * fx for r in rs]

    def ys(rs: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [None if r.get(y_m) is None else r[y_m] * fy for r in rs]

    def hover(r: Mapping[str, Any]) -> str:
        parts = [f"trial {r['trial_number']}"]
        parts += [f"{k}={_text(r.get(k))}" for k in config_keys]
        parts += [f"{m}={_fmt(r.get(m))}" for m in metrics]
        return "<br>".join(parts)

    fig = go.Figure()
    feas = [r for r in rows if r.get("feasible") and objective.values(r) is not None]
    if feas:
        fig.add_trace(go.Scatter(
            x=xs(feas), y=ys(feas), mode="markers",
            name="feasible trials", marker={"color": "lightgrey", "size": 5},
            text=[hover(r) for r in feas], hoverinfo="text"))
    families: dict[str, list[Mapping[str, Any]]] = {}
    for r in front:
        families.setdefault(str(r.get("family", "front")), []).append(r)
    for fam, rs in sorted(families.items()):
        fig.add_trace(go.Scatter(
            x=xs(rs), y=ys(rs), mode="markers",
            name=fam, marker={"size": 10, "line": {"width": 1, "color": "black"}},
            text=[hover(r) for r in rs], hoverinfo="text"))
    if front:
        line = sorted(front, key=lambda r: r[x_m])
        fig.add_trace(go.Scatter(x=xs(line), y=ys(line),
                                 mode="lines", name="Pareto front", hoverinfo="skip",
                                 line={"color": "black", "width": 1, "dash": "dot"}))
    dirs = dict(zip(metrics, objective.directions))
    if len(metrics) > 2:
        title += (f"<br><sup>{len(metrics)} objectives, the first 2 plotted: the front is "
                  f"non-dominated in {', '.join(metrics[2:])} too, so some of its points look "
                  f"dominated here</sup>")
    fig.update_layout(
        title=title, template="plotly_white", legend_title_text="config family",
        xaxis_title=axis_title(x_m, dirs[x_m]), yaxis_title=axis_title(y_m, dirs.get(y_m)))
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
