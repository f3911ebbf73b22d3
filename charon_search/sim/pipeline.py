"""Level 2: the pipeline schedule over (rank, micro-batch, chunk, F/B/W) units.

Each pipeline rank executes its op order (``sim.schedules``) on its compute stream; an op starts
when the rank is free and its dependencies are done: the same micro-batch's forward on the
previous virtual stage (plus the P2P activation transfer), its backward on the next virtual
stage (plus the gradient transfer), or its own forward on the last stage. A DualPipe forward
paired with the backward after it (``PipeOp.paired``) runs as deepseek-ai/DualPipe's
``_forward_backward_chunk`` does: it waits for both inputs, and its activation is sent with the
backward's gradient once both have run. Units are scheduled in global start-time order (ties by
rank), which is deterministic.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from charon_search.errors import CharonError, ConfigError
from charon_search.sim.layer import UnitCost
from charon_search.sim.schedules import PipeOp, schedule_order

__all__ = ["PipeUnit", "PipelineResult", "run_pipeline"]

Key = tuple[str, int, int, int]  # kind, mb, rank, chunk


@dataclass(frozen=True, slots=True)
class PipeUnit:
    rank: int
    op: PipeOp
    start_s: float
    end_s: float
    cost: UnitCost

    @property
    def send_wait_s(self) -> float:
        """The unit's last part, waiting for its own send (``p2p_blocking``)."""
        return sum(v for g, v in self.cost.exposed_comm_s if g == "pp")


@dataclass(kw_only=True)
class PipelineResult:
    units: list[PipeUnit]
    rank_end_s: list[float]
    """When each rank's compute stream finishes its last unit."""
    last_backward: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    """(rank, chunk) -> (start, end) of the chunk's last gradient-producing unit (B or W); the
    end is its compute's, before a blocking send (``p2p_blocking``)."""
    max_in_flight: list[int] = field(default_factory=list)
    """Per rank: most micro-batches whose forward ran but whose backward has not (memory)."""


class _Topo:
    """Virtual-stage geometry: which rank/chunk a micro-batch visits next."""

    def __init__(self, p: int, v: int, m: int, dual: bool) -> None:
        self.p, self.v, self.m, self.dual = p, v, m, dual

    def position(self, r: int, c: int) -> int:
        if self.dual:
            return r if c == 0 else self.p - 1 - r
        return c * self.p + r

    def num_positions(self) -> int:
        return self.p if self.dual else self.p * self.v

    def at(self, pos: int, c_hint: int) -> tuple[int, int]:
        if self.dual:
            return (pos, 0) if c_hint == 0 else (self.p - 1 - pos, 1)
        return pos % self.p, pos // self.p

    def neighbor(self, r: int, c: int, delta: int) -> tuple[int, int] | None:
        pos = self.position(r, c) + delta
        if pos < 0 or pos >= self.num_positions():
            return None
        return self.at(pos, c)


@functools.lru_cache(maxsize=64)
def _plan(schedule: str, p: int, m: int, v: int
          ) -> tuple[tuple[tuple[PipeOp, ...], ...], dict[tuple[int, PipeOp],
                                                       tuple[tuple[Key, bool], ...]]]:
    """Each rank's op order and each op's dependencies ``(unit key, crosses ranks)``: the
    schedule's structure, the same for every run of it (the step simulator runs a schedule
    twice, ``training.step._stage_imbalance_s``; a search revisits its shapes)."""
    dual = schedule == "dualpipe"
    topo = _Topo(p, 2 if dual else v, m, dual)
    orders = tuple(tuple(schedule_order(schedule, p, m, v, r)) for r in range(p))

    def deps(r: int, op: PipeOp) -> tuple[tuple[Key, bool], ...]:
        if op.kind == "F":
            nb = topo.neighbor(r, op.chunk, -1)
            return () if nb is None else ((("F", op.mb, nb[0], nb[1]), nb[0] != r),)
        if op.kind == "B":
            nb = topo.neighbor(r, op.chunk, +1)
            if nb is None:
                return ((("F", op.mb, r, op.chunk), False),)
            return ((("B", op.mb, nb[0], nb[1]), nb[0] != r),)
        return ((("B", op.mb, r, op.chunk), False),)

    return orders, {(r, op): deps(r, op) for r, order in enumerate(orders) for op in order}


