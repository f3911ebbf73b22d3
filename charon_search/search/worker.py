"""Workers that evaluate configs: in-process (tests, tiny spaces) or a pool of Ray actors.

Each Ray actor (``SearchWorker``) keeps its evaluator instances, so the traced graphs, loaded
clusters and trained predictors the simulators cache stay in that process: the first trial on a
worker pays, later ones reuse. The driver keeps ``in_flight`` calls queued per actor so no worker
waits for the driver. A worker that dies (its process killed, its node lost) is replaced by a new
actor and every trial it held is submitted again; results come back exactly once per submission
that succeeded, so the study sees every trial once.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from charon_search.errors import ConfigError, InfeasibleError

__all__ = ["LocalExecutor", "RayExecutor", "evaluate_config", "init_ray", "make_executor"]

#: A queued config: (tag, evaluator name, config, affinity key or None).
_Item = tuple[Any, str, Mapping[str, Any], Any]

#: Objects the Ray object store may hold (records are small); keeps `ray.init` light here.
_OBJECT_STORE_BYTES = 100 * 2**20


def init_ray(address: str | None, num_cpus: int) -> bool:
    """Connect to the Ray cluster at ``address``, or start an embedded local one with
    ``num_cpus`` CPUs; nothing when Ray is already initialised in this process. Returns
    whether this call started (so the caller shuts down) Ray. The embedded instance logs
    errors only: its start-up notices (token authentication, "Started a local Ray
    instance") concern a cluster nobody else can reach."""
    import logging

    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                 object_store_memory=_OBJECT_STORE_BYTES, log_to_driver=False,
                 logging_level=logging.ERROR)
    return True


def evaluate_config(evaluators: dict[str, Any], name: str, cfg: Mapping[str, Any]) -> dict:
    """Evaluate one config with evaluator ``name`` (instantiated once into ``evaluators``).

    Errors do not escape: an ``InfeasibleError`` or ``ConfigError`` from a simulator becomes an
    infeasible record with its reason; any other exception an infeasible record flagged
    ``error=True`` so one bad point cannot stop a long study (the summary counts them).
    """
    from charon_search.search.evaluators import EVALUATORS

    t0, c0 = time.perf_counter(), time.process_time()
    try:
        if name not in evaluators:
            evaluators[name] = EVALUATORS.get(name)()
        rec = dict(evaluators[name].evaluate(cfg))
        rec.setdefault("feasible", True)
        rec.setdefault("prune_reason", None)
        rec.setdefault("error", False)
    except InfeasibleError as e:
        rec = {"feasible": False, "prune_reason": f"infeasible: {e}", "error": False}
    except ConfigError as e:
        rec = {"feasible": False, "prune_reason": f"invalid: {e}", "error": False}
    except Exception as e:
        rec = {"feasible": False, "prune_reason": f"error: {type(e).__name__}: {e}",
               "error": True}
    rec["eval_wall_s"] = time.perf_counter() - t0
    rec["eval_cpu_s"] = time.process_time() - c0  # the worker process's CPU meanwhile
    rec["eval_end_unix_s"] = time.time()  # when it finished (batched records arrive together)
    return rec


