"""``charon-search calibrate``: fit the parameters real systems do not publish.

Discipline (issue 8):

- Only physical parameters that no data sheet gives are fitted (``PARAMETERS``): the roofline's
  achievable fractions of peak FLOP/s and HBM bandwidth (used where no profile covers an op), the
  fraction of link bandwidth collectives reach, the overlap slowdown, the per-iteration CPU
  overhead, and the caching allocator's headroom. No per-record factor exists anywhere.
- One parameter vector is shared by every cluster (the values are ratios of physics, not of a
  cluster), so a source held out really is unseen: ``leave_one_source_out`` fits on all other
  development sources and reports the held-out source's error next to the training error.
- Only development records are used: confidence ``high``/``medium`` and fully specified
  (``runner._fully_specified``); low-confidence sanity-check records never enter a fit.
- Results carry provenance (sources, record count, objective, date) and go to a YAML file; with
  ``write_cluster_specs`` they replace only the ``calibration:`` block of cluster spec files.

The objective is the median of ``|log(predicted / measured)|`` over each record's representative
metric (``stats.representative_rows``), minimized by coordinate descent over a small grid per
parameter (cheap, derivative-free, and every evaluated point is a real simulation).

A record's prediction does not depend on which other records are validated with it, so
``MemoizedEvaluate`` simulates each (parameter vector, record) pair once: the held-out fits of
``leave_one_source_out`` revisit most of the main fit's vectors on subsets of its records and
cost only the pairs not seen yet.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from charon_search.errors import ConfigError
from charon_search.hardware.spec import FRONTEND_KEYED_TIMES, SERVING_ENGINES, SERVING_FRONTENDS
from charon_search.validation.records import AIC_GAP_SOURCE, Record
from charon_search.validation.runner import ValidationResult, run_validation
from charon_search.validation.stats import group_of, representative_rows

if TYPE_CHECKING:
    from charon_search.hardware.spec import ClusterSpec

__all__ = [
    "PARAMETERS",
    "CalibrationFit",
    "MemoizedEvaluate",
    "Parameter",
    "apply_parameters",
    "check_parameters",
    "default_parameters",
    "development_records",
    "fit_parameters",
    "holdout_group",
    "leave_one_source_out",
    "shipped_values",
    "write_cluster_specs",
    "write_refusal",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Parameter:
    """One fitted quantity: where it lives in a ``ClusterSpec`` and the values tried."""

    name: str
    target: str
    """``gpu.<field>`` or ``calibration.<field>``; ``calibration.collective_bw_efficiency``
    sets the same fraction on every tier."""
    grid: tuple[float, ...]
    default: float
    kinds: tuple[str, ...] = ("training", "serving")
    """Record kinds whose error depends on the parameter (only those are simulated)."""
    engines: tuple[str, ...] = ()
    """Serving engines whose records it moves (empty: every record of ``kinds``); a record of
    another engine is simulated once for all of this parameter's values."""
    doc: str = ""

    def moves(self, record: Record) -> bool:
        """Whether ``record``'s prediction may depend on this parameter (a record whose engine
        is not known is assumed to: it is re-simulated rather than wrongly reused). An entry of
        a mapping keyed by process (``FRONTEND_KEYED_TIMES``) moves only the rows that process
        serves: ``dynamo``'s the rows served through NVIDIA Dynamo (aiconfigurator's
        gap-analysis launches, ``serving.backends.AIC_FRONTEND``), an engine's the others. A
        mapping of ``DISAGG_ONLY_TIMES`` moves only disaggregated records."""
        field, _, key = self.target.removeprefix("calibration.").partition(".")
        if field in FRONTEND_KEYED_TIMES and key:
            through_dynamo = AIC_GAP_SOURCE in (record.notes or "")
            if through_dynamo != (key in SERVING_FRONTENDS):
                return False
        if field in DISAGG_ONLY_TIMES and not is_disaggregated(record):
            return False
        engine = record_engine(record)
        return record.kind in self.kinds and (not self.engines or not engine
                                              or engine in self.engines)


#: Grid of the front-end times per prompt token (seconds).
PROMPT_TOKEN_GRID = (0.0, 1e-6, 2e-6, 3e-6, 4e-6, 6e-6, 8e-6, 1e-5, 1.2e-5, 1.5e-5)
#: Grid of the front-end times per streamed output token (seconds).
OUTPUT_TOKEN_GRID = (0.0, 1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 6e-5, 8e-5, 1e-4)
#: Grid of the front-end times per streaming request per output cycle (seconds).
OUTPUT_STREAM_GRID = (0.0, 1e-4, 2e-4, 3e-4, 4e-4, 5e-4, 6e-4, 8e-4, 1e-3)
#: Grid of the disaggregated hand-over times (seconds).
DISAGG_HANDOFF_GRID = (0.0, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3)
#: ``Calibration`` mappings that only disaggregated deployments use.
DISAGG_ONLY_TIMES = ("disagg_handoff_s",)


