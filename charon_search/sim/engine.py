"""Event-driven stream engine with overlap slowdown and link-bandwidth sharing.

Tasks run on in-order streams (like CUDA streams): a task starts when its stream has finished
the task before it and all its dependencies are done. Running tasks progress as a fluid:

* a compute task runs at ``1 / overlap_compute_slowdown`` of its speed while any collective is
  running, at full speed otherwise (the slowdown applies to the overlapped interval only);
* a collective runs at ``1 / (k · overlap_comm_slowdown)`` when ``k`` collectives share its link
  tier and compute overlaps it (``1 / k`` without compute).

Completions are events in a heap ordered by ``(time_s, priority, seq)`` with a per-engine
counter, invalidated by version when rates change, so the same inputs give the same timeline.
The run also accounts each interval: compute work, slowdown (time beyond the standalone work),
exposed communication per group (no compute running), and idle time.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from charon_search.errors import CharonError

__all__ = ["EngineResult", "StreamEngine", "Task"]

_EPS = 1e-15


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One unit of work on one stream."""

    name: str
    stream: str
    duration_s: float
    """Standalone duration (no overlap, no sharing)."""
    deps: tuple[int, ...] = ()
    """Indices of tasks that must finish first."""
    is_comm: bool = False
    group: str = ""
    """Parallel axis of a collective (``tp``, ``cp``, ``ep``, ``dp``, ``pp``)."""
    tier: str = ""
    """Link tier the collective is bottlenecked on; collectives on one tier share it."""
    label: str = ""
    """Module path or other detail for traces."""


@dataclass(kw_only=True)
class EngineResult:
    start_s: list[float]
    end_s: list[float]
    makespan_s: float
    compute_s: float = 0.0
    """Standalone compute work done."""
    slowdown_s: float = 0.0
    """Extra compute time caused by overlapping collectives."""
    exposed_comm_s: dict[str, float] = field(default_factory=dict)
    """Time with a collective but no compute running, split over the running groups."""
    idle_s: float = 0.0


class StreamEngine:
    """Runs a list of ``Task``s; see the module docstring for the model."""

    def __init__(self, *, compute_slowdown: float = 1.0, comm_slowdown: float = 1.0) -> None:
        if compute_slowdown < 1 or comm_slowdown < 1:
            raise ValueError("overlap slowdowns must be >= 1")
        self.compute_slowdown = compute_slowdown
        self.comm_slowdown = comm_slowdown
        self._seq = 0

    def _push(self, heap: list, time_s: float, priority: int, payload: tuple) -> None:
        self._seq += 1
        heapq.heappush(heap, (time_s, priority, self._seq, payload))

    def run(self, tasks: Sequence[Task]) -> EngineResult:
        n = len(tasks)
        start = [float("nan")] * n
        end = [float("nan")] * n
        remaining = [t.duration_s for t in tasks]
        done = [False] * n
        queues: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            queues.setdefault(t.stream, []).append(i)
        streams = list(queues)
        head = dict.fromkeys(streams, 0)
        busy: dict[str, int] = {}
        rate = [0.0] * n
        version = [0] * n
        heap: list = []
        res = EngineResult(start_s=start, end_s=end, makespan_s=0.0)
        exposed = res.exposed_comm_s
        now = 0.0
        finished = 0
        while finished < n:
            # 1. start every stream head whose dependencies are done
            started: list[int] = []
            for st in streams:
                if st in busy or head[st] >= len(queues[st]):
                    continue
                i = queues[st][head[st]]
                if all(done[d] for d in tasks[i].deps):
                    busy[st] = i
                    start[i] = now
                    started.append(i)
            running = list(busy.values())
            if not running:
                waiting = [tasks[queues[s][head[s]]].name for s in streams
                           if head[s] < len(queues[s])]
                raise CharonError(f"engine deadlock at t={now}: waiting {waiting[:5]}")
            # 2. rates under overlap and sharing
            comm = [i for i in running if tasks[i].is_comm]
            comp = [i for i in running if not tasks[i].is_comm]
            tier_count: dict[str, int] = {}
            for i in comm:
                tier_count[tasks[i].tier] = tier_count.get(tasks[i].tier, 0) + 1
            for i in running:
                if tasks[i].is_comm:
                    r = 1.0 / (tier_count[tasks[i].tier] * (self.comm_slowdown if comp else 1.0))
                else:
                    r = 1.0 / self.compute_slowdown if comm else 1.0
                if r != rate[i] or i in started:
                    rate[i] = r
                    version[i] += 1
                    self._push(heap, now + remaining[i] / r, 0, (i, version[i]))
            # 3. next valid completion
            while True:
                t_next, _, _, (i_next, ver) = heapq.heappop(heap)
                if ver == version[i_next] and not done[i_next] and tasks[i_next].stream in busy \
                        and busy[tasks[i_next].stream] == i_next:
                    break
            dt = max(t_next - now, 0.0)
            # 4. accounting over [now, t_next)
            if dt > 0:
                if comp:
                    for i in comp:
                        res.compute_s += dt * rate[i]
                        res.slowdown_s += dt * (1.0 - rate[i])
                elif comm:
                    share = dt / len(comm)
                    for i in comm:
                        g = tasks[i].group
                        exposed[g] = exposed.get(g, 0.0) + share
                for i in running:
                    remaining[i] -= dt * rate[i]
            now = t_next
            # 5. complete every running task that has no work left
            for i in running:
                if i == i_next or remaining[i] <= _EPS * max(1.0, tasks[i].duration_s):
                    remaining[i] = 0.0
                    done[i] = True
                    end[i] = now
                    finished += 1
                    st = tasks[i].stream
                    del busy[st]
                    head[st] += 1
                    version[i] += 1
        res.makespan_s = now
        return res
