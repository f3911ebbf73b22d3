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
(with boolean columns ``pareto``: on the Pareto front, configs with equal objective values and
repeats included, and ``pareto_representative``: the row ``pareto.parquet`` lists for its
objective vector) go to a Hive-partitioned dataset
``OUT/sweep=<name>/model=<model>/gpu=<label>/date=<date>/part-<space>-<objective>.parquet`` so
planners can diff fronts between dates: ``read_sweep(OUT)``, or
``pyarrow.dataset.dataset(OUT, partitioning="hive")``. Partition values are URI-encoded
(``model=meta-llama%2FLlama-3.1-8B``), which pyarrow's Hive partitioning decodes, so a model id
reads back as written. Every part file gives a column the same type (config keys and trial numbers
integers, other numbers float64, bookkeeping columns their own types, an empty column the type
earlier part files gave it, else string for text and float64), so the files of different dates
read as one dataset; ``read_sweep`` also reads files whose empty columns were typed otherwise.
Studies are kept as journal files under ``OUT/_studies/`` (without ``pareto.html``) so an
interrupted sweep resumes with the same ``--date``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from charon_search.errors import ConfigError

__all__ = ["SweepEntry", "SweepSpec", "load_sweep", "read_sweep", "run_sweep"]

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
    from charon_search.search.study import MAX_SEED, SAMPLERS

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
        if not pairs:
            raise ConfigError(f"{where}: field `{at}.gpus` must name at least one cluster")
        run = {**run, "space": _beside(run["space"], p, "spaces"),
               "objective": _beside(run["objective"], p, "objectives")}
        if _space_evaluator(run["space"], where, at) in ("training", "serving"):
            _check_names(where, at, models, pairs, isinstance(gpus, Mapping))
        trials = _int_field(run["trials"], f"{where}: field `{at}.trials`", 1) \
            if "trials" in run else default_trials
        sampler = str(run.get("sampler", data.get("sampler", "nsga2")))
        if sampler not in SAMPLERS:
            field = f"{at}.sampler" if "sampler" in run else "sampler"
            raise ConfigError(f"{where}: field `{field}` must be one of {SAMPLERS.names()}, "
                              f"but got {sampler!r}")
        entries.append(SweepEntry(
            space=str(run["space"]), objective=str(run["objective"]),
            models=tuple(str(m) for m in models), gpus=pairs, trials=trials,
            sampler=sampler))
    combos: dict[tuple[str, str, str, str], int] = {}
    for i, e in enumerate(entries):
        for model in e.models:
            for label, _ in e.gpus:
                key = (e.space, e.objective, model, label)
                if key in combos:
                    raise ConfigError(
                        f"{where}: fields `runs[{combos[key]}]` and `runs[{i}]` both search "
                        f"space {e.space!r} with objective {e.objective!r} for model {model!r} "
                        f"on gpu {label!r}: they would share one study and one part file")
                combos[key] = i
    date = str(data.get("date") or "")
    seed = _int_field(data.get("seed", 0), f"{where}: field `seed`", 0, MAX_SEED)
    workers = _int_field(data.get("workers", 1), f"{where}: field `workers`", 0)
    return SweepSpec(name=str(data["name"]), entries=tuple(entries), seed=seed,
                     workers=workers, date=date,
                     description=str(data.get("description", "")), path=where)


def _beside(value: Any, sweep_file: Path, folder: str) -> str:
    """A run's space or objective path: as given when it exists from the working directory
    (or names a file of ``folder/`` there), else relative to the sweep file's folder or the
    folder above it (a shipped sweep names ``spaces/...`` from the repository root)."""
    text = str(value)
    given = Path(text)
    if given.is_absolute() or given.exists() or (Path(folder) / given).exists() or (
            Path(folder) / f"{text}.yaml").exists():
        return text
    for base in (sweep_file.parent, sweep_file.parent.parent):
        if (base / given).exists():
            return str(base / given)
    return text


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