def _per_engine(prefix: str, field_name: str, grid: tuple[float, ...],
                doc: str) -> tuple[Parameter, ...]:
    """One serving parameter per engine (``<prefix>_<engine>_s``), each setting that engine's
    entry of the calibration mapping ``field_name`` and moving only that engine's records
    (only those its own server serves, for a mapping in ``FRONTEND_KEYED_TIMES``); ``doc`` has
    a ``{}`` for the engine."""
    return tuple(Parameter(name=f"{prefix}_{engine}_s",
                           target=f"calibration.{field_name}.{engine}", grid=grid, default=0.0,
                           kinds=("serving",), engines=(engine,), doc=doc.format(engine))
                 for engine in ("trtllm", "sglang", "vllm"))


def _dynamo(prefix: str, grid: tuple[float, ...], doc: str) -> Parameter:
    """The serving parameter ``<prefix>_dynamo_s``: the ``dynamo`` entry of the calibration
    mapping ``<prefix>_s``, which moves only the launches NVIDIA Dynamo serves."""
    return Parameter(name=f"{prefix}_dynamo_s", target=f"calibration.{prefix}_s.dynamo",
                     grid=grid, default=0.0, kinds=("serving",), doc=doc)


PARAMETERS: dict[str, Parameter] = {p.name: p for p in (
    Parameter(name="compute_efficiency", target="gpu.compute_efficiency",
              grid=(0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85), default=0.75,
              doc="achievable fraction of peak FLOP/s for GEMMs no profile covers"),
    Parameter(name="sustained_clock_ratio", target="gpu.sustained_clock_ratio",
              grid=(0.75, 0.8, 0.85, 0.9, 0.95, 1.0), default=1.0, kinds=("training",),
              doc="tensor-core throughput a power-limited training run sustains, as a fraction "
                  "of the profile microbenchmarks (GEMM / attention times are divided by it)"),
    Parameter(name="memory_efficiency", target="gpu.memory_efficiency",
              grid=(0.7, 0.75, 0.8, 0.85, 0.9), default=0.85, kinds=("serving",),
              doc="achievable fraction of HBM bandwidth for memory-bound ops"),
    Parameter(name="collective_bw_scale", target="calibration.collective_bw_efficiency",
              grid=(0.7, 0.8, 0.9, 1.0, 1.1), default=1.0, kinds=("training",),
              doc="multiplies every tier's fraction of link bandwidth NCCL reaches (capped at "
                  "1); written back as per-tier efficiencies. Collectives the profile DB "
                  "measured inside one NVLink node keep their measured times "
                  "(cost.measured_collectives)"),
    Parameter(name="overlap_compute_slowdown", target="calibration.overlap_compute_slowdown",
              grid=(1.0, 1.05, 1.1, 1.15, 1.2, 1.3), default=1.0, kinds=("training",),
              doc="compute slowdown while a collective overlaps it"),
    Parameter(name="allocator_reserved_factor", target="calibration.allocator_reserved_factor",
              grid=(1.0, 1.05, 1.1, 1.2, 1.3), default=1.0, kinds=("training",),
              doc="peak reserved = peak allocated x this (caching-allocator headroom)"),
    Parameter(name="allocator_reserved_extra_bytes",
              target="calibration.allocator_reserved_extra_bytes",
              grid=(0.0, 2**30, 2 * 2**30, 4 * 2**30), default=0.0, kinds=("training",),
              doc="constant reserved memory per GPU (CUDA context, workspaces)"),
    Parameter(name="iteration_cpu_overhead_s", target="calibration.iteration_cpu_overhead_s",
              grid=(0.0, 1e-4, 3e-4, 1e-3, 3e-3), default=0.0, kinds=("serving",),
              doc="per-iteration host/scheduler time (serving)"),
    *_per_engine("frontend_latency", "frontend_latency_s",
                 (0.0, 0.005, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1),
                 "time a request spends in {}'s own server (HTTP server, tokenization, "
                 "hand-over to the executor, first token's way back): in TTFT and E2E, not in "
                 "TPOT"),
    *_per_engine("frontend_prompt_token", "frontend_prompt_token_s", PROMPT_TOKEN_GRID,
                 "time per prompt token a request spends in {}'s own server before the "
                 "scheduler sees it (turning the prompt text into token ids, input "
                 "processing): in TTFT and E2E, not in TPOT"),
    _dynamo("frontend_prompt_token", PROMPT_TOKEN_GRID,
            "time per prompt token a request spends in NVIDIA Dynamo's front end "
            "(dynamo.frontend's tokenization and preprocessing) before the engine sees it, "
            "whatever the engine"),
    *_per_engine("frontend_output_token", "frontend_output_token_s", OUTPUT_TOKEN_GRID,
                 "time {}'s serving front end spends per streamed output token, one token "
                 "after another for all requests (detokenization, writing the stream chunk): "
                 "tokens queue there once the engine emits more than its inverse per second"),
    *_per_engine("frontend_output_stream", "frontend_output_stream_s", OUTPUT_STREAM_GRID,
                 "time {}'s serving front end spends per streaming request per output cycle "
                 "(the request's stream chunk: detokenized text, response object, HTTP write), "
                 "going through the requests with new tokens one after another; tokens emitted "
                 "meanwhile merge into the next cycle's chunk: a lag in TTFT and E2E that grows "
                 "with the streams, not a cap on the output rate"),
    _dynamo("frontend_output_stream", OUTPUT_STREAM_GRID,
            "time NVIDIA Dynamo's per-replica worker spends per streaming request per output "
            "cycle, whatever the engine, tokens emitted meanwhile merging into the next "
            "cycle's chunk"),
    _dynamo("frontend_output_token", OUTPUT_TOKEN_GRID,
            "time NVIDIA Dynamo's per-replica worker spends per streamed output token (handing "
            "it from the engine to dynamo.frontend), whatever the engine: tokens queue there "
            "once the replica emits more than its inverse per second"),
    *_per_engine("prefill_overhead", "prefill_iteration_overhead_s",
                 (0.0, 0.004, 0.008, 0.012, 0.016, 0.024),
                 "host time a {} iteration carrying prompt tokens adds to its GPU time (eager "
                 "forward, new-request setup): in TTFT and, through the decodes of that "
                 "iteration, in TPOT"),
    *_per_engine("disagg_handoff", "disagg_handoff_s", DISAGG_HANDOFF_GRID,
                 "time a disaggregated {} request's hand-over from its prefill worker to its "
                 "decode worker takes beyond moving the KV bytes (KV pre-allocation and "
                 "handshake, completion notice, the decode scheduler polling for it): in TTFT "
                 "and E2E, not in TPOT; it moves only disaggregated records"),
    *_per_engine("eager_kernel_host", "eager_kernel_host_s",
                 (0.0, 1e-5, 2e-5, 4e-5, 5.5e-5, 7e-5, 8.5e-5, 1e-4),
                 "host time per operator of a {} iteration without a CUDA graph (Python model "
                 "code dispatching and launching each kernel): the iteration lasts at least "
                 "operators x this, which bounds prompt iterations once tensor parallelism has "
                 "shortened their GPU time"),
)}


