"""Objectives: which report fields to optimise, in which direction, under which constraints.

An objective file (``objectives/<name>.yaml``)::

    name: slo-ttft1s-tpot50ms
    objectives:
      - {metric: tokens_per_s_per_gpu, direction: maximize}
      - {metric: tokens_per_s_per_user, direction: maximize}
    constraints:
      - ttft_s.p90 <= 1.0
      - tpot_s.p90 <= 0.05
      - peak_memory_bytes <= device
      - num_gpus <= budget
    limits: {budget: 64}
    guard: 0.9          # optional: constraints hold at the validated error's 90th percentile

Metric names are the flat record keys the evaluators return (``StepReport``/``ServingReport`` field
names; nested percentiles flattened as ``ttft_s.p90``). A constraint is ``<metric> <= <bound>`` or
``<metric> >= <bound>``; the bound is a number, ``device`` (the device memory of the evaluated
point, record key ``device_memory_bytes``) or a name from ``limits``.

``guard: q`` (one of ``validation.bands.GUARD_LEVELS``) checks each constraint on a metric that
``charon-search validate`` measured the simulator's error on (serving TTFT and TPOT, per engine
and mode; training step time, throughput and peak memory) against the prediction scaled by the
validated ratio of measured to predicted at quantile ``q`` (``validation.bands``): a point is
feasible when the constraint would still hold for a measurement that many of the validated rows
fall within. The trial record gets ``guarded.<metric>`` (the value checked) and
``guard_band.<metric>`` (the band used).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from charon_search.errors import ConfigError
from charon_search.search.space import reject_unknown_keys

__all__ = ["DIRECTIONS", "Bound", "Objective", "ObjectiveTerm", "check_guard", "load_objective"]

DIRECTIONS = ("minimize", "maximize")
OPERATORS = ("<=", ">=")
_KEYS = ("name", "description", "objectives", "constraints", "limits", "guard")
_TERM_KEYS = ("metric", "direction")
_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|<|>|==|=)\s*([^\s<>=]\S*)\s*$")
#: The bound ``device`` refers to this record key (GPU memory capacity, bytes).
DEVICE_KEY = "device_memory_bytes"
#: Largest relative constraint violation told to the sampler (an infinite metric's).
MAX_VIOLATION = 1e6


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectiveTerm:
    metric: str
    direction: str
    """``minimize`` or ``maximize``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Bound:
    """``metric op bound``; ``bound`` is a float or the record key it reads (``device``)."""

    metric: str
    op: str
    bound: float | str
    text: str

    def limit(self, record: Mapping[str, Any]) -> float | None:
        if isinstance(self.bound, str):
            v = record.get(self.bound)
            return None if v is None else float(v)
        return self.bound

    def violation(self, record: Mapping[str, Any],
                  value: float | None = None) -> float | None:
        """Relative violation (> 0 violated, <= 0 satisfied); None when the metric is absent.
        ``value`` replaces the record's value of the metric (a guarded one)."""
        if value is None:
            value = record.get(self.metric)
        limit = self.limit(record)
        if value is None or limit is None:
            return None
        if not isinstance(value, numbers.Real):
            raise ConfigError(f"constraint {self.text!r} reads {self.metric!r}, a "
                              f"{type(value).__name__} field of the record, not a number "
                              f"(got {str(value)[:60]!r})")
        value = float(value)
        if math.isnan(value):
            return 1.0
        scale = max(abs(limit), 1e-12)
        v = (value - limit) / scale if self.op == "<=" else (limit - value) / scale
        # an infinite metric stays a finite constraint value: samplers fit models to them
        return min(max(v, -MAX_VIOLATION), MAX_VIOLATION)