class SearchWorker:
    """Ray actor body: evaluates configs and stamps the record with worker, node and pid."""

    def __init__(self, worker_id: str, niceness: int | None = None) -> None:
        self.worker_id = worker_id
        self._evaluators: dict[str, Any] = {}
        if niceness is not None:
            _set_niceness(niceness)
        try:
            import ray

            self.node_id = ray.get_runtime_context().get_node_id()
        except Exception:
            self.node_id = socket.gethostname()

    def info(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "node_id": self.node_id, "worker_pid": os.getpid()}

    def warm_up(self, name: str, cfgs: Sequence[Mapping[str, Any]]) -> float:
        """Instantiate evaluator ``name`` and let it load what ``cfgs`` need; seconds taken.

        Never raises: warming is an optimisation, a failure shows up in the trial instead.
        """
        from charon_search.search.evaluators import EVALUATORS

        t0 = time.perf_counter()
        try:
            if name not in self._evaluators:
                self._evaluators[name] = EVALUATORS.get(name)()
            self._evaluators[name].warm_up(cfgs)
        except Exception:
            pass
        return time.perf_counter() - t0

    def evaluate(self, name: str, cfg: Mapping[str, Any]) -> dict[str, Any]:
        rec = evaluate_config(self._evaluators, name, cfg)
        rec.update(self.info())
        return rec

    def evaluate_batch(self, items: list[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """``evaluate`` over a batch of ``(evaluator name, config)``: one call, one reply."""
        info = self.info()
        out = []
        for name, cfg in items:
            rec = evaluate_config(self._evaluators, name, cfg)
            rec.update(info)
            out.append(rec)
        return out


def _set_niceness(niceness: int) -> None:
    """Run this process at ``niceness`` where allowed (lowering needs root / CAP_SYS_NICE).

    Ray starts worker processes at niceness 15 (``RAY_worker_niceness``). On a machine shared
    with other CPU-bound processes a nice-15 actor gets ~1/28 of a core next to a nice-0 one
    (CFS weights 36 vs 1024), so a second search worker added on a busy 2-core machine slowed
    every evaluation ~2.6x instead of adding throughput. Search actors are the workload, so
    they run at the driver's niceness.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except (OSError, AttributeError):
        pass


class LocalExecutor:
    """Evaluates in the driver process, one config at a time (no Ray)."""

    warms_up = False
    """The first trial pays its own first use: there is nothing to overlap it with."""

    def __init__(self, evaluator: Any | None = None, evaluator_name: str | None = None) -> None:
        self._evaluators: dict[str, Any] = {}
        if evaluator is not None and evaluator_name is not None:
            self._evaluators[evaluator_name] = evaluator
        self._worker = SearchWorker.__new__(SearchWorker)
        self._worker.worker_id, self._worker.node_id = "local-0", socket.gethostname()
        self._worker._evaluators = self._evaluators
        self._queue: list[tuple[Any, str, Mapping[str, Any]]] = []
        self.capacity = 1
        self.num_workers = 0
        """No worker actors: trials are evaluated in this process."""
        self.num_restarts = 0
        self.num_resubmits = 0

    def submit(self, tag: Any, name: str, cfg: Mapping[str, Any], affinity: Any = None) -> None:
        self._queue.append((tag, name, cfg))

    def warm_up(self, name: str, cfgs: Sequence[Mapping[str, Any]]) -> None:
        """Nothing to do (see ``warms_up``)."""

    def wait(self) -> list[tuple[Any, dict[str, Any]]]:
        out = []
        while self._queue:
            tag, name, cfg = self._queue.pop(0)
            out.append((tag, self._worker.evaluate(name, cfg)))
        return out

    def pending(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        pass


class RayExecutor:
    """A pool of ``SearchWorker`` actors; replaces dead actors and re-runs their trials.

    Ray is started embedded (``address="local"``, never attaching by accident to another cluster
    on the machine) unless ``address`` (or ``RAY_ADDRESS``) names a cluster, or Ray is already
    initialised in this process (tests with ``ray.cluster_utils.Cluster``).

    ``submit`` only queues a config; ``wait`` dispatches the queue as **batches** (up to
    ``batch_size`` configs per actor call, split evenly over the free slots) keeping up to
    ``in_flight`` batches queued per actor, so one RPC round trip, one driver wake-up and one
    result transfer serve a whole batch and an actor always has its next batch waiting. A batch
    whose actor died is re-queued whole (its results never came back, so nothing is counted
    twice) and the actor replaced.

    **Affinity:** a config submitted with an affinity key goes, where possible, to the actor
    that first took that key, whose caches already hold what it shares with the earlier config
    (``Evaluator.affinity_key``). An actor with a free slot takes its own keys first, then
    unclaimed ones, then other actors' (so it never idles while work is queued). The driver may
    keep ``lookahead`` configs per actor queued beyond the in-flight batches to choose from.

    **Warm-up:** ``warm_up(name, configs)`` sends every actor (and every replacement) a warm-up
    call ahead of its first batch, so all workers trace models and load predictors at once.
    """

    warms_up = True

    def __init__(self, num_workers: int, *, address: str | None = None,
                 in_flight: int = 2, batch_size: int = 8, lookahead: int = 8) -> None:
        import ray

        if batch_size < 1 or in_flight < 1:
            raise ConfigError(f"`batch_size >= 1` and `in_flight >= 1` must hold, but got "
                              f"{batch_size} and {in_flight}")
        self._ray = ray
        self._started = init_ray(address or os.environ.get("RAY_ADDRESS") or None,
                                 num_workers)
        self._remote = ray.remote(num_cpus=1, max_restarts=0)(SearchWorker)
        self._init_state(num_workers, in_flight, batch_size, lookahead)
        for _ in range(num_workers):
            self._spawn()

    def _init_state(self, num_workers: int, in_flight: int, batch_size: int,
                    lookahead: int = 0) -> None:
        try:
            self._niceness: int | None = os.getpriority(os.PRIO_PROCESS, 0)
        except (OSError, AttributeError):
            self._niceness = None
        self.num_workers = num_workers
        self.in_flight = in_flight
        self.batch_size = batch_size
        self.capacity = num_workers * (in_flight * batch_size + lookahead)
        self.num_restarts = 0
        self.num_resubmits = 0
        self._next_id = 0
        self._actors: dict[str, Any] = {}
        self._load: dict[str, int] = {}
        """Batches outstanding per live actor."""
        self._futures: dict[Any, tuple[list[_Item], str]] = {}
        self._queue: list[_Item] = []
        self._num_in_batches = 0
        self._owner: dict[Any, str] = {}
        """Affinity key -> the actor that took it first."""
        self._warm: tuple[str, list[Mapping[str, Any]]] | None = None
        self._warm_refs: list[Any] = []

    def _spawn(self) -> str:
        wid = f"worker-{self._next_id}"
        self._next_id += 1
        self._actors[wid] = self._remote.options(scheduling_strategy="SPREAD").remote(
            wid, self._niceness)
        self._load[wid] = 0
        if self._warm is not None:
            self._warm_refs.append(self._actors[wid].warm_up.remote(*self._warm))
        return wid

    def submit(self, tag: Any, name: str, cfg: Mapping[str, Any], affinity: Any = None) -> None:
        """Queue a config (``affinity``: its ``Evaluator.affinity_key``); ``wait`` sends it."""
        self._queue.append((tag, name, cfg, affinity))

    def warm_up(self, name: str, cfgs: Sequence[Mapping[str, Any]]) -> None:
        """Have every actor, now and after a replacement, warm evaluator ``name`` on ``cfgs``
        before its first batch (actor calls run in order; nothing waits for them here)."""
        self._warm = (name, [dict(c) for c in cfgs])
        for actor in self._actors.values():
            self._warm_refs.append(actor.warm_up.remote(*self._warm))

    def pending(self) -> int:
        """Configs submitted whose result has not been returned by ``wait`` yet."""
        return len(self._queue) + self._num_in_batches

    def _dispatch(self) -> None:
        """Send queued configs to actors with free slots, in evenly split batches."""
        while self._queue:
            free = [w for w in self._load if self._load[w] < self.in_flight]
            if not free:
                return
            slots = sum(self.in_flight - self._load[w] for w in free)
            size = min(self.batch_size, -(-len(self._queue) // slots))
            wid = min(free, key=lambda w: (self._load[w], w))
            batch = self._take(wid, size)
            fut = self._actors[wid].evaluate_batch.remote(
                [(name, dict(cfg)) for _, name, cfg, _ in batch])
            self._load[wid] += 1
            self._num_in_batches += len(batch)
            self._futures[fut] = (batch, wid)

    def _take(self, wid: str, size: int) -> list[_Item]:
        """Remove and return up to ``size`` queued items for ``wid``: its own affinity keys
        first, then unclaimed keys (now claimed by ``wid``), then other actors' keys."""
        own: list[int] = []
        unclaimed: list[int] = []
        other: list[int] = []
        for i, item in enumerate(self._queue):
            owner = self._owner.get(item[3]) if item[3] is not None else None
            if owner == wid:
                own.append(i)
                if len(own) >= size:
                    break
            elif owner is None or owner not in self._load:
                unclaimed.append(i)
            else:
                other.append(i)
        picked = sorted((own + unclaimed + other)[:size])
        batch = [self._queue[i] for i in picked]
        for item in batch:
            if item[3] is not None and self._owner.get(item[3]) not in self._load:
                self._owner[item[3]] = wid
        keep = set(range(len(self._queue))) - set(picked)
        self._queue = [self._queue[i] for i in sorted(keep)]
        return batch

    def wait(self) -> list[tuple[Any, dict[str, Any]]]:
        """Dispatch the queue; block until at least one batch is back; return every ready one."""
        ray = self._ray
        self._dispatch()
        if not self._futures:
            return []
        futs = list(self._futures)
        ray.wait(futs, num_returns=1)  # block until one batch is back ...
        ready, _ = ray.wait(futs, num_returns=len(futs), timeout=0)  # ... then take all ready
        out: list[tuple[Any, dict[str, Any]]] = []
        dead: set[str] = set()
        requeue: list[_Item] = []
        for fut in ready:
            batch, wid = self._futures.pop(fut)
            self._num_in_batches -= len(batch)
            if wid in self._load:  # not for futures of an actor already replaced
                self._load[wid] -= 1
            try:
                recs = ray.get(fut)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                dead.add(wid)
                requeue.extend(batch)
                continue
            out.extend((item[0], rec) for item, rec in zip(batch, recs, strict=True))
        for wid in dead:
            self._replace(wid)
        if requeue:
            self.num_resubmits += len(requeue)
            self._queue[:0] = requeue  # re-run first
        self._dispatch()  # refill the freed slots before the driver tells/asks
        return out

    def _replace(self, wid: str) -> None:
        if wid not in self._actors:
            return
        try:
            self._ray.kill(self._actors.pop(wid), no_restart=True)
        except Exception:
            pass
        self._load.pop(wid, None)
        self.num_restarts += 1
        self._spawn()

    def close(self) -> None:
        for actor in self._actors.values():
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:
                pass
        self._actors.clear()
        self._warm_refs.clear()
        if self._started:
            self._ray.shutdown()


def make_executor(workers: int, *, address: str | None = None, evaluator: Any | None = None,
                  evaluator_name: str | None = None) -> LocalExecutor | RayExecutor:
    """``workers == 0`` (or a pre-built ``evaluator``) -> in-process; else a Ray actor pool."""
    if workers < 0:
        raise ConfigError(f"`workers >= 0` must hold, but got {workers}")
    if workers == 0 or evaluator is not None:
        return LocalExecutor(evaluator, evaluator_name)
    return RayExecutor(workers, address=address)