def record_engine(record: Record) -> str:
    """The serving engine a silicon row measured (``vllm``/``sglang``/``trtllm``); "" when the
    record does not name one of them."""
    engine = str((record.extra or {}).get("backend") or "").lower()
    return engine if engine in SERVING_ENGINES else ""


def is_disaggregated(record: Record) -> bool:
    """Whether a serving record measured a prefill/decode-disaggregated deployment: its
    ``mode: disagg``, the one test ``translate`` builds the prefill and decode pools on."""
    return record.config.get("mode") == "disagg"


def default_parameters(kind: str) -> list[str]:
    """What ``calibrate --kind`` fits when no parameter is named: the cluster-level parameters
    (``calibration.*``) that move records of ``kind``. A GPU-level factor (``gpu.*``) fitted as
    the one shared value would replace every GPU's own shipped value, so it is fitted only when
    named."""
    return [n for n, p in PARAMETERS.items()
            if kind in p.kinds and not p.target.startswith("gpu.")]


def check_parameters(names: Sequence[str], kind: str) -> None:
    """Raise ``ConfigError`` unless every parameter of ``names`` is known and moves records of
    ``kind`` (a serving engine's front-end time fitted on training records would "fit" the
    grid's first value, whatever it is)."""
    unknown = [n for n in names if n not in PARAMETERS]
    if unknown:
        raise ConfigError(f"`params` (--params): unknown parameter(s) {unknown}; must be among "
                          f"{sorted(PARAMETERS)}")
    wrong = [n for n in names if kind not in PARAMETERS[n].kinds]
    if wrong:
        fits = sorted(n for n, p in PARAMETERS.items() if kind in p.kinds)
        raise ConfigError(
            f"`params` (--params): {', '.join(wrong)} "
            f"{'moves' if len(wrong) == 1 else 'move'} only "
            f"{'/'.join(sorted({k for n in wrong for k in PARAMETERS[n].kinds}))} records, but "
            f"the records are of kind {kind!r} (--kind); parameters for {kind} records: {fits}")


