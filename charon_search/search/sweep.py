"""Scheduled capacity sweeps: (space, objective, model, GPU) searches into one Parquet dataset.

A sweep file (``sweeps/<name>.yaml``)::

    name: capacity
    trials: 200            # per combination (a run may override)
    sampler: nsga2
    runs:
      - space: spaces/llama3-70b-serving-disagg.yaml
        objective: objectives/slo-ttft1s-tpot50ms.yaml
        models: [llama-3.1-70b]
        gpus: {h100: dgx-h100-ib400, h200: dgx-h200-ib400}   # label -> cluster

Each (run, model, gpu) fixes the space's ``model`` and ``cluster`` and runs a study; the trials
(with a boolean ``pareto`` column) go to a Hive-partitioned dataset
``OUT/sweep=<name>/model=<model>/gpu=<label>/date=<date>/part-0.parquet`` so planners can diff
fronts between dates (``pyarrow.dataset.dataset(OUT, partitioning="hive")``). Studies are kept as
journal files under ``OUT/_studies/`` so an interrupted sweep resumes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from charon_search.errors import ConfigError

__all__ = ["SweepEntry", "SweepSpec", "load_sweep", "run_sweep"]

_KEYS = ("name", "description", "trials", "sampler", "seed", "workers", "date", "runs")
_RUN_KEYS = ("space", "objective", "models", "gpus", "trials", "sampler")


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepEntry:
    space: str
    objective: str
    models: tuple[str, ...]
    gpus: tuple[tuple[str, str], ...]
    """(label, cluster name) pairs."""
    trials: int
    sampler: str


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    name: str
    entries: tuple[SweepEntry, ...]
    seed: int = 0
    workers: int = 1
    date: str = ""
    """Partition label of this run (default: today, UTC)."""
    description: str = ""
    path: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


def load_sweep(path: str | Path) -> SweepSpec:
    """Load and validate ``sweeps/<name>.yaml``; ``ConfigError`` names file, field and choices."""
    from charon_search.search.space import _read_yaml, _resolve, reject_unknown_keys
    from charon_search.search.study import MAX_SEED

    p = _resolve(path, "sweeps")
    data = _read_yaml(p)
    where = str(p)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: a sweep file must be a mapping with keys {list(_KEYS)}")
    reject_unknown_keys(data, _KEYS, where, "")
    if "name" not in data or not isinstance(data.get("runs"), list) or not data["runs"]:
        raise ConfigError(f"{where}: fields `name` and a non-empty list `runs` are required")
    default_trials = _int_field(data.get("trials", 100), f"{where}: field `trials`", 1)
    entries = []
    for i, run in enumerate(data["runs"]):
        at = f"runs[{i}]"
        if not isinstance(run, Mapping):
            raise ConfigError(f"{where}: field `{at}` must be a mapping with keys "
                              f"{list(_RUN_KEYS)}")
        reject_unknown_keys(run, _RUN_KEYS, where, at)
        for req in ("space", "objective", "models", "gpus"):
            if req not in run:
                raise ConfigError(f"{where}: field `{at}.{req}` is required")
        models = run["models"]
        if not isinstance(models, list) or not models:
            raise ConfigError(f"{where}: field `{at}.models` must be a non-empty list of names")
        gpus = run["gpus"]
        if isinstance(gpus, list):
            pairs = tuple((str(g), str(g)) for g in gpus)
        elif isinstance(gpus, Mapping):
            pairs = tuple((str(k), str(v)) for k, v in gpus.items())
        else:
            raise ConfigError(f"{where}: field `{at}.gpus` must be a list of cluster names or a "
                              f"mapping label -> cluster name")
        if _space_evaluator(run["space"], where, at) in ("training", "serving"):
            _check_names(where, at, models, pairs, isinstance(gpus, Mapping))
        trials = _int_field(run["trials"], f"{where}: field `{at}.trials`", 1) \
            if "trials" in run else default_trials
        entries.append(SweepEntry(
            space=str(run["space"]), objective=str(run["objective"]),
            models=tuple(str(m) for m in models), gpus=pairs, trials=trials,
            sampler=str(run.get("sampler", data.get("sampler", "nsga2")))))
    date = str(data.get("date") or "")
    seed = _int_field(data.get("seed", 0), f"{where}: field `seed`", 0, MAX_SEED)
    workers = _int_field(data.get("workers", 1), f"{where}: field `workers`", 0)
    return SweepSpec(name=str(data["name"]), entries=tuple(entries), seed=seed,
                     workers=workers, date=date,
                     description=str(data.get("description", "")), path=where)


def _space_evaluator(space: Any, where: str, at: str) -> str:
    """The ``evaluator`` a run's space file names ("" when it names none)."""
    from charon_search.search.space import _read_yaml, _resolve

    try:
        data = _read_yaml(_resolve(str(space), "spaces"))
    except ConfigError as e:
        raise ConfigError(f"{where}: field `{at}.space`: {e}") from None
    return str(data.get("evaluator") or "") if isinstance(data, Mapping) else ""