def run_pipeline(*, schedule: str, p: int, m: int, v: int,
                 cost: Callable[[int, int, str], UnitCost], p2p_s: float = 0.0,
                 split_w: bool = False, pair_overlap: bool = False,
                 p2p_blocking: bool = False) -> PipelineResult:
    """Execute the schedule.

    Args:
        schedule: a ``SCHEDULE_ORDERS`` key.
        p, m, v: pipeline ranks, micro-batches per step, chunks per rank (``dualpipe``: 2).
        cost: ``(rank, chunk, kind) -> UnitCost`` of one micro-batch's unit; with ``split_w``
            the ``B`` cost should exclude the weight-gradient time that ``W`` carries.
        p2p_s: activation / gradient transfer between neighbouring ranks.
        split_w: zero-bubble (``W`` units deferred into bubbles).
        pair_overlap: DualPipe's bidirectional overlap: a forward and a backward of opposite
            directions run back to back hide the shorter one's exposed communication.
        p2p_blocking: a unit whose output goes to another rank keeps its rank busy for the
            ``p2p_s`` of the transfer (``Layout.pp_p2p_blocking``), charged to the unit as
            exposed ``pp`` communication; the receiver gets the output when the sender is free.
    """
    dual = schedule == "dualpipe"
    if v != 1 and schedule not in ("interleaved-1f1b", "dualpipe"):
        # These orders ignore v: their chunks > 0 would never run ("deadlocked").
        raise ConfigError(f"schedule {schedule!r} takes v=1 (only interleaved-1f1b and "
                          f"dualpipe run several chunks per rank), but got v={v}")
    orders, plan_deps = _plan(schedule, p, m, v)
    # Units whose output another rank reads (one transfer each).
    sends = ({key for deps in plan_deps.values() for key, crosses in deps if crosses}
             if p2p_blocking and p2p_s > 0 else set())
    ptr = [0] * p
    free = [0.0] * p
    end_of: dict[Key, float] = {}
    pending_w: list[deque[PipeOp]] = [deque() for _ in range(p)]
    # Zero-bubble H1: rank r defers up to r W units (later ranks run their B earlier, earlier
    # ranks fill their cool-down with W), keeping every rank within 1F1B's peak activation
    # memory (p in-flight units on rank 0); DualPipe places its W units itself.
    w_cap = [0 if dual else r for r in range(p)]
    units: list[PipeUnit] = []
    last_op: list[PipeUnit | None] = [None] * p
    in_flight = [0] * p
    max_in_flight = [0] * p
    cost_memo: dict[tuple[int, int, str], UnitCost] = {}
    paired_f: list[Key | None] = [None] * p

    def ucost(r: int, c: int, kind: str) -> UnitCost:
        k = (r, c, kind)
        if k not in cost_memo:
            cost_memo[k] = cost(r, c, kind)
        return cost_memo[k]

    def ready_at(r: int, op: PipeOp) -> float | None:
        t = 0.0
        for key, crosses in plan_deps[(r, op)]:
            e = end_of.get(key)
            if e is None:
                return None
            t = max(t, e + p2p_s) if crosses else max(t, e)
        return t

    def execute(r: int, op: PipeOp, t_ready: float) -> None:
        c = ucost(r, op.chunk, op.kind)
        start = max(free[r], t_ready)
        dur = c.duration_s
        prev = last_op[r]
        if (pair_overlap and prev is not None and prev.end_s >= start - 1e-12
                and prev.op.chunk != op.chunk and prev.op.kind != op.kind):
            hidden = min(sum(v for _, v in prev.cost.exposed_comm_s),
                         sum(v for _, v in c.exposed_comm_s))
            dur = max(dur - hidden, 0.0)
            if hidden > 0:
                c = UnitCost(duration_s=dur, compute_s=c.compute_s, slowdown_s=c.slowdown_s,
                             exposed_comm_s=tuple((g, v * (1 - hidden / max(
                                 sum(x for _, x in c.exposed_comm_s), 1e-30)))
                                 for g, v in c.exposed_comm_s),
                             wgrad_s=c.wgrad_s, hw_flops=c.hw_flops)
        done_s = start + dur
        if (op.kind, op.mb, r, op.chunk) in sends:
            # The sender waits for its transfer: the unit ends when the output has arrived.
            c = c + UnitCost(duration_s=p2p_s, exposed_comm_s=(("pp", p2p_s),))
            dur += p2p_s
        u = PipeUnit(r, op, start, start + dur, c)
        units.append(u)
        last_op[r] = u
        free[r] = u.end_s
        if op.kind == "F" and op.paired:
            # Its activation goes out with the pair's sends, after the paired backward.
            paired_f[r] = (op.kind, op.mb, r, op.chunk)
        else:
            # Receivers add p2p_s to this: the compute's end, before any blocking send.
            end_of[(op.kind, op.mb, r, op.chunk)] = done_s
            if paired_f[r] is not None:
                end_of[paired_f[r]] = done_s
                paired_f[r] = None
        if op.kind == "F":
            in_flight[r] += 1
            max_in_flight[r] = max(max_in_flight[r], in_flight[r])
        elif op.kind == "B":
            in_flight[r] -= 1

    def candidate(r: int) -> tuple[PipeOp, float] | None:
        order = orders[r]
        while ptr[r] < len(order) and order[ptr[r]].kind == "W" and split_w \
                and len(pending_w[r]) < w_cap[r]:
            pending_w[r].append(order[ptr[r]])
            ptr[r] += 1
        if ptr[r] >= len(order):
            return None
        op = order[ptr[r]]
        t = ready_at(r, op)
        if t is not None and op.paired:
            # DualPipe's overlapped forward-backward chunk waits for both of its inputs.
            tb = ready_at(r, order[ptr[r] + 1])
            t = None if tb is None else max(t, tb)
        return None if t is None else (op, t)

    total = sum(len(o) for o in orders)
    done = 0
    # A rank's candidate only changes when it or a neighbouring rank runs a unit.
    cache: list[tuple[PipeOp, float] | None] = [None] * p
    stale = set(range(p))
    while done < total:
        for r in stale:
            cache[r] = candidate(r)
        stale = set()
        best_r, best = -1, None
        for r in range(p):
            cand = cache[r]
            if cand is None:
                continue
            start = max(free[r], cand[1])
            if best is None or start < best[2]:
                best_r, best = r, (cand[0], cand[1], start)
        if best is None:
            flushed = False
            for r in range(p):
                while pending_w[r]:
                    op = pending_w[r].popleft()
                    execute(r, op, ready_at(r, op) or 0.0)
                    done += 1
                    flushed = True
            if not flushed:
                raise CharonError(f"pipeline schedule {schedule!r} deadlocked after {done} of "
                                  f"{total} units (p={p}, m={m}, v={v})")
            stale = set(range(p))
            continue
        r, (op, t_ready, _) = best_r, best
        # Zero-bubble: fill the wait before this op with deferred weight-gradient units, each
        # only if it ends by the time the op is ready (ZB-H1 places a W where it fits; a longer
        # one would delay the critical F/B and waits for a later gap or the cool-down).
        while pending_w[r] and free[r] + ucost(
                r, pending_w[r][0].chunk, "W").duration_s <= t_ready + 1e-12:
            w = pending_w[r].popleft()
            execute(r, w, ready_at(r, w) or 0.0)
            done += 1
        execute(r, op, t_ready)
        done += 1
        ptr[r] += 1
        stale = {r, (r - 1) % p, (r + 1) % p}
    for r in range(p):
        while pending_w[r]:
            w = pending_w[r].popleft()
            execute(r, w, ready_at(r, w) or 0.0)
    last_bwd: dict[tuple[int, int], tuple[float, float]] = {}
    grad_kind = "W" if split_w else "B"
    for u in units:
        if u.op.kind == grad_kind:
            key = (u.rank, u.op.chunk)
            # The gradients exist when the compute ends, before a blocking send's wait.
            end = u.end_s - u.send_wait_s
            if key not in last_bwd or end > last_bwd[key][1]:
                last_bwd[key] = (u.start_s, end)
    return PipelineResult(units=units, rank_end_s=list(free), last_backward=last_bwd,
                          max_in_flight=max_in_flight)