def development_records(records: Sequence[Record],
                        result: ValidationResult | None = None) -> list[Record]:
    """Records a fit may use: confidence high/medium, and fully specified when known."""
    out = [r for r in records if r.confidence in ("high", "medium")]
    if result is not None:
        out = [r for r in out if result.cases.get(r.id, {}).get("fully_specified")]
    return out


def apply_parameters(cluster: ClusterSpec, values: Mapping[str, float]) -> ClusterSpec:
    """A copy of ``cluster`` with fitted values set (renamed so no cache serves the old one)."""
    gpu_changes, cal_changes = _spec_changes(cluster, values)
    gpu = (dataclasses.replace(cluster.gpu, **gpu_changes)  # type: ignore[arg-type]
           if gpu_changes else cluster.gpu)
    cal = (dataclasses.replace(cluster.calibration, **cal_changes) if cal_changes
           else cluster.calibration)
    tag = hashlib.sha1(json.dumps(dict(values), sort_keys=True).encode()).hexdigest()[:8]
    return dataclasses.replace(cluster, gpu=gpu, calibration=cal,
                               name=f"{cluster.name}@cal-{tag}")


def _spec_changes(cluster: ClusterSpec, values: Mapping[str, float]
                  ) -> tuple[dict[str, float], dict[str, Any]]:
    """``(gpu fields, calibration fields)`` that ``values`` set on ``cluster``: a scale of the
    bandwidth efficiencies becomes this cluster's per-tier values, one entry of a mapping
    (``frontend_latency_s.trtllm``) the cluster's mapping with that entry replaced."""
    gpu: dict[str, float] = {}
    cal: dict[str, Any] = {}
    for name, value in values.items():
        where, _, field_name = PARAMETERS[name].target.partition(".")
        field_name, _, key = field_name.partition(".")
        if where == "gpu":
            gpu[field_name] = float(value)
        elif field_name == "collective_bw_efficiency":
            cal[field_name] = _scaled_bw(cluster, float(value))
        elif key:
            mapping = cal.setdefault(field_name, dict(getattr(cluster.calibration, field_name)))
            mapping[key] = float(value)
        else:
            cal[field_name] = float(value)
    return gpu, cal


def _scaled_bw(cluster: ClusterSpec, scale: float) -> dict[str, float]:
    base = dict(cluster.calibration.collective_bw_efficiency)
    for t in cluster.tiers:
        base.setdefault(t.name, 1.0)
    return {k: round(min(1.0, v * scale), 6) for k, v in base.items()}


Scored = frozenset[tuple[str, str]]
"""The (record id, metric group) pairs an objective scores: those the shipped specs predict."""


def _errors(result: ValidationResult) -> dict[tuple[str, str], float]:
    """|log(predicted / measured)| of each record's representative metric, per metric group
    (a prediction <= 0 has none)."""
    return {(r["id"], str(group_of(r["metric"]))): abs(math.log1p(r["error"]))
            for r in representative_rows(result.rows) if r["error"] > -1}


def _scored(baseline: ValidationResult) -> Scored:
    return frozenset(_errors(baseline))


def _objective(result: ValidationResult, scored: Scored | None = None) -> float:
    """Median |log(pred/meas)| over ``scored`` (None: every row ``result`` has). A scored
    record the result does not predict (the simulator failed on it under these values: the
    runner skips it) counts as an infinite error: dropping a badly predicted record must not
    lower the median, so a parameter value that breaks records never wins by it."""
    errs = _errors(result)
    values = list(errs.values()) if scored is None else [errs.get(k, math.inf) for k in scored]
    return float(np.median(values)) if values else math.inf


@dataclass(frozen=True, kw_only=True)
class CalibrationFit:
    values: dict[str, float]
    objective: float
    """Median |log(pred/meas)| on the records fitted."""
    uncalibrated_objective: float
    """The same on the same records under the cluster specs as shipped (no value applied)."""
    num_records: int
    sources: tuple[str, ...]
    evaluations: int
    no_effect: tuple[str, ...] = ()
    """Parameters no record's prediction moves across their grid (the others at their fitted
    values): they keep their start value and are not written into cluster specs."""


