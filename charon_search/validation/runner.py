"""``run_validation``: records -> predictions, skips with reasons, and the summary.

Every record ends up either with at least one predicted metric or in ``skipped`` with a reason
(unknown model, unsupported GPU or feature, simulator missing); metrics of an expressed record
that cannot be predicted are listed in ``skipped_metrics``. Counts reconcile:
``expressed + skipped == total``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from charon_search.errors import ConfigError
from charon_search.validation.names import Unexpressible
from charon_search.validation.predict import predict_case
from charon_search.validation.records import Record, independent_reruns, repeated_measurements
from charon_search.validation.stats import summarize
from charon_search.validation.translate import ServingCase, TrainingCase, to_case

__all__ = ["ValidationResult", "check_record_names", "check_result_json", "merge_json",
           "result_from_json", "run_validation", "select_records", "validate_record"]

#: Assumptions about these fields make a record "not fully specified" (the targets of issue 8
#: apply to fully specified records): they change the simulated work, not only its labelling.
_LAYOUT_ASSUMPTIONS = ("training.global_batch_size", "training.micro_batch_size",
                       "training.schedule", "training.vpp", "training.recompute",
                       "training.zero_stage", "training.sequence_parallel")


@dataclass(frozen=True, kw_only=True)
class ValidationResult:
    rows: list[dict[str, Any]]
    """``{"id", "metric", "measured", "predicted", "error"}`` per predicted metric."""
    skipped: list[dict[str, Any]]
    """``{"id", "reason"}`` per record not expressed."""
    skipped_metrics: list[dict[str, Any]]
    """``{"id", "metric", "reason"}`` per unpredicted metric of an expressed record."""
    cases: dict[str, dict[str, Any]]
    """id -> kind, source, confidence, model, gpu, cluster, assumptions, fully_specified..."""
    summary: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    coverage: list[str] = field(default_factory=list)
    """Which records a merged result covers (one line per part, see ``merge_json``)."""

    def to_json(self) -> dict[str, Any]:
        import datetime as _dt

        out = {"generated_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
               "records": self.rows, "skipped": self.skipped,
               "skipped_metrics": self.skipped_metrics, "cases": self.cases,
               "summary": self.summary, "wall_s": self.wall_s}
        if self.coverage:
            out["coverage"] = list(self.coverage)
        return out


def select_records(records: Sequence[Record], *, kind: str | None = None,
                   ids: Iterable[str] | None = None, limit: int | None = None) -> list[Record]:
    """Filter by kind and ids (an id also selects its variants ``<id>#<n>``), then cap.

    Raises ``ConfigError`` naming the ids no record has (with the closest known ones), or for
    a negative ``limit``."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 0):
        raise ConfigError(f"`limit` (--limit) must be an integer >= 0, but got {limit!r}")
    out = list(records)
    if ids:
        wanted = set(ids)
        known = {r.id for r in out} | {r.parent_id for r in out if r.parent_id}
        unknown = sorted(wanted - known)
        if unknown:
            import difflib

            close = [m for u in unknown[:3] for m in difflib.get_close_matches(u, known, n=2)]
            raise ConfigError(
                f"`ids` (--ids): no record has the id {', '.join(map(repr, unknown[:5]))}"
                + (f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else "")
                + (f"; closest: {', '.join(close)}" if close else "")
                + " (a record's `id` field, or the silicon CSV's `id` column)")
        out = [r for r in out if r.id in wanted or (r.parent_id in wanted)]
    if kind:
        out = [r for r in out if r.kind == kind]
    if limit is not None:
        out = out[:limit]
    return out


def source_label(title: str) -> str:
    """Short name of a source title for tables (``"Llama Team, The Llama 3 Herd of Models"``)."""
    if "silicon_sample.csv (" in title:  # one source per serving framework and pipeline
        return "silicon " + title.rsplit("(", 1)[1].rstrip(")")
    parts = title.split(", ")
    label = parts[0]
    if len(label) < 14 and len(parts) > 1:
        label += ", " + parts[1]
    label = label.split(" (")[0]
    return label if len(label) <= 44 else label[:43] + "…"


def _case_info(record: Record) -> dict[str, Any]:
    return {
        "kind": record.kind, "source": source_label(record.source),
        "source_title": record.source, "confidence": record.confidence,
        "origin": record.origin, "model": record.model.get("catalog") or record.model.get("name"),
        "gpu": record.hardware.get("gpu"), "num_gpus": record.hardware.get("num_gpus"),
        "fully_specified": False, "assumptions": [],
        **({"input_len": record.config.get("input_len"),
            "output_len": record.config.get("output_len"),
            "concurrency": record.config.get("concurrency"),
            "mode": str(record.config.get("mode") or "agg"),
            "engine": _engine_of(record),
            # What splits one engine's rows across builds and campaigns (--group-by
            # engine_version / measured_month / precision): "" where the row does not say.
            "engine_version": str(record.config.get("framework_version") or ""),
            "measured_month": str((record.extra or {}).get("measured_date") or "")[:7],
            "precision": str(record.config.get("precision") or "")}
           if record.kind == "serving" else {}),
    }


#: Engine names of the ``serving.framework`` values published records spell out (prefixes).
_FRAMEWORK_ENGINES = (("tensorrt-llm", "trtllm"), ("trtllm", "trtllm"), ("vllm", "vllm"),
                      ("sglang", "sglang"))


def _engine_of(record: Record) -> str:
    """The serving engine a record ran: a silicon row's ``backend`` column, else the engine its
    ``framework`` names (``"tensorrt-llm (pytorch backend)"`` -> ``trtllm``); "" if neither."""
    backend = str((record.extra or {}).get("backend") or "")
    if backend:
        return backend
    framework = str(record.config.get("framework") or "").lower()
    return next((e for prefix, e in _FRAMEWORK_ENGINES if framework.startswith(prefix)), "")


def _fully_specified(record: Record, assumptions: Sequence[str]) -> bool:
    if record.confidence == "low":
        return False
    return not any(a.startswith(_LAYOUT_ASSUMPTIONS) for a in assumptions)


def run_validation(
    records: Sequence[Record], *,
    progress: Callable[[int, int, Record], None] | None = None,
    simulate_training: Callable[..., Any] | None = None,
    simulate_serving: Callable[..., Any] | None = None,
    memory_report: Callable[..., Any] | None = None,
    cluster_transform: Callable[[Any], Any] | None = None,
    workers: int = 0,
    address: str | None = None,
    executor: Any | None = None,
) -> ValidationResult:
    """Translate, simulate and compare every record.

    Args:
        records: from ``records.load_files`` (filtered with ``select_records``).
        progress: called as ``progress(i, total, record)`` before each record (with workers:
            as each record's result comes back, ``i`` counting the ones done).
        simulate_training, simulate_serving, memory_report: override the simulators (tests).
        cluster_transform: applied to each case's cluster before simulating (calibration).
        workers: 0 = in this process, one record after another; N >= 1 = a pool of N Ray
            actors (``search.worker.RayExecutor``: an embedded local Ray unless ``address``
            or ``RAY_ADDRESS`` names a cluster), each keeping its traced models and loaded
            tables between the records it gets. The result is the same either way: records
            are independent and their rows are put back in record order. Overrides and
            ``cluster_transform`` must then be picklable (module-level functions,
            ``functools.partial`` of them).
        executor: a pool from ``search.worker.make_executor`` to use instead of starting one
            (calibration keeps one across its many calls, with the workers' caches warm); the
            caller closes it.
    """
    t0 = time.perf_counter()
    repeats = repeated_measurements(records)
    kw = dict(simulate_training=simulate_training, simulate_serving=simulate_serving,
              memory_report=memory_report, cluster_transform=cluster_transform)
    if workers < 0:
        raise ConfigError(f"`workers` must be >= 0 (0 = in this process), but got {workers}")
    if executor is not None:
        parts = _validate_on_workers(records, repeats, executor, progress, kw)
    elif workers > 0:
        from charon_search.search.worker import make_executor

        executor = make_executor(workers, address=address)
        try:
            parts = _validate_on_workers(records, repeats, executor, progress, kw)
        finally:
            executor.close()
    else:
        parts = []
        for i, rec in enumerate(records):
            if progress is not None:
                progress(i, len(records), rec)
            parts.append(validate_record(rec, repeats.get(rec.id), **kw))
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    skipped_metrics: list[dict[str, Any]] = []
    cases: dict[str, dict[str, Any]] = {}
    reruns = independent_reruns(records)
    for rec, part in zip(records, parts, strict=True):
        cases[rec.id] = part["info"]
        if rec.id in reruns:
            cases[rec.id]["reruns"] = reruns[rec.id]
        rows += part["rows"]
        skipped += part["skipped"]
        skipped_metrics += part["skipped_metrics"]
    summary = summarize(rows, skipped, cases)
    return ValidationResult(rows=rows, skipped=skipped, skipped_metrics=skipped_metrics,
                            cases=cases, summary=summary, wall_s=time.perf_counter() - t0)


#: How alike (``difflib`` ratio) an uncatalogued ``model.catalog`` name and a catalog name must
#: be for the record to be taken as misspelled (``gpt-1.7bb``) rather than as naming a model the
#: catalog does not have (``palm-540b``, or a shape built from the record's fields).
_MISSPELLED = 0.85


def check_record_names(rec: Record) -> None:
    """Raise ``Unexpressible`` (the record is skipped with the reason) when it names what does
    not exist: a silicon row's ``backend`` that is no serving engine (it would be simulated as a
    generic engine), or a published record's ``model.catalog`` that is not in the model catalog
    but close to a name that is (it would be simulated as a shape built from the record, or
    skipped as an unknown model, with no hint of the misspelling)."""
    import difflib

    if rec.origin == "silicon":
        from charon_search.hardware.spec import SERVING_ENGINES

        backend = str((rec.extra or {}).get("backend") or "")
        if backend not in SERVING_ENGINES:
            close = ([backend.lower()] if backend.lower() in SERVING_ENGINES
                     else difflib.get_close_matches(backend, SERVING_ENGINES, n=1))
            raise Unexpressible(f"unknown backend {backend!r} (silicon CSV column `backend`): "
                                f"must be one of {sorted(SERVING_ENGINES)}"
                                + (f"; closest: {close[0]}" if close else ""))
        return
    cat = rec.model.get("catalog")
    if rec.origin != "published" or not cat:
        return
    from charon_search.errors import CharonError
    from charon_search.validation.names import resolve_model_name

    try:
        resolve_model_name(str(cat))
    except Unexpressible:
        try:
            from charon_search.catalog import list_models

            known = sorted(str(n) for n in list_models())
        except (ImportError, CharonError):
            known = []
        close = difflib.get_close_matches(str(cat), known, n=3, cutoff=_MISSPELLED)
        if close:
            raise Unexpressible(
                f"unknown model.catalog {cat!r}: not in the model catalog; closest: "
                f"{', '.join(close)} (name one of them, or set `model.catalog` to null to build "
                "the model from the record's architecture fields)") from None


def validate_record(rec: Record, repeat: tuple[str, bool] | None = None, *,
                    simulate_training: Callable[..., Any] | None = None,
                    simulate_serving: Callable[..., Any] | None = None,
                    memory_report: Callable[..., Any] | None = None,
                    cluster_transform: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """One record: ``{"info", "rows", "skipped", "skipped_metrics"}`` (builtins only), as
    ``run_validation`` assembles them (``repeat``: ``repeated_measurements``' entry for it)."""
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    skipped_metrics: list[dict[str, Any]] = []
    info = _case_info(rec)
    if repeat is not None:
        info["repeats"], info["repeats_same_setup"] = repeat
    out = {"info": info, "rows": rows, "skipped": skipped, "skipped_metrics": skipped_metrics}
    try:
        check_record_names(rec)
        case = to_case(rec)
        if cluster_transform is not None:
            case = replace(case, cluster=cluster_transform(case.cluster))
        info["cluster"] = case.cluster.name
        info["cluster_choice"] = case.cluster_how
        info["assumptions"] = list(case.assumptions)
        info["fully_specified"] = _fully_specified(rec, case.assumptions)
        if isinstance(case, TrainingCase):
            info["layout"] = _layout_summary(case)
        elif isinstance(case, ServingCase):
            info["sim_num_gpus"] = case.num_gpus
        res = predict_case(case, simulate_training=simulate_training,
                           simulate_serving=simulate_serving, memory_report=memory_report)
    except Unexpressible as e:
        skipped.append({"id": rec.id, "reason": str(e)})
        info["skipped"] = str(e)
        return out
    except Exception as e:
        reason = f"simulator error: {type(e).__name__}: {e}"
        skipped.append({"id": rec.id, "reason": reason})
        info["skipped"] = reason
        return out
    info["sim"] = dict(res.info)
    lost = {m: f"simulator error: predicted {float(v)}" for m, v in res.predicted.items()
            if not math.isfinite(float(v))}
    predicted = {m: v for m, v in res.predicted.items() if m not in lost}
    for metric, reason in {**res.skipped_metrics, **lost}.items():
        skipped_metrics.append({"id": rec.id, "metric": metric, "reason": reason})
    if not predicted:
        reason = "no measured metric can be predicted: " + "; ".join(
            f"{m}: {r}" for m, r in {**res.skipped_metrics, **lost}.items())
        skipped.append({"id": rec.id, "reason": reason})
        info["skipped"] = reason
        return out
    for metric, pred in predicted.items():
        meas = rec.measured[metric]
        rows.append({"id": rec.id, "metric": metric, "measured": meas,
                     "predicted": float(pred), "error": (float(pred) - meas) / meas})
    return out


def _validate_on_workers(records: Sequence[Record], repeats: Mapping[str, tuple[str, bool]],
                         ex: Any, progress: Callable[[int, int, Record], None] | None,
                         kw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``validate_record`` of every record on executor ``ex`` (the ``validation`` evaluator),
    results in record order. A record whose worker call itself failed (not its simulation:
    that is a skip already) is skipped with the error as the reason."""
    from charon_search.search.evaluators import ValidationEvaluator

    parts: list[dict[str, Any]] = [{} for _ in records]
    for i, rec in enumerate(records):
        cfg = {"record": rec, "repeat": repeats.get(rec.id), "overrides": kw}
        ex.submit(i, "validation", cfg, ValidationEvaluator.affinity_key(cfg))
    done = 0
    while ex.pending():
        for i, res in ex.wait():
            part = res.get("part")
            if part is None:  # the evaluator call failed: keep the record, with why
                rec = records[i]
                reason = str(res.get("prune_reason") or "worker error")
                part = {"info": {**_case_info(rec), "skipped": reason}, "rows": [],
                        "skipped": [{"id": rec.id, "reason": reason}], "skipped_metrics": []}
            parts[i] = part
            if progress is not None:
                progress(done, len(records), records[i])
            done += 1
    return parts


def _layout_summary(case: TrainingCase) -> str:
    lay = case.layout
    parts = [f"tp{lay.tp}", f"pp{lay.pp}", f"dp{lay.dp}"]
    if lay.cp > 1:
        parts.append(f"cp{lay.cp}")
    if lay.ep > 1:
        parts.append(f"ep{lay.ep}")
    if lay.vpp > 1:
        parts.append(f"vpp{lay.vpp}")
    parts += [f"mbs{lay.micro_batch_size}", f"gbs{lay.global_batch_size}", f"s{lay.seq_len}",
              f"zero{lay.zero_stage}", lay.recompute, lay.precision]
    if lay.sequence_parallel:
        parts.append("sp")
    if lay.async_tp:
        parts.append("asynctp")
    if lay.precision == "fp8":
        parts.append(f"fp8:{lay.fp8_recipe}")
    if lay.recompute == "selective":
        # Megatron-Core --recompute-modules, when given, decide what is re-run
        parts.append("sel:" + ("+".join(lay.recompute_modules) if lay.recompute_modules
                               else lay.selective_policy))
    if lay.attention_kernel != "flash":
        parts.append(f"attn:{lay.attention_kernel}")
    if lay.loss_kernel != "eager":
        parts.append(f"loss:{lay.loss_kernel}")
    if lay.moe_a2a_overlap:
        parts.append("a2a-overlap")
    if lay.pp_layout:
        parts.append(f"pp-layout:{lay.pp_layout}")
    return " ".join(parts)


#: Fields of a ``validate --json`` list entry: ``records`` (the predicted metrics; the last three
#: are numbers), ``skipped`` and ``skipped_metrics``.
_ROW_FIELDS = ("id", "metric", "measured", "predicted", "error")
_SKIP_FIELDS = ("id", "reason")
_SKIP_METRIC_FIELDS = ("id", "metric", "reason")


def _entry_problem(entry: Any, fields: Sequence[str], numbers: Sequence[str]) -> str:
    """Why ``entry`` is not a mapping with ``fields`` (strings, but ``numbers``); "" if it is."""
    if not isinstance(entry, Mapping):
        return f"is {type(entry).__name__} {entry!r:.60}"
    missing = [k for k in fields if k not in entry]
    if missing:
        return f"(id {entry.get('id')!r:.60}) lacks {', '.join(missing)}"
    for k in fields:
        v = entry[k]
        if k in numbers:
            if isinstance(v, bool) or not isinstance(v, int | float):
                return f"(id {entry.get('id')!r:.60}) has `{k}` {v!r:.60}, not a number"
        elif not isinstance(v, str):
            return f"(id {entry.get('id')!r:.60}) has `{k}` {v!r:.60}, not a string"
    if "error" in numbers:
        meas, pred, err = entry["measured"], entry["predicted"], entry["error"]
        if not (math.isfinite(meas) and meas > 0 and math.isfinite(pred)):
            return (f"(id {entry['id']!r:.60}) has measured {meas!r} and predicted {pred!r}: "
                    "both must be finite and the measurement positive")
        if not math.isclose(err, (pred - meas) / meas, rel_tol=1e-9, abs_tol=1e-12):
            return (f"(id {entry['id']!r:.60}) has `error` {err!r}, not (predicted - measured) / "
                    f"measured = {(pred - meas) / meas!r}")
    return ""


def check_result_json(data: Any, where: str,
                      required: Sequence[str] = ("records", "summary")) -> None:
    """Check the shape of a ``validate --json`` document (``where`` names it in the error).

    The keys ``required`` must be present; ``records`` must be a list of ``{"id", "metric",
    "measured", "predicted", "error"}`` (the last three numbers) whose ids have an entry in
    ``cases`` (a mapping of id -> mapping), ``skipped`` a list of ``{"id", "reason"}``,
    ``skipped_metrics`` a list of ``{"id", "metric", "reason"}``, ``summary`` a mapping;
    ``wall_s`` (a number) and ``coverage`` (a list) are optional. The entries must add up: no
    record both predicted and skipped, every ``cases`` id one or the other, every ``error``
    (predicted - measured) / measured of a finite prediction and a positive measurement.

    Raises:
        ConfigError: naming ``where`` and the first bad entry.
    """
    if not isinstance(data, Mapping) or any(k not in data for k in required):
        raise ConfigError(f"{where} must be the output of `charon-search validate --json` "
                          "(keys records, skipped, summary)")
    cases = data.get("cases", {})
    if not isinstance(cases, Mapping) or not all(isinstance(c, Mapping)
                                                 for c in cases.values()):
        raise ConfigError(f"{where}: `cases` must be a mapping of record id -> mapping, but got "
                          f"{cases!r:.80}")
    lists = (("records", _ROW_FIELDS, ("measured", "predicted", "error")),
             ("skipped", _SKIP_FIELDS, ()), ("skipped_metrics", _SKIP_METRIC_FIELDS, ()))
    for key, fields, numbers in lists:
        entries = data.get(key, [])
        if not isinstance(entries, list):
            raise ConfigError(f"{where}: `{key}` must be a list of {{{', '.join(fields)}}}, "
                              f"but got {type(entries).__name__} {entries!r:.60}")
        for i, entry in enumerate(entries):
            why = _entry_problem(entry, fields, numbers)
            if not why and key == "records" and entry["id"] not in cases:
                why = f"(id {entry['id']!r}) has no entry in `cases`"
            if why:
                shape = "{" + ", ".join(fields) + "}" + (
                    f" ({', '.join(numbers)} numbers)" if numbers else "")
                raise ConfigError(f"{where}: `{key}[{i}]` {why}; each entry of `{key}` must "
                                  f"be a mapping {shape}")
    predicted = {e["id"] for e in data.get("records", [])}
    skipped = {e["id"] for e in data.get("skipped", [])}
    if predicted & skipped:
        raise ConfigError(f"{where}: record {sorted(predicted & skipped)[0]!r} is both predicted "
                          "(`records`) and skipped (`skipped`); a record is one or the other")
    unaccounted = [c for c in cases if c not in predicted and c not in skipped]
    if unaccounted:
        raise ConfigError(f"{where}: {len(unaccounted)} record(s) of `cases` are neither "
                          f"predicted nor skipped (first: {unaccounted[0]!r}): the file was cut "
                          "short or edited; write it again with `charon-search validate --json`")
    if not isinstance(data.get("summary", {}), Mapping):
        raise ConfigError(f"{where}: `summary` must be a mapping, but got "
                          f"{type(data['summary']).__name__}")
    wall = data.get("wall_s", 0.0)
    if isinstance(wall, bool) or not isinstance(wall, int | float):
        raise ConfigError(f"{where}: `wall_s` must be a number, but got {wall!r:.60}")
    if not isinstance(data.get("coverage", []), list):
        raise ConfigError(f"{where}: `coverage` must be a list of strings")


def result_from_json(data: Mapping[str, Any]) -> ValidationResult:
    """Rebuild a result from ``to_json`` output (for ``accuracy`` and ``calibrate``).

    Raises:
        ConfigError: ``data`` is not ``validate --json`` output (``check_result_json``).
    """
    check_result_json(data, "validate JSON", required=("records",))
    return ValidationResult(rows=list(data.get("records", [])),
                            skipped=list(data.get("skipped", [])),
                            skipped_metrics=list(data.get("skipped_metrics", [])),
                            cases=dict(data.get("cases", {})),
                            summary=dict(data.get("summary", {})),
                            wall_s=float(data.get("wall_s", 0.0)),
                            coverage=[str(c) for c in data.get("coverage", [])])


def read_result(path: Any, flag: str) -> tuple[ValidationResult, dict[str, Any]]:
    """Read a ``validate --json`` file given on the command line as ``flag`` (for the error).

    Returns the result, its summary recomputed by the current ``stats.summarize`` (so older
    files get every current block), and the raw document.

    Raises:
        ConfigError: the file is not readable JSON or not ``validate --json`` output.
    """
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{flag} {str(path)!r}: not a readable JSON file: {e}") from None
    check_result_json(data, f"{flag} {str(path)!r}")
    result = result_from_json(data)
    return replace(result, summary=summarize(result.rows, result.skipped, result.cases)), data


def merge_json(parts: Sequence[tuple[Mapping[str, Any], str]]) -> dict[str, Any]:
    """One ``validate --json`` document from several runs (e.g. training + a serving subset).

    Args:
        parts: ``(validate JSON, what it covers)`` per run; the description (selection and
            date) goes to ``coverage`` and into the accuracy report.

    Raises:
        ConfigError: a part is not ``validate --json`` output, or two parts share a record id.
    """
    from charon_search.errors import ConfigError

    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    skipped_metrics: list[dict[str, Any]] = []
    cases: dict[str, dict[str, Any]] = {}
    coverage: list[str] = []
    wall = 0.0
    for i, (data, note) in enumerate(parts):
        if not isinstance(data, Mapping) or "records" not in data or "cases" not in data:
            raise ConfigError(f"part {i} must be `charon-search validate --json` output "
                              "(keys records, skipped, cases)")
        dup = set(cases) & set(data["cases"])
        if dup:
            raise ConfigError(f"record ids must be unique across parts, but part {i} repeats "
                              f"{sorted(dup)[:3]}")
        part = result_from_json(data)
        rows += part.rows
        skipped += part.skipped
        skipped_metrics += part.skipped_metrics
        cases.update(part.cases)
        wall += part.wall_s
        when = str(data.get("generated_at") or "")
        coverage += part.coverage or [f"{note}" + (f" (validate run of {when})" if when else "")]
    merged = ValidationResult(rows=rows, skipped=skipped, skipped_metrics=skipped_metrics,
                              cases=cases, summary=summarize(rows, skipped, cases), wall_s=wall,
                              coverage=coverage)
    out = merged.to_json()
    whens = [str(d.get("generated_at")) for d, _ in parts if d.get("generated_at")]
    if whens:
        out["generated_at"] = max(whens)  # the latest simulation, not the time of the merge
    return out