def _segment(label: str) -> str:
    """``label`` as a path segment: URI-encoded (``/`` -> ``%2F``), as pyarrow's Hive
    partitioning decodes it by default; distinct labels stay distinct."""
    from urllib.parse import quote

    return quote(str(label), safe="")


#: Types of the bookkeeping columns (``search.results.BASE_COLUMNS``) and the sweep's own:
#: every part file writes them so, whatever values (or none) a combination has.
_COLUMN_TYPES = {
    "trial_number": "int64", "uid": "string", "feasible": "bool", "valid": "bool",
    "prune_reason": "string", "constraint_violation": "double", "memo_hit": "bool",
    "error": "bool", "eval_wall_s": "double", "eval_cpu_s": "double",
    "eval_end_unix_s": "double", "worker_id": "string", "node_id": "string",
    "family": "string", "pareto": "bool", "pareto_representative": "bool", "space": "string",
    "objective": "string", "guard": "double", "cluster": "string", "model": "string",
}


def _is_text(name: str) -> bool:
    """An all-empty metric column holds text (``guard_band.*``, ``memory.reason``)."""
    return name.startswith("guard_band.") or name.rsplit(".", 1)[-1].endswith("reason")


def _uniform_types(table: Any, int_columns: frozenset[str],
                   known: Mapping[str, Any] | None = None) -> Any:
    """``table`` with the column types every part file shares: ``_COLUMN_TYPES`` for the
    bookkeeping columns; ``int_columns`` stay integers, other integer columns become float64
    (a metric is integral on one GPU, fractional on another). A column without any value is
    given the type ``known`` (earlier part files of the dataset) has for it, else string for
    text (``_is_text``) and float64 otherwise, never pyarrow's ``null``."""
    import pyarrow as pa

    fields = []
    for f in table.schema:
        typ = f.type
        if f.name in _COLUMN_TYPES:
            typ = pa.type_for_alias(_COLUMN_TYPES[f.name])
        elif pa.types.is_null(typ):
            typ = (known or {}).get(f.name) or (pa.string() if _is_text(f.name)
                                                else pa.float64())
        elif pa.types.is_integer(typ) and f.name not in int_columns:
            typ = pa.float64()
        fields.append(pa.field(f.name, typ))
    return table.cast(pa.schema(fields))


def _part_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if "_studies" not in p.parts)


