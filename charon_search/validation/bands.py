"""Validated error bands: how far measurements fall from the simulator's predictions.

``charon-search validate`` measures the simulator's error on every shipped record. This module
turns that run into *bands*: per metric family (serving TTFT, serving TPOT, training step time,
training peak memory) and, for serving, per engine and deployment mode, the quantiles of the
ratio ``r = measured / predicted`` of a time or memory (for a throughput metric, the ratio of
the step times it implies: ``predicted / measured``). A prediction ``P`` of a time then reads
"measured ``<= P * r_q`` in a fraction ``q`` of the validated rows", which is what an SLO needs:

* ``charon-search serve`` prints the band of its engine under the report;
* an objective file's ``guard: 0.9`` makes every banded constraint hold at that quantile
  (``ttft_s.p90 <= 1.0`` is checked on ``ttft_s.p90 * r_0.9``), so a configuration the search
  calls feasible is one the validated error would still leave feasible 9 times out of 10.

The shipped bands (``data/validation/error_bands.json``) are written by ``charon-search accuracy
--bands`` from the full validate run that ``docs/accuracy.md`` reports (``scripts/
accuracy_report.py`` does both). The bands are the measured errors as they are, tails included:
a band is only as specific as the rows behind it (a group with fewer than ``MIN_GROUP_ROWS``
rows falls back to its engine, then to all engines).

Whether a band carries to measurements it did not see is checked like the calibration, leaving
one source out (``held_out_coverage``, a table of ``docs/accuracy.md``): the fraction of a
source's rows within the ``r_q`` of bands computed without it should be about ``q``.

The serving rows compare the *mean* TTFT and TPOT of a benchmark run; a guard applies that
ratio to whichever statistic a constraint names (``ttft_s.p90``), an approximation the report
states.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from charon_search.errors import ConfigError

__all__ = ["BAND_LEVELS", "FAMILIES", "GUARD_LEVELS", "MIN_GROUP_ROWS", "Band", "ErrorBands",
           "bands_path", "compute_bands", "held_out_bands", "held_out_coverage", "load_bands",
           "metric_family", "render_bands", "serving_band_lines", "shipped_bands", "source_of"]

#: Quantile levels stored for each band (symmetric, so a lower bound can use ``1 - q``).
BAND_LEVELS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)
#: Levels an objective's ``guard`` may name.
GUARD_LEVELS = tuple(q for q in BAND_LEVELS if q >= 0.5)
#: A serving group (engine x mode, or engine) with fewer rows falls back to a wider one.
MIN_GROUP_ROWS = 30
#: Band families: the validate metric groups (``validation.stats``) bands are computed for.
FAMILIES = ("serving_ttft", "serving_tpot", "training_time", "training_memory")
#: Deployment modes as validate records them (``config.mode``) and as search records do.
_MODES = {"agg": "agg", "aggregated": "agg", "disagg": "disagg", "disaggregated": "disagg"}
#: A band's mode as reports print it.
_MODE_NAMES = {"agg": "aggregated", "disagg": "disaggregated"}
ANY = "*"


def bands_path() -> Path:
    """The shipped bands file."""
    from charon_search.validation.records import data_dir

    return data_dir() / "error_bands.json"


def _throughput_like(metric: str) -> bool:
    """A rate (higher = faster): its step-time ratio is ``predicted / measured``. Times end in
    ``_s`` (``step_time_s``, ``ttft_s``, ``wall_time_per_trillion_tokens_s``) and sizes in
    ``_bytes``; ``tokens_per_s``, ``mfu`` and the TFLOP/s fields are rates."""
    if metric.endswith("_bytes"):
        return False
    return "per_s" in metric or not metric.endswith("_s")


def metric_family(metric: str, *, serving: bool) -> tuple[str, bool] | None:
    """``(family, throughput_like)`` of a report field an objective constrains, or None when no
    band covers it. ``ttft_s.p90`` -> serving TTFT; ``step_time_s`` / ``tokens_per_s_per_gpu`` /
    ``mfu`` of a training record -> training step time; ``peak_memory_bytes`` -> training memory.
    Serving throughput is not banded (its validated rows are a handful of trtllm-bench runs)."""
    base = metric.split(".", 1)[0]
    if serving:
        if base in ("ttft_s", "tpot_s"):
            return f"serving_{base[:-2]}", False
        return None
    from charon_search.validation.stats import METRIC_GROUPS

    if base == "peak_memory_bytes":
        return "training_memory", False
    if base in METRIC_GROUPS["training_time"] or base in ("gpu_s_per_token",):
        return "training_time", _throughput_like(base)
    return None


@dataclass(frozen=True)
class Band:
    """One group's quantiles of ``measured / predicted`` (of the implied time for rates)."""

    family: str
    engine: str
    mode: str
    n: int
    ratios: tuple[float, ...]
    """At ``BAND_LEVELS``."""

    def ratio(self, level: float) -> float:
        """The ratio at quantile ``level`` (one of ``BAND_LEVELS``)."""
        for q, r in zip(BAND_LEVELS, self.ratios):
            if math.isclose(q, level):
                return r
        raise ConfigError(f"band level must be one of {list(BAND_LEVELS)}, but got {level!r}")

    @property
    def label(self) -> str:
        who = "all engines" if self.engine == ANY else self.engine
        mode = f" {_MODE_NAMES[self.mode]}" if self.mode in _MODE_NAMES else ""
        return f"{self.family} {who}{mode}, n={self.n}"

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "engine": self.engine, "mode": self.mode, "n": self.n,
                "ratios": [round(r, 4) for r in self.ratios]}