Evaluate = Callable[[Sequence[Record], Mapping[str, float]], ValidationResult]


def default_evaluate(**sim_overrides: Any) -> Evaluate:
    """Evaluate records with parameters applied to every case's cluster.

    ``sim_overrides`` go to ``run_validation`` (``progress``, ``executor`` for a pool of Ray
    workers, or simulators in tests)."""
    def evaluate(records: Sequence[Record], values: Mapping[str, float]) -> ValidationResult:
        transform = functools.partial(apply_parameters, values=dict(values))
        return run_validation(records, cluster_transform=transform, **sim_overrides)
    return evaluate


class MemoizedEvaluate:
    """An ``Evaluate`` that simulates each (parameter vector, record) pair at most once.

    A call evaluates only the requested records not yet simulated under ``values`` and answers
    from the rows kept per record, so a subset of an evaluated set (a LOSO training or test
    split) costs nothing. A record is keyed by the values of the parameters that move it
    (``Parameter.moves``): a per-engine parameter's grid re-simulates that engine's records
    only. ``pairs`` counts the record simulations actually run.

    With ``store`` (a JSON-lines file) every simulated pair is also appended there, keyed by
    ``fingerprint`` (``cache.package_fingerprint()`` in ``calibrate``: any change to the code or
    data invalidates it) and by the record's content, so an interrupted calibration started
    again with the same store simulates only what it had not finished; ``reused`` counts the
    pairs read back. A line cut short by the interruption is ignored.
    """

    def __init__(self, evaluate: Evaluate | None = None, *, store: Path | None = None,
                 fingerprint: str = "") -> None:
        self._evaluate = evaluate or default_evaluate()
        self._memo: dict[tuple[tuple[str, float], ...], dict[str, ValidationResult]] = {}
        self.pairs = 0
        self.reused = 0
        self._store = store
        self._fingerprint = fingerprint
        self._stored: dict[tuple[tuple[tuple[str, float], ...], str], ValidationResult] = {}
        if store is not None and store.is_file():
            self._stored = _read_store(store, fingerprint)
        self._hashes: dict[str, str] = {}
        """Record id -> ``_record_hash``, computed once per record (not per call)."""

    def _hash(self, rec: Record) -> str:
        if rec.id not in self._hashes:
            self._hashes[rec.id] = _record_hash(rec)
        return self._hashes[rec.id]

    def __call__(self, records: Sequence[Record], values: Mapping[str, float]
                 ) -> ValidationResult:
        groups: dict[tuple[tuple[str, float], ...], list[Record]] = {}
        for r in records:
            groups.setdefault(_record_key(values, r), []).append(r)
        for key, group in groups.items():
            seen = self._memo.setdefault(key, {})
            for r in group if self._stored else ():
                if r.id not in seen and (hit := self._stored.get((key, self._hash(r)))):
                    seen[r.id] = hit
                    self.reused += 1
            missing = [r for r in group if r.id not in seen]
            if missing:
                res = self._evaluate(missing, dict(key))
                self.pairs += len(missing)
                split = _split_by_record(res, [r.id for r in missing])
                seen.update(split)
                if self._store is not None:
                    _append_store(self._store, self._fingerprint, key,
                                  [(self._hash(r), split[r.id]) for r in missing])
        parts = [self._memo[_record_key(values, r)][r.id] for r in records]
        return ValidationResult(
            rows=[row for p in parts for row in p.rows],
            skipped=[row for p in parts for row in p.skipped],
            skipped_metrics=[row for p in parts for row in p.skipped_metrics],
            cases={k: v for p in parts for k, v in p.cases.items()})


def _split_by_record(res: ValidationResult, ids: Sequence[str]) -> dict[str, ValidationResult]:
    out = {i: ValidationResult(rows=[], skipped=[], skipped_metrics=[],
                               cases={i: res.cases[i]} if i in res.cases else {}) for i in ids}
    for attr in ("rows", "skipped", "skipped_metrics"):
        for row in getattr(res, attr):
            if row["id"] in out:
                getattr(out[row["id"]], attr).append(row)
    return out


def _key(values: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((k, float(v)) for k, v in values.items()))


def _record_key(values: Mapping[str, float], record: Record) -> tuple[tuple[str, float], ...]:
    """``record``'s memo key: the values of the parameters that move it only (a per-engine
    parameter leaves other engines' records alone, so they are simulated once for all of its
    values)."""
    return _key({n: v for n, v in values.items() if n not in PARAMETERS
                 or PARAMETERS[n].moves(record)})