def _typed_schema(path: Path) -> Any:
    """The schema of a part file, with a column that holds no value typed ``null``: it says
    nothing about the column's type, so it unifies with any other file's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = pq.read_metadata(path)
    schema = meta.schema.to_arrow_schema()
    fields = []
    for i, f in enumerate(schema):
        nulls = 0
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(i).statistics
            if stats is None or not stats.has_null_count:
                nulls = -1
                break
            nulls += stats.null_count
        fields.append(pa.field(f.name, pa.null()) if nulls == meta.num_rows else f)
    return pa.schema(fields)


def _known_types(root: Path) -> dict[str, Any]:
    """Column name -> its type in the first part file under ``root`` that has a value in it."""
    import pyarrow as pa

    known: dict[str, Any] = {}
    for path in _part_files(root) if root.is_dir() else []:
        for f in _typed_schema(path):
            if not pa.types.is_null(f.type):
                known.setdefault(f.name, f.type)
    return known


def read_sweep(out_dir: str | Path) -> Any:
    """The sweep dataset under ``out_dir`` as one pyarrow Table (partition columns included),
    reading every part file with the union of their schemas (older files may lack a column,
    hold it as another type, or hold no value in it)."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    root = Path(out_dir)
    files = _part_files(root)
    if not files:
        raise ConfigError(f"`out_dir` {str(root)!r} holds no sweep part files")
    schema = pa.unify_schemas([_typed_schema(f) for f in files], promote_options="permissive")
    written: dict[str, Any] = {}  # a column empty in every file: the type it was written as
    for f in files:
        for fld in pq.read_schema(f):
            written.setdefault(fld.name, fld.type)
    schema = pa.schema([pa.field(f.name, written[f.name]) if pa.types.is_null(f.type) else f
                        for f in schema])
    paths = [str(f) for f in files]
    part = ds.partitioning(flavor="hive")
    found = ds.dataset(paths, partitioning=part, partition_base_dir=str(root)).schema
    keys = [f for f in found if f.name not in schema.names]   # sweep, model, gpu, date
    return ds.dataset(paths, schema=pa.schema([*schema, *keys]), partitioning=part,
                      partition_base_dir=str(root)).to_table()


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, workers: int | None = None,
              trials: int | None = None, date: str | None = None,
              ray_address: str | None = None, progress: bool = False,
              guard: float | None = None) -> list[dict[str, Any]]:
    """Run every (entry, model, gpu) search; write the partitioned dataset; return summaries.
    ``guard`` replaces every objective's guard (``search.objective``): capacity that holds at
    that quantile of the validated error. Rows and summaries carry the guard used."""
    from charon_search.search.objective import load_objective
    from charon_search.search.results import front_flags, write_parquet
    from charon_search.search.space import load_space
    from charon_search.search.study import (
        SearchInterrupted,
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
    # Every run's space and objective is read before the first search starts, so a bad file
    # of the last run does not fail the sweep hours in.
    loaded = []
    for i, entry in enumerate(spec.entries):
        try:
            base = load_space(entry.space)
        except ConfigError as e:
            raise ConfigError(f"{spec.path}: field `runs[{i}].space`: {e}") from None
        try:
            objective = load_objective(entry.objective)
        except ConfigError as e:
            raise ConfigError(f"{spec.path}: field `runs[{i}].objective`: {e}") from None
        if guard is not None:
            objective = dataclasses.replace(objective, guard=guard)
        loaded.append((entry, base, objective))
    summaries = []
    try:
        for entry, base, objective in loaded:
            for model in entry.models:
                for label, cluster in entry.gpus:
                    space = base.with_fixed(model=model, cluster=cluster)
                    parts = (f"sweep={_segment(spec.name)}", f"model={_segment(model)}",
                             f"gpu={_segment(label)}", f"date={_segment(day)}")
                    study_dir = out.joinpath("_studies", *parts)
                    try:
                        # html=False: the dataset is the output, and each pareto.html would
                        # embed its own 4.8 MB copy of plotly.js.
                        res = run_search(space, objective, SearchOptions(
                            trials=entry.trials if trials is None else trials,
                            workers=n_workers, sampler=entry.sampler, seed=spec.seed,
                            out_dir=str(study_dir), ray_address=ray_address,
                            progress=progress, html=False,
                            new_study_hint="use another --date or --out",
                            study_name=f"{spec.name}-{model}-{label}-{day}-{base.name}-"
                                       f"{objective.name}"))
                    except SearchInterrupted as e:
                        raise SearchInterrupted(
                            f"interrupted in model={model} gpu={label}: {e.num_stored}/"
                            f"{e.trials} trials stored in {e.storage}; {len(summaries)} "
                            f"combination(s) written before it; run the same command with "
                            f"--date {day} to resume", num_stored=e.num_stored,
                            trials=e.trials, storage=e.storage) from None
                    on_front = front_flags(res.rows, res.pareto, objective)
                    representatives = {r["trial_number"] for r in res.pareto}
                    rows = [{**r, "pareto": on, "space": base.name,
                             "pareto_representative": r["trial_number"] in representatives,
                             "objective": objective.name, "guard": objective.guard,
                             "cluster": cluster}
                            for r, on in zip(res.rows, on_front, strict=True)]
                    name = f"part-{_segment(base.name)}-{_segment(objective.name)}.parquet"
                    ints = frozenset(res.config_keys) | {"trial_number"}
                    known = _known_types(out)
                    write_parquet(rows, out.joinpath(*parts, name),
                                  transform=lambda t, ints=ints, known=known:
                                  _uniform_types(t, ints, known))
                    summaries.append({"sweep": spec.name, "model": model, "gpu": label,
                                      "date": day, "space": base.name,
                                      "guard": objective.guard, **res.summary()})
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    return summaries