def _row_ratio(row: Mapping[str, Any]) -> float | None:
    err = row.get("error")
    if err is None or not math.isfinite(float(err)) or float(err) <= -1.0:
        return None
    e = float(err)
    return (1.0 + e) if _throughput_like(row["metric"]) else 1.0 / (1.0 + e)


def _quantiles(ratios: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(x) for x in np.quantile(np.asarray(ratios, dtype=float), BAND_LEVELS))


def compute_bands(data: Mapping[str, Any], *, min_rows: int = MIN_GROUP_ROWS) -> dict[str, Any]:
    """Bands from a ``validate --json`` result (a dict): one row per record and family (the
    family's highest-priority metric, as the summaries count), ratio ``1 / (1 + error)`` for
    times and sizes, ``1 + error`` for rates. Serving groups: every engine x mode and every
    engine with at least ``min_rows`` rows, and all engines; training: all records."""
    from charon_search.validation.stats import group_of, representative_rows

    cases = data.get("cases") or {}
    groups: dict[tuple[str, str, str], list[float]] = {}
    for row in representative_rows(data.get("records") or []):
        family = group_of(row["metric"])
        ratio = _row_ratio(row)
        if family not in FAMILIES or ratio is None:
            continue
        keys = [(family, ANY, ANY)]
        if family.startswith("serving_"):
            case = cases.get(row["id"]) or {}
            engine = str(case.get("engine") or "") or ANY
            mode = _MODES.get(str(case.get("mode") or ""), ANY)
            keys += [(family, engine, ANY), (family, engine, mode)]
        for k in dict.fromkeys(keys):
            groups.setdefault(k, []).append(ratio)
    bands = [Band(family=f, engine=e, mode=m, n=len(v), ratios=_quantiles(v)).to_dict()
             for (f, e, m), v in sorted(groups.items())
             if (e == ANY and m == ANY) or len(v) >= min_rows]
    return {
        "source": (f"charon-search validate on {len(data.get('records') or [])} predicted "
                   f"metrics of {len({r['id'] for r in data.get('records') or []})} predicted "
                   f"records (generated_at "
                   f"{data.get('generated_at') or 'unknown'}); ratio = measured / predicted of "
                   "a time or memory, predicted / measured of a rate (the step-time ratio it "
                   "implies); serving rows compare benchmark-mean TTFT and TPOT"),
        "generated_at": data.get("generated_at"),
        "levels": list(BAND_LEVELS),
        "min_rows": min_rows,
        "bands": bands,
    }


class ErrorBands:
    """Bands read from a file written by ``compute_bands``; ``lookup`` picks the most specific
    group with rows."""

    def __init__(self, doc: Mapping[str, Any], *, path: str = "<bands>") -> None:
        levels = doc.get("levels")
        if not isinstance(levels, list) or [float(x) for x in levels] != list(BAND_LEVELS):
            raise ConfigError(f"{path}: `levels` must be {list(BAND_LEVELS)}, but got {levels!r}")
        self.path = path
        self.source = str(doc.get("source") or "")
        self.bands: dict[tuple[str, str, str], Band] = {}
        for i, b in enumerate(doc.get("bands") or []):
            try:
                band = Band(family=str(b["family"]), engine=str(b["engine"]),
                            mode=str(b["mode"]), n=int(b["n"]),
                            ratios=tuple(float(r) for r in b["ratios"]))
            except (KeyError, TypeError, ValueError) as e:
                raise ConfigError(f"{path}: `bands[{i}]` must have family, engine, mode, n and "
                                  f"ratios: {e}") from None
            if len(band.ratios) != len(BAND_LEVELS):
                raise ConfigError(f"{path}: `bands[{i}].ratios` must have {len(BAND_LEVELS)} "
                                  f"values, one per level")
            self.bands[(band.family, band.engine, band.mode)] = band

    def lookup(self, family: str, engine: str = "", mode: str = "") -> Band | None:
        """The band of ``family`` for ``engine`` in ``mode`` (``aggregated``/``agg``...),
        falling back to the engine's, then to all engines'; None if the family has none."""
        m = _MODES.get(mode, ANY)
        for key in ((family, engine, m), (family, engine, ANY), (family, ANY, ANY)):
            if key in self.bands:
                return self.bands[key]
        return None


def load_bands(path: str | Path | None = None) -> ErrorBands:
    """Read a bands file (default: the shipped one)."""
    p = Path(path) if path is not None else bands_path()
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"error bands {str(p)!r}: {e}; write them with `charon-search "
                          "accuracy --from validate.json --out report.md --bands FILE`") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"error bands {str(p)!r}: not JSON ({e})") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"error bands {str(p)!r}: must be a JSON object")
    return ErrorBands(doc, path=str(p))