def _check_names(where: str, at: str, models: list[Any],
                 gpus: tuple[tuple[str, str], ...], labelled: bool) -> None:
    """Every model and cluster a run names exists, so a misspelt one fails before the sweep's
    first search rather than in the middle of it."""
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster

    for j, model in enumerate(models):
        try:
            load_model(str(model))
        except ConfigError as e:
            raise ConfigError(f"{where}: field `{at}.models[{j}]`: {e}") from None
    for j, (label, cluster) in enumerate(gpus):
        try:
            load_cluster(cluster)
        except ConfigError as e:
            field = f"{at}.gpus.{label}" if labelled else f"{at}.gpus[{j}]"
            raise ConfigError(f"{where}: field `{field}`: {e}") from None


def _int_field(value: Any, where: str, low: int, high: int | None = None) -> int:
    """``value`` as an integer in [low, high]; ``ConfigError`` naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{where} must be an integer {allowed}, but got {value!r}")
    return value


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, workers: int | None = None,
              trials: int | None = None, date: str | None = None,
              ray_address: str | None = None, progress: bool = False,
              guard: float | None = None) -> list[dict[str, Any]]:
    """Run every (entry, model, gpu) search; write the partitioned dataset; return summaries.
    ``guard`` replaces every objective's guard (``search.objective``): capacity that holds at
    that quantile of the validated error. Rows and summaries carry the guard used."""
    from charon_search.search.objective import load_objective
    from charon_search.search.results import write_parquet
    from charon_search.search.space import load_space
    from charon_search.search.study import (
        SearchOptions,
        check_ray_address,
        check_search_numbers,
        run_search,
    )

    if trials is not None:
        check_search_numbers(trials=trials)
    out = Path(out_dir)
    day = date or spec.date or dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    n_workers = spec.workers if workers is None else workers
    if n_workers < 0:
        raise ConfigError(f"`workers` must be >= 0 (0 = evaluate in this process), but got "
                          f"{n_workers}")
    started_ray = False
    if n_workers > 0:
        from charon_search.search.worker import init_ray

        check_ray_address(ray_address)  # what init_ray connects to (None: a local Ray)
        started_ray = init_ray(ray_address, n_workers)
    summaries = []
    try:
        for entry in spec.entries:
            base = load_space(entry.space)
            objective = load_objective(entry.objective)
            if guard is not None:
                objective = dataclasses.replace(objective, guard=guard)
            for model in entry.models:
                for label, cluster in entry.gpus:
                    space = base.with_fixed(model=model, cluster=cluster)
                    parts = (f"sweep={_safe(spec.name)}", f"model={_safe(model)}",
                             f"gpu={_safe(label)}", f"date={_safe(day)}")
                    study_dir = out.joinpath("_studies", *parts)
                    res = run_search(space, objective, SearchOptions(
                        trials=entry.trials if trials is None else trials, workers=n_workers,
                        sampler=entry.sampler, seed=spec.seed, out_dir=str(study_dir),
                        ray_address=ray_address, progress=progress,
                        study_name=f"{spec.name}-{model}-{label}-{day}-{base.name}"))
                    front = {r["trial_number"] for r in res.pareto}
                    rows = [{**r, "pareto": r["trial_number"] in front, "space": base.name,
                             "objective": objective.name, "guard": objective.guard,
                             "cluster": cluster}
                            for r in res.rows]
                    write_parquet(rows, out.joinpath(*parts, f"part-{_safe(base.name)}.parquet"))
                    summaries.append({"sweep": spec.name, "model": model, "gpu": label,
                                      "date": day, "space": base.name,
                                      "guard": objective.guard, **res.summary()})
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    return summaries