@dataclass(frozen=True, kw_only=True)
class Objective:
    """Objective terms plus constraints. Build with ``load_objective`` or ``from_dict``."""

    name: str
    terms: tuple[ObjectiveTerm, ...]
    constraints: tuple[Bound, ...] = ()
    limits: Mapping[str, float] = field(default_factory=dict)
    description: str = ""
    path: str = ""
    guard: float | None = None
    """Quantile of the validated error the constraints must hold at (None: the prediction)."""

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(t.metric for t in self.terms)

    @property
    def directions(self) -> list[str]:
        return [t.direction for t in self.terms]

    def values(self, record: Mapping[str, Any]) -> list[float] | None:
        """The objective values of a record; None if any is missing or not finite."""
        out = []
        for i, t in enumerate(self.terms):
            v = record.get(t.metric)
            if v is None:
                return None
            if not isinstance(v, numbers.Real):
                raise ConfigError(
                    f"{self.path or self.name}: field `objectives[{i}].metric` "
                    f"names {t.metric!r}, a {type(v).__name__} field of the record, not a "
                    f"number (got {str(v)[:60]!r})")
            v = float(v)
            if not math.isfinite(v):
                return None
            out.append(v)
        return out

    def minimized(self, values: list[float]) -> list[float]:
        """Values turned into losses (maximised terms negated)."""
        return [v if t.direction == "minimize" else -v for v, t in zip(values, self.terms)]

    def violations(self, record: Mapping[str, Any]) -> list[tuple[Bound, float]]:
        """Each constraint with its relative violation (missing metrics count as satisfied),
        on the guarded value where ``guard`` is set and a band covers the metric."""
        out = []
        for b in self.constraints:
            g = self.guarded(b, record)
            v = b.violation(record, None if g is None else g[0])
            out.append((b, 0.0 if v is None else v))
        return out

    def guarded(self, bound: Bound, record: Mapping[str, Any]) -> tuple[float, str] | None:
        """``(value, band label)``: the constrained metric of ``record`` scaled so that the
        validated measurements satisfy ``bound`` with probability ``guard`` when the scaled
        value does; None without a guard, a band, or the metric. A time or memory ``P`` is
        measured as ``P * r`` (``r`` = measured / predicted), a rate as ``P / r``: an upper
        bound on a time takes ``r`` at ``guard``, a lower bound at ``1 - guard``, and the
        other way round for rates."""
        value = record.get(bound.metric)
        if self.guard is None or value is None:
            return None
        from charon_search.validation.bands import metric_family, shipped_bands

        fam = metric_family(bound.metric, serving="engine" in record)
        if fam is None:
            return None
        family, rate = fam
        band = shipped_bands().lookup(family, str(record.get("engine") or ""),
                                       str(record.get("mode") or ""))
        if band is None:
            return None
        upper = (bound.op == "<=") != rate
        r = band.ratio(self.guard if upper else round(1.0 - self.guard, 2))
        v = float(value)
        return (v / r if rate else v * r), band.label

    def annotate(self, record: dict[str, Any]) -> None:
        """Add ``guarded.<metric>`` and ``guard_band.<metric>`` for each guarded constraint."""
        for b in self.constraints:
            g = self.guarded(b, record)
            if g is not None:
                record[f"guarded.{b.metric}"], record[f"guard_band.{b.metric}"] = g

    @classmethod
    def from_dict(cls, data: Any, *, path: str = "<objective>") -> Objective:
        """Validate; ``ConfigError`` names the file, the field and the allowed values."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: an objective file must be a mapping with keys {_KEYS}")
        reject_unknown_keys(data, _KEYS, path, "")
        for req in ("name", "objectives"):
            if req not in data:
                raise ConfigError(f"{path}: missing required field `{req}`")
        raw = data["objectives"]
        if not isinstance(raw, list) or not raw:
            raise ConfigError(
                f"{path}: field `objectives` must be a non-empty list of "
                f"{{metric: NAME, direction: {'|'.join(DIRECTIONS)}}}"
            )
        terms = []
        for i, t in enumerate(raw):
            where = f"objectives[{i}]"
            if not isinstance(t, Mapping):
                raise ConfigError(f"{path}: field `{where}` must be a mapping with keys "
                                  f"{list(_TERM_KEYS)}")
            reject_unknown_keys(t, _TERM_KEYS, path, where)
            if not isinstance(t.get("metric"), str) or not t["metric"]:
                raise ConfigError(f"{path}: field `{where}.metric` must be a report field name")
            if t.get("direction") not in DIRECTIONS:
                raise ConfigError(
                    f"{path}: field `{where}.direction` must be one of {list(DIRECTIONS)}, "
                    f"but got {t.get('direction')!r}"
                )
            terms.append(ObjectiveTerm(metric=t["metric"], direction=t["direction"]))
        if len({t.metric for t in terms}) != len(terms):
            raise ConfigError(f"{path}: field `objectives` repeats a metric")
        limits_raw = data.get("limits") or {}
        if not isinstance(limits_raw, Mapping):
            raise ConfigError(f"{path}: field `limits` must be a mapping name -> number")
        limits: dict[str, float] = {}
        for k, v in limits_raw.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"{path}: field `limits.{k}` must be a finite number, but "
                                  f"got {v!r}")
            if str(k) == "device":
                raise ConfigError(f"{path}: field `limits.device`: `device` is reserved (the "
                                  f"evaluated point's GPU memory, record key {DEVICE_KEY!r}); "
                                  f"give the limit another name")
            limits[str(k)] = float(v)
        cons_raw = data.get("constraints") or []
        if not isinstance(cons_raw, list):
            raise ConfigError(f"{path}: field `constraints` must be a list of "
                              f"'METRIC <=|>= BOUND' strings")
        constraints = tuple(_parse_bound(c, i, limits, path) for i, c in enumerate(cons_raw))
        guard = data.get("guard")
        if guard is not None:
            guard = check_guard(guard, f"{path}: field `guard`")
        return cls(name=str(data["name"]), terms=tuple(terms), constraints=constraints,
                   limits=limits, description=str(data.get("description", "")), path=path,
                   guard=guard)


def check_guard(value: Any, where: str) -> float:
    """``value`` as a guard level; ``ConfigError`` naming ``where`` and the allowed levels."""
    from charon_search.validation.bands import GUARD_LEVELS

    if isinstance(value, bool) or not isinstance(value, int | float) or not any(
            math.isclose(float(value), q) for q in GUARD_LEVELS):
        raise ConfigError(f"{where} must be one of {list(GUARD_LEVELS)} (a quantile of the "
                          f"validated error), but got {value!r}")
    return float(value)


def _parse_bound(text: Any, i: int, limits: Mapping[str, float], path: str) -> Bound:
    where = f"constraints[{i}]"
    bounds_allowed = ["a number", "device", *sorted(limits)]
    m = _CONSTRAINT_RE.match(str(text)) if isinstance(text, str) else None
    if m is None:
        raise ConfigError(
            f"{path}: field `{where}` must read 'METRIC OP BOUND' with OP one of "
            f"{list(OPERATORS)} and BOUND one of {bounds_allowed}, but got {text!r}"
        )
    metric, op, rhs = m.groups()
    if op not in OPERATORS:
        raise ConfigError(f"{path}: field `{where}` operator must be one of {list(OPERATORS)}, "
                          f"but got {op!r}")
    bound: float | str
    if rhs == "device":
        bound = DEVICE_KEY
    elif rhs in limits:
        bound = limits[rhs]
    else:
        try:
            bound = float(rhs)
        except ValueError:
            raise ConfigError(
                f"{path}: field `{where}` bound must be one of {bounds_allowed}, but got {rhs!r}"
            ) from None
        if not math.isfinite(bound):
            raise ConfigError(f"{path}: field `{where}` bound must be a finite number, but got "
                              f"{rhs!r}")
    return Bound(metric=metric, op=op, bound=bound, text=f"{metric} {op} {rhs}")


def load_objective(path: str | Path) -> Objective:
    """Load ``objectives/<name>.yaml`` (a path, or a bare name looked up in ``objectives/``)."""
    from charon_search.search.space import _read_yaml, _resolve

    p = _resolve(path, "objectives")
    return Objective.from_dict(_read_yaml(p), path=str(p))