@functools.cache
def shipped_bands() -> ErrorBands:
    """The shipped bands, read once per process (objectives' guards)."""
    return load_bands()


def render_bands(doc: Mapping[str, Any]) -> str:
    """A markdown table of ``compute_bands`` output (for ``docs/accuracy.md``)."""
    head = " | ".join(f"r{round(q * 100)}" for q in BAND_LEVELS)
    lines = [f"| family | engine | mode | n | {head} |",
             "|" + "---|" * (4 + len(BAND_LEVELS))]
    for b in doc.get("bands") or []:
        mode = _MODE_NAMES.get(b["mode"], "all")
        engine = "all" if b["engine"] == ANY else b["engine"]
        cells = " | ".join(f"{r:.2f}" for r in b["ratios"])
        lines.append(f"| {b['family']} | {engine} | {mode} | {b['n']} | {cells} |")
    return "\n".join(lines)


def serving_band_lines(ttft_s: float, tpot_s: float, *, engine: str = "", mode: str = "",
                       bands: ErrorBands | None = None, low: float = 0.1,
                       high: float = 0.9) -> list[str]:
    """What the validated error says of a served prediction (``charon-search serve``): for the
    mean TTFT and TPOT, the range measurements fell in around such predictions (quantiles
    ``low``..``high`` of measured / predicted in the band of ``engine`` and ``mode``)."""
    bands = bands if bands is not None else load_bands()
    out = []
    for name, family, value in (("TTFT", "serving_ttft", ttft_s),
                                ("TPOT", "serving_tpot", tpot_s)):
        band = bands.lookup(family, engine, mode)
        if band is None or not math.isfinite(value):
            continue
        lo, hi = band.ratio(low), band.ratio(high)
        out.append(f"  {name} {value * 1e3:.1f} ms: measured {lo:.2f}-{hi:.2f}x the prediction "
                   f"= {value * lo * 1e3:.1f}-{value * hi * 1e3:.1f} ms ({band.label})")
    if out:
        out.insert(0, f"validated error (p{round(low * 100)}-p{round(high * 100)} of measured / "
                      "predicted over the shipped rows, `charon-search validate`):")
    return out


def source_of(case: Mapping[str, Any] | None) -> str:
    """A validate case's ``source`` ("" when it has none)."""
    return str((case or {}).get("source") or "")


def held_out_bands(data: Mapping[str, Any], *,
                   min_rows: int = MIN_GROUP_ROWS) -> dict[str, ErrorBands]:
    """Source -> the bands ``compute_bands`` gives without that source's records, for every
    source of a ``validate --json`` result's records: what a guard would have known of the
    simulator's error before that source was measured."""
    cases = data.get("cases") or {}
    records = list(data.get("records") or [])
    sources = sorted({source_of(cases.get(r["id"])) for r in records})
    return {src: ErrorBands(compute_bands(
        {"records": [r for r in records if source_of(cases.get(r["id"])) != src],
         "cases": cases}, min_rows=min_rows)) for src in sources}


def held_out_coverage(data: Mapping[str, Any], levels: Sequence[float] = (0.5, 0.9, 0.95),
                      *, min_rows: int = MIN_GROUP_ROWS) -> dict[str, Any]:
    """How well the bands carry to measurements they did not see: for each source, bands
    computed without it (``compute_bands`` on the other sources), and the fraction of the
    source's rows whose ratio is at most ``r_q`` of their group. A band that generalizes covers
    about ``q`` of the held-out rows. Returns ``{family: {"n", "within": {q: fraction},
    "by_source": {source: {"n", "within": {q: fraction}}}}}``."""
    from charon_search.validation.stats import group_of, representative_rows

    cases = data.get("cases") or {}
    rows = [r for r in representative_rows(list(data.get("records") or []))
            if group_of(r["metric"]) in FAMILIES and _row_ratio(r) is not None]
    out: dict[str, Any] = {}
    for src, bands in held_out_bands(data, min_rows=min_rows).items():
        for r in rows:
            case = cases.get(r["id"]) or {}
            if source_of(case) != src:
                continue
            family = str(group_of(r["metric"]))
            band = bands.lookup(family, str(case.get("engine") or ""), str(case.get("mode") or ""))
            if band is None:
                continue
            ratio = _row_ratio(r)
            assert ratio is not None
            fam = out.setdefault(family, {"n": 0, "hits": [0] * len(levels), "by_source": {}})
            per = fam["by_source"].setdefault(src, {"n": 0, "hits": [0] * len(levels)})
            for acc in (fam, per):
                acc["n"] += 1
                for i, q in enumerate(levels):
                    acc["hits"][i] += ratio <= band.ratio(q)
    for fam in out.values():
        for acc in (fam, *fam["by_source"].values()):
            acc["within"] = {q: h / acc["n"] for q, h in zip(levels, acc.pop("hits"))}
    return out