def _record_hash(rec: Record) -> str:
    """The record's content (a changed measurement or layout is a different record)."""
    blob = json.dumps(dataclasses.asdict(rec), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _read_store(path: Path, fingerprint: str
                ) -> dict[tuple[tuple[tuple[str, float], ...], str], ValidationResult]:
    out = {}
    with path.open() as f:
        for line in f:
            try:
                d = json.loads(line)
                if d.get("fingerprint") != fingerprint:
                    continue
                key = tuple((str(k), float(v)) for k, v in d["values"])
                out[(key, d["record"])] = ValidationResult(
                    rows=d["rows"], skipped=d["skipped"], skipped_metrics=d["skipped_metrics"],
                    cases=d["cases"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                continue  # a line cut short by an interruption (or not ours): a cache miss
    return out


def _append_store(path: Path, fingerprint: str, key: tuple[tuple[str, float], ...],
                  results: Sequence[tuple[str, ValidationResult]]) -> None:
    """Append one line per (record hash, result) simulated under ``key``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for record_hash, res in results:
            f.write(json.dumps({"fingerprint": fingerprint, "values": [list(kv) for kv in key],
                                "record": record_hash, "rows": res.rows,
                                "skipped": res.skipped, "skipped_metrics": res.skipped_metrics,
                                "cases": res.cases}, default=str) + "\n")
        f.flush()


def _memoized(evaluate: Evaluate | None) -> MemoizedEvaluate:
    return evaluate if isinstance(evaluate, MemoizedEvaluate) else MemoizedEvaluate(evaluate)


def shipped_values(names: Sequence[str], clusters: Sequence[ClusterSpec]) -> dict[str, float]:
    """Each parameter's value in the cluster specs as shipped, where ``clusters`` all carry the
    same one (a fit's start: ``fit_parameters(start=...)``); parameters the clusters disagree
    on are left out (they start from their grid default). The bandwidth scale's shipped value
    is 1 (each tier's own efficiency); an engine missing from a per-engine mapping has 0."""
    out: dict[str, float] = {}
    for name in names:
        where, _, field_name = PARAMETERS[name].target.partition(".")
        field_name, _, key = field_name.partition(".")
        seen = set()
        for cluster in clusters:
            if field_name == "collective_bw_efficiency":
                seen.add(1.0)
                continue
            value = getattr(cluster.gpu if where == "gpu" else cluster.calibration, field_name)
            seen.add(float(value.get(key, 0.0) if key else value))
        if len(seen) == 1:
            out[name] = seen.pop()
    return out


def fit_parameters(records: Sequence[Record], names: Sequence[str], *,
                   evaluate: Evaluate | None = None, sweeps: int = 2,
                   start: Mapping[str, float] | None = None) -> CalibrationFit:
    """Coordinate descent over each parameter's grid, minimizing the median |log error|.

    The descent starts from ``start`` (``calibrate``: the shipped values, ``shipped_values``)
    or the grid defaults, and moves a parameter only when a grid value strictly lowers the
    objective. The objective scores the records the shipped specs predict, a record the
    simulator fails on under a vector counting as an infinite error (``_objective``). A
    parameter that moves no record's prediction across its grid is reported in
    ``no_effect``.

    Raises:
        ConfigError: ``sweeps`` < 1 (no sweep would try any value: the "fit" would be the
            defaults).
    """
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 1:
        raise ConfigError(f"`sweeps` (--sweeps) must be an integer >= 1 (coordinate-descent "
                          f"sweeps), but got {sweeps!r}")
    evaluate = _memoized(evaluate)
    values = {n: float((start or {}).get(n, PARAMETERS[n].default)) for n in names}
    first = dict(values)
    cache: dict[tuple[tuple[str, float], ...], float] = {}
    kinds = set().union(*(PARAMETERS[n].kinds for n in names)) if names else set()
    recs = [r for r in records if r.kind in kinds] or list(records)
    baseline = evaluate(recs, {})  # the cluster specs as shipped
    scored = _scored(baseline)

    def score(vals: Mapping[str, float]) -> float:
        key = tuple(sorted(vals.items()))
        if key not in cache:
            cache[key] = _objective(evaluate(recs, vals), scored)
        return cache[key]

    best = score(values)
    for _ in range(sweeps):
        improved = False
        for n in names:
            for v in PARAMETERS[n].grid:
                trial = {**values, n: float(v)}
                s = score(trial)
                if s < best - 1e-12:
                    best, values, improved = s, trial, True
        if not improved:
            break

    def predictions(vals: Mapping[str, float]) -> tuple:
        res = evaluate(recs, vals)
        return (tuple(sorted((r["id"], r["metric"], r["predicted"])
                             for r in representative_rows(res.rows))),
                tuple(sorted(r["id"] for r in res.skipped)))

    # A parameter the descent moved has an effect; one still at its start may have none.
    no_effect = tuple(n for n in names if values[n] == first[n] and len(
        {predictions({**values, n: float(v)}) for v in (values[n], *PARAMETERS[n].grid)}) == 1)
    from charon_search.validation.runner import source_label

    return CalibrationFit(values=values, objective=best,
                          uncalibrated_objective=_objective(baseline, scored),
                          num_records=len(records),
                          sources=tuple(sorted({source_label(r.source) for r in records})),
                          evaluations=len(cache), no_effect=no_effect)


#: What ``leave_one_source_out`` can hold out, one group at a time: the record's source (the
#: default), or its GPU (a silicon row's ``system``), for parameters every source shares with
#: one engine or host (``charon-search calibrate --holdout-by``).
HOLDOUT_GROUPS = ("source", "gpu")


def holdout_group(record: Record, by: str) -> str:
    """The group of ``record`` that ``leave_one_source_out(by=...)`` holds out together."""
    from charon_search.validation.runner import source_label

    if by == "source":
        return source_label(record.source)
    if by == "gpu":
        return str(record.hardware.get("gpu") or "?")
    raise ConfigError(f"`holdout_by` must be one of {list(HOLDOUT_GROUPS)}, but got {by!r}")


def leave_one_source_out(records: Sequence[Record], names: Sequence[str], *,
                         evaluate: Evaluate | None = None, sweeps: int = 2,
                         by: str = "source", start: Mapping[str, float] | None = None
                         ) -> list[dict[str, Any]]:
    """Per development source (``by="source"``) or GPU (``by="gpu"``): fit on the others,
    report train and held-out test error.

    Each held-out fit runs as many sweeps as the main fit (``calibrate`` passes its
    ``--sweeps``), so a held-out row's train error is what the main fit would reach without
    that group. Holding out by GPU tests a parameter that belongs to a serving engine, whose
    rows all come from one or two sources: a source held out would take every row of its
    engine with it. Records of one group only give no held-out fit (an empty list).
    ``start``: the held-out fits' start (``fit_parameters``)."""
    evaluate = _memoized(evaluate)
    groups = sorted({holdout_group(r, by) for r in records})
    out = []
    for held in groups:
        train = [r for r in records if holdout_group(r, by) != held]
        test = [r for r in records if holdout_group(r, by) == held]
        if not train or not test:
            continue
        fit = fit_parameters(train, names, evaluate=evaluate, sweeps=sweeps, start=start)
        shipped = evaluate(test, {})  # the cluster specs as shipped
        scored = _scored(shipped)
        test_obj = _objective(evaluate(test, fit.values), scored)
        default_obj = _objective(shipped, scored)
        out.append({"held_out": held, "train_records": len(train), "test_records": len(test),
                    "values": fit.values, "train_median_abs_log_error": fit.objective,
                    "test_median_abs_log_error": test_obj,
                    "test_median_abs_log_error_uncalibrated": default_obj})
    return out


def calibration_document(fit: CalibrationFit, clusters: Mapping[str, ClusterSpec],
                         loso: Sequence[Mapping[str, Any]], *, kind: str = "",
                         holdout_by: str = "source") -> dict[str, Any]:
    """The YAML written by ``calibrate``: per-cluster ``calibration`` values with provenance.

    ``clusters`` maps cluster name -> its spec (the fit's shared values are applied to each, so
    per-tier bandwidth efficiencies are that cluster's own values times the fitted scale). The
    blocks leave out the fit's ``no_effect`` parameters: the records say nothing about them,
    so ``--write`` keeps their shipped values (``fit.no_effect`` lists them).
    """
    date = _dt.date.today().isoformat()
    written = {k: v for k, v in fit.values.items() if k not in fit.no_effect}
    fitted = ", ".join(f"{k} = {v:g}" for k, v in written.items())
    prov = (f"charon-search calibrate {date}: {fitted}, a shared fit on {fit.num_records} "
            f"development records of {', '.join(fit.sources)}; median |log(pred/meas)| "
            f"{fit.objective:.4f} (shipped specs {fit.uncalibrated_objective:.4f})")
    blocks = {}
    for name, spec in clusters.items():
        gpu, cal = _spec_changes(spec, written)
        blocks[name] = {"calibration": cal, "gpu": gpu, "provenance": prov}
    out: dict[str, Any] = {"kind": kind} if kind else {}
    if holdout_by != "source":
        out["holdout_by"] = holdout_by
    return {**out, "fit": dataclasses.asdict(fit), "leave_one_source_out": list(loso),
            "clusters": blocks}


def write_refusal(fit: CalibrationFit, loso: Sequence[Mapping[str, Any]], *,
                  held_out_by: str | None = None) -> str:
    """Why ``calibrate --write`` must leave the cluster specs alone ("" when it may write).

    A fit is written only when it lowers the development records' error below the specs as
    shipped and, when a leave-one-out report was asked for (``held_out_by``: what it held
    out, ``source`` or ``gpu``) or made, the records have two or more such groups and the fit
    lowers the held-out error of most of them: a value the data does not determine or one
    that does not carry over to unseen sources would replace a shipped value, and its
    provenance, without evidence. (A parameter no record depends on is not written at all:
    ``fit.no_effect``.)
    """
    if not fit.objective < fit.uncalibrated_objective:
        return (f"the fit's median |log(pred/meas)| {fit.objective:.4f} does not beat the "
                f"shipped specs' {fit.uncalibrated_objective:.4f} on the same "
                f"{fit.num_records} records")
    if held_out_by is not None and len(loso) < 2:
        return (f"the records come from one {held_out_by} only, so leave-one-{held_out_by}-out "
                "has no held-out fit to check the values on; pass --no-loso to write anyway")
    better = sum(1 for row in loso if row["test_median_abs_log_error"]
                 < row["test_median_abs_log_error_uncalibrated"])
    if loso and not better > len(loso) / 2:
        return (f"it lowers the held-out error of only {better} of {len(loso)} held-out "
                "groups (leave-one-out), so it does not carry over to data it did not see")
    return ""


_BLOCK_RE = re.compile(r"^calibration:[^\n]*\n(?:(?:[ \t]+[^\n]*|)\n)*", re.M)


def _base(key: str) -> str:
    from charon_search.units import split_unit_key

    parts = split_unit_key(key)
    return parts[0] if parts else key


def write_cluster_specs(doc: Mapping[str, Any], spec_dir: Path) -> list[Path]:
    """Update only the top-level ``calibration:`` block of each ``<cluster>.yaml``.

    Fitted fields replace the block's entries of the same quantity (whatever unit suffix they
    had) and get a provenance line; other calibration entries are kept. Keys outside the block
    are untouched (comments inside the block are not kept). Fitted GPU efficiencies are not
    written (GPU files belong to the hardware owner); they stay in the calibration output.
    """
    if not spec_dir.is_dir():
        raise ConfigError(f"`spec_dir` (--write) {str(spec_dir)!r} must be an existing folder "
                          "of cluster YAML files (<cluster>.yaml)")
    specs = []  # every file is checked before any is written
    for name in doc["clusters"]:
        path = spec_dir / f"{name}.yaml"
        if not path.exists():
            continue
        text = path.read_text()
        try:
            spec = yaml.safe_load(text)
        except yaml.YAMLError:
            spec = None
        if not isinstance(spec, Mapping) or not {"name", "gpu", "tiers"} <= set(spec):
            raise ConfigError(f"--write: {path} is not a cluster spec (a YAML mapping with "
                              "name, gpu and tiers); no file was changed")
        specs.append((path, text, spec))
    written = []
    for path, text, spec in specs:
        block = doc["clusters"][path.stem]
        old = dict(spec.get("calibration") or {})
        prov = dict(old.pop("provenance", None) or {})
        fitted = dict(block["calibration"])
        merged: dict[str, Any] = {}
        kept: dict[str, str] = {}  # a per-engine mapping keeps the provenance of its other keys
        for k, v in old.items():  # keep the block's order; a fitted quantity takes its place
            match = next((f for f in fitted if _base(f) == _base(k)), None)
            if match is None:
                merged[k] = v
                continue
            was = prov.pop(k, None)
            if isinstance(fitted[match], Mapping) and was:
                kept[match] = str(was)
            if match not in merged:
                merged[match] = fitted[match]
        for key, value in fitted.items():
            merged.setdefault(key, value)
            prov[key] = block["provenance"] + (f"; its other entries: {kept[key]}"
                                               if key in kept else "")
        old = {**merged, "provenance": prov}
        new_block = yaml.safe_dump({"calibration": old}, sort_keys=False, width=99)
        m = _BLOCK_RE.search(text)
        text = (text[:m.start()] + new_block + text[m.end():] if m
                else text.rstrip("\n") + "\n" + new_block)
        path.write_text(text)
        written.append(path)
    return written
