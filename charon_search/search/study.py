"""The study loop: Optuna ask/tell over a pool of workers, memoised, constrained, resumable.

Design (measured here, optuna 5.0: per trial, in-memory ask/tell ~0.3 ms, journal-file ask/tell
~8 ms, SQLite ask/tell ~67 ms; ``add_trial`` of a finished trial: journal ~0.75 ms, SQLite ~20 ms):

* The sampler works on an **in-memory** study; finished trials are copied to the **durable**
  storage in batches (``flush_every`` trials or ``flush_interval_s``) with ``add_trial``. The
  durable storage only ever holds finished trials, so an interrupted study holds no half-done
  trial, and resuming loads them back into the in-memory study (sampler state included, e.g.
  NSGA-II generations) and continues to ``trials`` in total: nothing lost, nothing duplicated.
  At most the last unflushed batch is re-asked after a hard kill of the driver.
* Default durable storage: a journal file (``OUT/study.journal``; optuna-dashboard reads it).
  ``sqlite:///``, ``postgresql://`` and ``mysql://`` URLs go to Optuna's RDB storage.
* Every trial ends COMPLETE. Invalid points (a space rule fails: never simulated), infeasible
  points (out of memory, checked first in the worker) and SLO misses carry positive values of
  ``trial.set_constraint`` (constraints ``valid``, ``evaluable``, then one per objective
  constraint), so NSGA-II / TPE / GP learn from them instead of stalling on PRUNED trials.
* Results are memoised by canonical config: a re-proposed config is told the stored result
  without simulating again (``memo_hit``), and a config already in flight waits for that result.

The driver shares the cores with the workers, so its per-trial work is kept small: the sampler's
in-memory trial gets only its constraints and values (the config and record go straight into the
``FrozenTrial`` copied to the durable store, not through one storage call per attribute); the grid
sampler submits its pre-validated points without an ask/suggest round trip; batches go to the
durable store on a background writer thread, and a journal flush appends the whole batch with
one write and one fsync; the progress bar redraws at most 10 times a second. Workers warm up
(trace, load predictors) in parallel before their first batch, and configs that share cached
intermediates go to the same worker (``Evaluator.affinity_key``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from charon_search.config_fields import MAX_SEED
from charon_search.errors import ConfigError
from charon_search.registry import Registry
from charon_search.search.objective import Objective
from charon_search.search.results import (
    CONFIG_PREFIX,
    RECORD_PREFIX,
    config_columns,
    encode_attr,
    pareto_rows,
    split_attrs,
    trial_rows,
    write_outputs,
)
from charon_search.search.rules import RuleContext
from charon_search.search.space import SearchSpace, config_key
from charon_search.search.storage import make_storage
from charon_search.search.worker import make_executor

__all__ = ["SAMPLERS", "SearchInterrupted", "SearchOptions", "SearchResult",
           "check_ray_address", "check_search_numbers", "make_storage", "run_search"]

SAMPLERS: Registry[Callable[..., Any]] = Registry("sampler")

#: Constraint values for points that were never evaluated / could not run (relative units).
_INVALID_VIOLATION = 100.0
_UNEVALUABLE_VIOLATION = 10.0


@SAMPLERS.register("nsga2")
def _nsga2(seed: int | None, population_size: int | None) -> Any:
    import optuna

    return optuna.samplers.NSGAIISampler(
        seed=seed, population_size=50 if population_size is None else population_size)


@SAMPLERS.register("tpe")
def _tpe(seed: int | None, population_size: int | None) -> Any:
    import optuna

    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=20)


@SAMPLERS.register("gp")
def _gp(seed: int | None, population_size: int | None) -> Any:
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # `deterministic_objective` is "experimental"
        return optuna.samplers.GPSampler(seed=seed, deterministic_objective=True)


@SAMPLERS.register("random")
def _random(seed: int | None, population_size: int | None) -> Any:
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


@SAMPLERS.register("grid")
def _grid(seed: int | None, population_size: int | None) -> Any:
    # Grid enqueues every valid point itself (see run_search); the sampler is never consulted.
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOptions:
    """How to run a search."""

    trials: int
    """Total trials the study should hold, >= 1 (a resumed study runs only the missing ones)."""
    workers: int = 1
    """Ray actors; 0 evaluates in the driver process (no Ray)."""
    sampler: str = "nsga2"
    """``nsga2`` (default), ``tpe``, ``gp``, ``random`` or ``grid`` (every valid point once)."""
    seed: int | None = 0
    """Sampler seed in [0, 2**32 - 1]; None = random."""
    storage: str | None = None
    """Optuna storage URL; None = journal file ``OUT/study.journal`` (in memory without OUT)."""
    study_name: str | None = None
    """Defaults to the space name."""
    ray_address: str | None = None
    """An existing Ray cluster (``auto``, ``ray://host:10001``); default: embedded local Ray."""
    out_dir: str | None = None
    progress: bool = False
    population_size: int | None = None
    """NSGA-II population, >= 2 (None: 50)."""
    flush_every: int = 64
    flush_interval_s: float = 2.0
    html: bool = True
    max_evaluations: int | None = None
    """Stop once this many configs were simulated in this invocation (budget by simulations;
    invalid points and memo hits are free); None = only ``trials`` limits."""
    new_study_hint: str = "use another --study-name or --out"
    """How the caller starts a new study, for the errors that refuse to resume a stored one."""


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What a search produced (counts are over the whole study, resumed trials included)."""

    study_name: str
    storage: str
    num_trials: int
    num_feasible: int
    num_infeasible: int
    num_invalid: int
    num_errors: int
    num_new_trials: int
    num_evaluations: int
    """Simulations run in this invocation (memo hits and invalid points excluded)."""
    num_memo_hits: int
    wall_s: float
    trials_per_s: float
    workers: int
    nodes_used: int
    num_worker_restarts: int
    num_resubmits: int
    rows: list[dict[str, Any]] = field(repr=False)
    pareto: list[dict[str, Any]] = field(repr=False)
    config_keys: list[str] = field(default_factory=list)
    """Config columns of ``rows`` (the rest are metrics and bookkeeping)."""
    out_dir: str | None = None

    def summary(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "num_trials": self.num_trials, "num_feasible": self.num_feasible,
            "num_infeasible": self.num_infeasible, "pareto_size": len(self.pareto),
            "wall_s": self.wall_s, "trials_per_s": self.trials_per_s, "workers": self.workers,
            "nodes_used": self.nodes_used, "num_invalid": self.num_invalid,
            "num_errors": self.num_errors, "num_new_trials": self.num_new_trials,
            "num_evaluations": self.num_evaluations, "num_memo_hits": self.num_memo_hits,
            "num_worker_restarts": self.num_worker_restarts, "study_name": self.study_name,
            "storage": self.storage,
        }


def run_search(space: SearchSpace, objective: Objective, options: SearchOptions, *,
               evaluator: Any | None = None, context: RuleContext | None = None,
               on_record: Callable[[dict[str, Any]], None] | None = None) -> SearchResult:
    """Run (or resume) a study until it holds ``options.trials`` trials; write the outputs.

    Args:
        space: the search space.
        objective: objective terms and constraints.
        options: trials, workers, sampler, storage...
        evaluator: a pre-built evaluator instance, evaluated in-process (benchmarks, tests).
        context: model/cluster lookups for the validity rules (default: catalog and hardware).
        on_record: called with each evaluated record in the driver (progress hooks, tests).

    Returns:
        The ``SearchResult`` (computed from the durable storage).

    Example:
        >>> res = run_search(load_space("spaces/quickstart-llama8b-training.yaml"),
        ...                  load_objective("objectives/train-fast-cheap.yaml"),
        ...                  SearchOptions(trials=60, workers=2, out_dir="runs/quick"))
        ... # doctest: +SKIP
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_search_numbers(trials=options.trials, seed=options.seed,
                         population_size=options.population_size)
    SAMPLERS.get(options.sampler)  # unknown names fail before anything starts
    if options.workers > 0 and evaluator is None:  # before Ray retries a dead address forever
        check_ray_address(options.ray_address or os.environ.get("RAY_ADDRESS") or None)
    if objective.guard is not None:  # so do unreadable error bands
        from charon_search.validation.bands import shipped_bands

        shipped_bands()
    ctx = context or RuleContext()
    study_name = options.study_name or space.name
    storage, storage_desc = make_storage(options.storage, options.out_dir)
    durable = optuna.create_study(storage=storage, study_name=study_name,
                                  directions=objective.directions,  # type: ignore[arg-type]
                                  load_if_exists=True)
    complete = (optuna.trial.TrialState.COMPLETE,)
    previous = durable.get_trials(deepcopy=False, states=complete)
    got = [d.name.lower() for d in durable.directions]
    if got != objective.directions and not durable.get_trials(deepcopy=False):
        # An empty study (its first run stopped before storing any trial, pruned ones
        # included) has nothing to mix with: start it again with these directions.
        optuna.delete_study(study_name=study_name, storage=storage)
        durable = optuna.create_study(storage=storage, study_name=study_name,
                                      directions=objective.directions)  # type: ignore[arg-type]
    elif got != objective.directions:
        raise ConfigError(
            f"study {study_name!r} in {storage_desc} has directions {got}, but objective "
            f"{objective.name!r} needs {objective.directions}; {options.new_study_hint}"
        )
    if not previous:
        # No stored trial was run under the stored definitions (if any): take these.
        _store_definitions(durable, space, objective)
    elif durable.user_attrs.get("guard") != objective.guard:
        # The stored trials' constraints were checked at the other guard: mixing would count
        # feasibility two ways in one front.
        raise ConfigError(
            f"study {study_name!r} in {storage_desc} checked its constraints with guard "
            f"{durable.user_attrs.get('guard')}, but objective {objective.name!r} has guard "
            f"{objective.guard}; {options.new_study_hint}")
    else:
        _check_same_definitions(durable, space, objective, study_name, storage_desc,
                                options.new_study_hint)
    if options.sampler == "grid" and space.num_points() > GRID_MAX_POINTS:
        raise ConfigError(
            f"`sampler` 'grid' enumerates every point of space {space.name!r}, which has "
            f"{space.num_points():,} (at most {GRID_MAX_POINTS:,}); narrow its parameter "
            f"ranges or use one of {[n for n in SAMPLERS.names() if n != 'grid']}")

    # A resumed study reseeds its sampler: the same seed would replay the proposals the first
    # run already made (a seeded sampler's first points are random draws), so a resumed search
    # would spend its trials on configurations it has. The seed stays a function of the
    # options and the trials already stored, so a resume is as reproducible as a fresh run.
    seed = resumed_seed(options.seed, len(previous))
    sampler = SAMPLERS.get(options.sampler)(seed, options.population_size)
    mem = optuna.create_study(directions=objective.directions,  # type: ignore[arg-type]
                              sampler=sampler)
    mem.add_trials(previous)
    loop = _Loop(space, objective, options, mem, durable, ctx, on_record,
                 first_number=len(previous), write_batch=getattr(storage, "batch", None))
    for t in previous:
        cfg, rec = split_attrs(t.user_attrs)
        loop.memo.setdefault(config_key(cfg), rec)
        loop.note_values(rec)

    target = options.trials
    grid_queue: list[tuple[dict[str, Any], dict[str, Any]]] = []
    if options.sampler == "grid":
        grid_queue = _grouped([(p, cfg) for p, cfg in space.enumerate_valid(ctx)
                               if config_key(cfg) not in loop.memo], loop.affinity)
        target = min(target, len(previous) + len(grid_queue))
        if not previous and not grid_queue:
            first = next(space.grid())
            cfg, why = space.config(first)
            raise ConfigError(
                f"space {space.name!r} has no valid point: each of its "
                f"{space.num_points():,} grid points breaks a rule (e.g. {first}: "
                f"{why or space.check(cfg, ctx)}); widen its parameters or relax its "
                f"`constraints`")

    executor = make_executor(options.workers, address=options.ray_address,
                             evaluator=evaluator, evaluator_name=space.evaluator)
    t0 = time.perf_counter()
    progress: _Progress | None = None
    interrupted = False
    try:
        if target > len(previous) and executor.warms_up:
            warm = _warm_configs(space, ctx, [cfg for _, cfg in grid_queue[:_WARM_SCAN]])
            if warm:
                executor.warm_up(space.evaluator, warm)
        t0 = time.perf_counter()
        progress = _Progress(enabled=options.progress, total=target, done=len(previous),
                             objective=objective)
        loop.run(executor, target, len(previous), grid_queue, progress)
    except KeyboardInterrupt:
        interrupted = True  # the trials told so far are stored below; their outputs written
    except ConfigError:
        # The objective was rejected on the first record it scored, in a new study: store
        # nothing, so the corrected command starts afresh (not "run with another objective").
        loop.discard = not previous and loop.num_scored == 0
        raise
    finally:
        try:
            loop.close()
        finally:
            if progress is not None:
                progress.close()
            executor.close()
            if loop.discard and all(  # only this run's trials (a shared study is kept)
                    str(t.user_attrs.get(f"{RECORD_PREFIX}uid")).startswith(f"{loop.run_id}-")
                    for t in durable.get_trials(deepcopy=False)):
                optuna.delete_study(study_name=study_name, storage=storage)
    wall = time.perf_counter() - t0

    trials = durable.get_trials(deepcopy=False, states=complete)
    if options.out_dir is not None:
        rows, front = write_outputs(trials, objective, space, Path(options.out_dir),
                                    html=options.html)
    else:
        rows = trial_rows(trials, objective, space)
        front = pareto_rows(rows, objective, config_columns(trials))
    if interrupted:
        written = f"; outputs for them written to {options.out_dir}" if options.out_dir else ""
        raise SearchInterrupted(
            f"interrupted: {len(rows)}/{options.trials} trials stored in {storage_desc}"
            f"{written}; run the same command to resume", num_stored=len(rows),
            trials=options.trials, storage=storage_desc)
    feasible = sum(1 for r in rows if r.get("feasible"))
    new = loop.num_new
    return SearchResult(
        study_name=study_name, storage=storage_desc, num_trials=len(rows),
        num_feasible=feasible, num_infeasible=len(rows) - feasible,
        num_invalid=sum(1 for r in rows if r.get("valid") is False),
        num_errors=sum(1 for r in rows if r.get("error")), num_new_trials=new,
        num_evaluations=loop.num_evaluations, num_memo_hits=loop.num_memo_hits,
        wall_s=wall, trials_per_s=new / wall if wall > 0 else 0.0,
        workers=executor.num_workers,
        # Machines that evaluated this invocation's trials (an earlier run's embedded Ray had
        # another node id, and its trials are not this run's throughput).
        nodes_used=len({r.get("node_id") for r in rows if r.get("node_id") and
                        str(r.get("uid", "")).startswith(f"{loop.run_id}-") and
                        not r.get("memo_hit") and r.get("valid") is not False}),
        num_worker_restarts=executor.num_restarts, num_resubmits=executor.num_resubmits,
        rows=rows, pareto=front, config_keys=config_columns(trials), out_dir=options.out_dir,
    )


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped ``run_search``; the trials told before it are stored and, with an
    ``out_dir``, their outputs written. ``str()`` says how many and how to resume."""

    def __init__(self, message: str, *, num_stored: int, trials: int, storage: str) -> None:
        super().__init__(message)
        self.num_stored, self.trials, self.storage = num_stored, trials, storage


#: Most points the grid sampler enumerates (``SearchSpace.num_points``).
GRID_MAX_POINTS = 10_000_000


def resumed_seed(seed: int | None, num_previous: int) -> int | None:
    """The sampler seed of a study that already holds ``num_previous`` finished trials:
    ``seed`` itself for a fresh study, else a seed derived from both (None stays random)."""
    if seed is None or num_previous == 0:
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, num_previous]).generate_state(1)[0])


def study_definitions(space: SearchSpace, objective: Objective) -> dict[str, Any]:
    """What a study's trials depend on, as stored with the study (JSON): the space's
    evaluator, parameters, fixed and derived values, normalizers and validity rules; the
    objective's terms and constraints. Names, descriptions and file paths are left out."""
    import dataclasses

    return {
        "space": {"evaluator": space.evaluator,
                  "params": [dataclasses.asdict(p) for p in space.params],
                  "fixed": dict(space.fixed), "derived": dict(space.derived),
                  "normalize": list(space.normalize), "constraints": list(space.constraints)},
        "objective": {"terms": [[t.metric, t.direction] for t in objective.terms],
                      "constraints": [[b.metric, b.op, b.bound] for b in objective.constraints]},
    }


def _store_definitions(durable: Any, space: SearchSpace, objective: Objective) -> None:
    """Record on a study without trials what its trials will depend on (replacing what an
    earlier run that stored no trial left): metric names, names, guard, definitions."""
    import json

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # set_metric_names is "experimental" in optuna 5
        durable.set_metric_names(list(objective.metrics))
    durable.set_user_attr("space", space.name)
    durable.set_user_attr("objective", objective.name)
    durable.set_user_attr("guard", objective.guard)
    want = json.loads(json.dumps(study_definitions(space, objective), default=str))
    for kind in ("space", "objective"):
        durable.set_user_attr(f"{kind}_definition", want[kind])


def _check_same_definitions(durable: Any, space: SearchSpace, objective: Objective,
                            study_name: str, storage_desc: str, hint: str) -> None:
    """Raise ``ConfigError`` when ``durable`` was run with another space or objective (other
    parameters or ranges, fixed values, constraints, metrics): its trials would be mixed with
    the new ones in one front. A study from before the definitions were stored gets them now."""
    import json

    want = json.loads(json.dumps(study_definitions(space, objective), default=str))
    for kind, name, path in (("space", space.name, space.path),
                             ("objective", objective.name, objective.path)):
        key = f"{kind}_definition"
        have = durable.user_attrs.get(key)
        if have is None:
            durable.set_user_attr(key, want[kind])
            continue
        if have != want[kind]:
            fields = sorted(k for k in set(have) | set(want[kind])
                            if have.get(k) != want[kind].get(k))
            where = f" ({path})" if path else ""
            raise ConfigError(
                f"study {study_name!r} in {storage_desc} was run with a different {kind}: "
                f"its {' and '.join(fields)} differ from {kind} {name!r}{where}, and its "
                f"trials would be mixed with the new ones; {hint}")


#: How long ``check_ray_address`` waits for a TCP connection to the cluster's address.
RAY_CONNECT_TIMEOUT_S = 5.0


def check_search_numbers(*, trials: Any = 1, seed: Any = 0, population_size: Any = None,
                         workers: Any = None, flags: bool = False) -> None:
    """``trials >= 1`` (or None: not given), ``0 <= seed <= 2**32 - 1`` (or None: random),
    ``population_size >= 2`` (or None: the sampler's default) and ``workers >= 0`` (or None:
    not given), all integers.

    Args:
        flags: name the values as the command-line flags (``--population-size``) instead of
            the ``SearchOptions`` fields (``population_size``).

    Raises:
        ConfigError: naming the value and its allowed range.
    """
    def name(field_name: str) -> str:
        return f"--{field_name.replace('_', '-')}" if flags else field_name

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if trials is not None and (not is_int(trials) or trials < 1):
        raise ConfigError(f"`{name('trials')}` must be an integer >= 1 (the trials the study "
                          f"should hold), but got {trials!r}")
    if seed is not None and (not is_int(seed) or not 0 <= seed <= MAX_SEED):
        raise ConfigError(f"`{name('seed')}` must be an integer in [0, 2**32 - 1], but got "
                          f"{seed!r}")
    if population_size is not None and (not is_int(population_size) or population_size < 2):
        raise ConfigError(f"`{name('population_size')}` must be an integer >= 2 (NSGA-II "
                          f"population; leave it out for 50), but got {population_size!r}")
    if workers is not None and (not is_int(workers) or workers < 0):
        raise ConfigError(f"`{name('workers')}` must be >= 0 (0 = evaluate in this process), "
                          f"but got {workers}")


def check_ray_address(address: str | None) -> None:
    """Fail fast when ``address`` (``host:port`` of a cluster's GCS, or ``ray://host:port``)
    does not accept a TCP connection within ``RAY_CONNECT_TIMEOUT_S``: ``ray.init`` would
    retry it for ever. Nothing for no address, ``auto``/``local`` (Ray resolves them), an
    address without a port, or when Ray is already initialised in this process.

    Raises:
        ConfigError: naming the address and why it cannot be reached.
    """
    import socket
    import sys

    if not address or address in ("auto", "local"):
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return
    hostport = address.removeprefix("ray://").rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    host = host.strip("[]")  # [::1]:6379
    try:
        with socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ConfigError(
            f"Ray address {address!r} (`--ray-address` or RAY_ADDRESS) cannot be reached: "
            f"connecting to {host}:{port} failed ({reason}); start the cluster there "
            "(`ray start --head`), fix the address, or leave it out for a local Ray") from None


class _Loop:
    """Driver state of one search invocation."""

    def __init__(self, space: SearchSpace, objective: Objective, options: SearchOptions,
                 mem: Any, durable: Any, ctx: RuleContext,
                 on_record: Callable[[dict[str, Any]], None] | None, *, first_number: int = 0,
                 write_batch: Callable[[], Any] | None = None) -> None:
        from charon_search.search.evaluators import EVALUATORS

        self.space, self.objective, self.options = space, objective, options
        self.mem, self.durable, self.ctx, self.on_record = mem, durable, ctx, on_record
        self.memo: dict[tuple, dict[str, Any]] = {}
        self.worst: list[float | None] = [None] * len(objective.terms)
        self.best: list[float | None] = [None] * len(objective.terms)
        self.unflushed: list[Any] = []
        self.last_flush = time.perf_counter()
        self.writer: ThreadPoolExecutor | None = None
        self.writes: list[Future[None]] = []
        self.run_id = uuid.uuid4().hex[:8]
        self.num_new = self.num_evaluations = self.num_memo_hits = 0
        self.num_scored = 0
        """Trials whose evaluated record the objective scored (values and constraints)."""
        self.discard = False
        """Close without storing: the first scored record rejected the objective."""
        self.constraint_names = ["valid", "evaluable", *(b.text for b in objective.constraints)]
        self.next_number = first_number
        """Trial number of the next grid trial (grid trials bypass the in-memory study)."""
        self.write_batch = write_batch
        evaluator = EVALUATORS.get(space.evaluator)
        self.affinity: Callable[[Mapping[str, Any]], Any] = evaluator.affinity_key
        self.optional_metrics = frozenset(evaluator.optional_metrics)
        self.seen_keys: set[str] = set()
        """Record keys seen in this run (a constraint's metric must be one of them)."""
        self.distributions = {p.optuna_name: p.distribution() for p in space.params}

    def check_metric_names(self, missing: Sequence[str], rec: Mapping[str, Any]) -> None:
        """Raise ``ConfigError`` when a feasible record lacks an objective metric its evaluator
        always reports (the objective names a metric that does not exist)."""
        unknown = [m for m in missing if m not in self.optional_metrics]
        if not unknown:
            return
        import difflib

        names = _numeric_fields(rec)
        close = [c for m in unknown for c in difflib.get_close_matches(m, names, n=3)]
        raise ConfigError(
            f"objective {self.objective.name!r}: metric(s) {unknown} are not reported by the "
            f"{self.space.evaluator!r} evaluator"
            + (f" (closest: {', '.join(dict.fromkeys(close))})" if close else "")
            + f"; its records have {len(names)} numeric fields, e.g. {', '.join(names[:12])}")

    def check_constraint_metrics(self, rec: Mapping[str, Any]) -> None:
        """Raise ``ConfigError`` when an evaluated (not pruned) record lacks a record key that
        an objective constraint reads (its metric, or the key of a bound such as ``device``)
        and no earlier record of this run had it: the constraint names a metric that does
        not exist, and would otherwise count as satisfied by every trial. Pruned records
        legitimately lack metrics and are not checked."""
        for i, b in enumerate(self.objective.constraints):
            keys = [b.metric] + ([b.bound] if isinstance(b.bound, str) else [])
            for key in keys:
                if key in rec or key in self.seen_keys or key in self.optional_metrics:
                    continue
                import difflib

                names = _numeric_fields(rec)
                close = difflib.get_close_matches(key, names, n=3)
                what = (f"names metric {key!r}" if key == b.metric else
                        f"compares with record key {key!r}")
                raise ConfigError(
                    f"{self.objective.path or self.objective.name}: field `constraints[{i}]` "
                    f"({b.text!r}) {what}, which the {self.space.evaluator!r} evaluator does "
                    f"not report"
                    + (f" (did you mean {close}?)" if close else "")
                    + f"; its records have {len(names)} numeric fields, e.g. "
                    f"{', '.join(names[:12])}")

    def note_values(self, rec: Mapping[str, Any]) -> None:
        vals = self.objective.values(rec)
        if vals is None:
            return
        for i, loss in enumerate(self.objective.minimized(vals)):
            w = self.worst[i]
            self.worst[i] = loss if w is None else max(w, loss)

    def best_losses(self) -> list[float | None]:
        return self.best

    def penalty_values(self) -> list[float]:
        """Values told for a trial without metrics: the worst seen so far (constraints decide)."""
        out = []
        for w, t in zip(self.worst, self.objective.terms):
            loss = w if w is not None else 1e6
            out.append(loss if t.direction == "minimize" else -loss)
        return out

    def run(self, executor: Any, target: int, done: int,
            grid_queue: list[tuple[dict[str, Any], dict[str, Any]]], progress: _Progress) -> None:
        """Ask (or take grid points), submit, tell, until ``target`` trials are finished.

        ``grid_queue`` holds valid, not yet evaluated ``(point, config)`` pairs: they are
        submitted directly (no sampler ask); otherwise the sampler is asked.
        """
        in_flight: dict[tuple, list[tuple[Any, dict[str, Any], dict[str, Any] | None]]] = {}
        asked = done
        budget = self.options.max_evaluations
        grid_queue = grid_queue[::-1]  # pop() from the end in the original order

        def can_submit() -> bool:
            return budget is None or self.num_evaluations + executor.pending() < budget

        while done < target:
            while asked < target and executor.pending() < executor.capacity and can_submit():
                asked += 1
                trial: Any = None
                point: dict[str, Any] | None = None
                if grid_queue:
                    point, cfg = grid_queue.pop()
                else:
                    trial = self.mem.ask()
                    cfg, reason = self.space.config(self.space.suggest(trial))
                    reason = reason or self.space.check(cfg, self.ctx)
                    if reason:
                        self.finish(trial, cfg, {"feasible": False, "valid": False,
                                                 "prune_reason": f"invalid: {reason}"})
                        done += 1
                        progress.advance(self, feasible=False)
                        # Trials finished without an evaluation reach the durable storage
                        # in batches too: a space whose points are all known can finish
                        # thousands of them before the next evaluation returns.
                        self.flush()
                        continue
                key = config_key(cfg)
                if key in self.memo:
                    self.num_memo_hits += 1
                    ok = self.finish(trial, cfg, {**self.memo[key], "memo_hit": True}, point)
                    done += 1
                    progress.advance(self, feasible=ok)
                    self.flush()
                    continue
                if key in in_flight:
                    in_flight[key].append((trial, cfg, point))
                    continue
                in_flight[key] = [(trial, cfg, point)]
                executor.submit(key, self.space.evaluator, cfg, self.affinity(cfg))
            if executor.pending() == 0:
                if not can_submit():
                    break  # simulation budget spent
                if asked >= target and done < target:  # pragma: no cover - invariant
                    raise RuntimeError(f"search loop stalled at {done}/{target} trials")
                continue
            for key, rec in executor.wait():
                self.num_evaluations += 1
                rec = {**rec, "valid": True, "memo_hit": False}
                self.memo[key] = rec
                if self.on_record is not None:
                    self.on_record(rec)
                for i, (trial, cfg, point) in enumerate(in_flight.pop(key)):
                    if i:
                        self.num_memo_hits += 1
                    ok = self.finish(trial, cfg, rec if i == 0 else {**rec, "memo_hit": True},
                                     point)
                    done += 1
                    progress.advance(self, feasible=ok)
            self.flush()

    def finish(self, trial: Any, cfg: Mapping[str, Any], rec: dict[str, Any],
               point: Mapping[str, Any] | None = None) -> bool:
        """Tell the in-memory study (``trial`` from ``ask``) or, for a grid ``point``
        (``trial`` None), number it here; queue the finished trial for the durable storage.
        Returns whether the trial is feasible (evaluated and within every constraint)."""
        import optuna

        rec = dict(rec)
        valid = rec.get("valid", True) is not False
        evaluable = scored = bool(rec.get("feasible", False))
        rec["valid"] = valid
        cons = [0.0 if valid else _INVALID_VIOLATION,
                0.0 if evaluable or not valid else _UNEVALUABLE_VIOLATION]
        violated = []
        self.seen_keys.update(rec)
        if evaluable:
            self.check_constraint_metrics(rec)
            self.objective.annotate(rec)
        for b, v in self.objective.violations(rec):
            cons.append(v)
            if v > 0:
                guarded = rec.get(f"guarded.{b.metric}")
                violated.append(f"{b.text} (got {rec.get(b.metric)!r}" + (
                    "" if guarded is None else
                    f", {guarded:.4g} at the validated error's {self.objective.guard:g} "
                    "quantile") + ")")
        values = self.objective.values(rec) if evaluable else None
        if values is None and evaluable:
            evaluable = False
            cons[1] = _UNEVALUABLE_VIOLATION
            missing = [m for m in self.objective.metrics if rec.get(m) is None]
            self.check_metric_names([m for m in missing if m not in rec], rec)
            nonfinite = [f"{m}={rec[m]}" for m in self.objective.metrics
                         if rec.get(m) is not None and not math.isfinite(rec[m])]
            rec["prune_reason"] = "; ".join(
                ([f"missing objective metric(s) {missing}"] if missing else [])
                + ([f"non-finite objective value {', '.join(nonfinite)}"] if nonfinite else []))
        self.num_scored += scored  # past the checks that reject the objective
        if evaluable and values is not None:
            self.note_values(rec)
        rec["feasible"] = evaluable and not violated
        if rec["feasible"] and values is not None:
            for i, loss in enumerate(self.objective.minimized(values)):
                cur = self.best[i]
                self.best[i] = loss if cur is None else min(cur, loss)
        if evaluable and violated:
            rec["prune_reason"] = "constraint: " + "; ".join(violated)
        rec["constraint_violation"] = float(sum(max(c, 0.0) for c in cons))
        if trial is not None:
            number = trial.number
        else:
            number, self.next_number = self.next_number, self.next_number + 1
        rec["uid"] = f"{self.run_id}-{number}"
        rec.setdefault("memo_hit", False)
        attrs = {CONFIG_PREFIX + k: encode_attr(v) for k, v in cfg.items()}
        attrs.update({RECORD_PREFIX + k: encode_attr(v) for k, v in rec.items()})
        told = list(values) if values is not None else self.penalty_values()
        if trial is not None:
            # The sampler needs params, values and constraints only; the config and record go
            # straight into the durable copy (one storage call per attribute costs ~1 ms/trial).
            for name, v in zip(self.constraint_names, cons):
                trial.set_constraint(name, v)
            frozen = self.mem.tell(trial, told)
            done = optuna.trial.create_trial(
                values=frozen.values, params=frozen.params,
                distributions=frozen.distributions, user_attrs=attrs,
                system_attrs=dict(frozen.system_attrs))
            done.datetime_start = frozen.datetime_start
        else:
            assert point is not None
            done = optuna.trial.create_trial(
                values=told, params=self.space.optuna_params(point),
                distributions=self.distributions, user_attrs=attrs,
                constraints=dict(zip(self.constraint_names, cons)))
        self.unflushed.append(done)
        self.num_new += 1
        return bool(rec["feasible"])

    def flush(self, *, force: bool = False) -> None:
        """Copy finished trials to the durable storage in one batch, on the writer thread.

        Batches are written in order by one background thread, so the driver keeps feeding the
        workers while a database commits (SQLite ~20 ms per trial) or a journal fsyncs. A
        failed write raises here, at the next flush. ``force`` writes what is left and waits
        until every batch is stored.
        """
        now = time.perf_counter()
        due = force or len(self.unflushed) >= self.options.flush_every or \
            now - self.last_flush >= self.options.flush_interval_s
        if self.unflushed and due:
            batch, self.unflushed = self.unflushed, []
            if self.writer is None:
                self.writer = ThreadPoolExecutor(max_workers=1,
                                                 thread_name_prefix="charon-durable")
            self.writes.append(self.writer.submit(self._write, batch))
            self.last_flush = now
        pending = []
        for fut in self.writes:
            if force or fut.done():
                fut.result()  # re-raises a failed write
            else:
                pending.append(fut)
        self.writes = pending

    def _write(self, batch: list[Any]) -> None:
        with self.write_batch() if self.write_batch is not None else contextlib.nullcontext():
            self.durable.add_trials(batch)

    def close(self) -> None:
        """Write what is left (unless ``discard``), wait for the writer thread and stop it."""
        try:
            if self.discard:
                self.unflushed.clear()
            self.flush(force=True)
        finally:
            if self.writer is not None:
                self.writer.shutdown(wait=True)
                self.writer = None


#: Grid configs scanned for warm-up samples (first valid ones, distinct model/cluster/precision).
_WARM_SCAN = 2000
_WARM_KEYS = ("model", "cluster", "precision", "mode")
_WARM_MAX = 2


def _warm_configs(space: SearchSpace, ctx: RuleContext,
                  candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A few valid configs covering distinct (model, cluster, precision, mode) values, from
    ``candidates`` (grid order) or, if empty, the space's ``example`` and the first grid
    points (at most ``_WARM_SCAN`` scanned): workers load what these need before trial 1."""
    if not candidates:
        pts = ([dict(space.example)] if space.example else []) + \
            list(itertools.islice(space.grid(), _WARM_SCAN))
        for point in pts:
            cfg, reason = space.config(point)
            if not reason and not space.check(cfg, ctx):
                candidates.append(cfg)
                if len(candidates) >= 4 * _WARM_MAX:
                    break
    out: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for cfg in candidates:
        sig = tuple(repr(cfg.get(k)) for k in _WARM_KEYS)
        if sig not in seen:
            seen.add(sig)
            out.append(cfg)
            if len(out) >= _WARM_MAX:
                break
    return out


def _grouped(items: list[tuple[dict[str, Any], dict[str, Any]]],
             affinity: Callable[[Mapping[str, Any]], Any]) -> list[tuple[dict, dict]]:
    """Grid items reordered so configs with the same affinity key are adjacent (first
    appearance order kept): they then share a batch and a worker's caches."""
    groups: dict[Any, list[tuple[dict, dict]]] = {}
    for i, item in enumerate(items):
        k = affinity(item[1])
        groups.setdefault(i if k is None else k, []).append(item)
    return [item for g in groups.values() for item in g]


def _numeric_fields(rec: Mapping[str, Any]) -> list[str]:
    """A record's numeric keys, top-level names first (for error messages)."""
    return sorted((k for k, v in rec.items() if isinstance(v, (int, float))
                   and not isinstance(v, bool)), key=lambda k: ("." in k, k))


#: Least time between two progress-bar redraws.
_REDRAW_S = 0.1


class _Progress:
    """Rich progress bar: trials, trials/s, feasible and pruned counts, best value so far."""

    def __init__(self, *, enabled: bool, total: int, done: int, objective: Objective) -> None:
        self.enabled, self.objective = enabled, objective
        self.feasible = self.pruned = 0
        self.t0 = time.perf_counter()
        self.start_done = done
        self.done = done
        self._bar: Any = None
        self._total = total
        self._last_draw = -math.inf
        self._loop: _Loop | None = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(TextColumn("[bold]search"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), transient=False)
            self._task = self._bar.add_task("search", total=total, completed=done, stats="")
            self._bar.start()

    def advance(self, loop: _Loop, *, feasible: bool) -> None:
        self.done += 1
        if feasible:
            self.feasible += 1
        else:
            self.pruned += 1
        if self._bar is None:
            return
        self._loop = loop
        now = time.perf_counter()
        if now - self._last_draw < _REDRAW_S and self.done < self._total:
            return  # formatting the stats line per trial costs the driver (it shares the cores)
        self._draw(loop, now)

    def _draw(self, loop: _Loop, now: float) -> None:
        self._last_draw = now
        dt = now - self.t0
        rate = (self.done - self.start_done) / dt if dt > 0 else 0.0
        best = []
        for w, t in zip(loop.best_losses(), self.objective.terms):
            if w is not None:
                best.append(f"{t.metric}={w if t.direction == 'minimize' else -w:.4g}")
        self._bar.update(self._task, completed=self.done,
                         stats=f"{rate:.1f} trials/s  feasible {self.feasible}  pruned "
                               f"{self.pruned}  best {' '.join(best) or '-'}")

    def close(self) -> None:
        if self._bar is not None:
            if self._loop is not None:
                self._draw(self._loop, time.perf_counter())
            self._bar.stop()
