"""Level 1 of the hierarchical simulation: one block's forward / backward on the streams.

A chain of identical layers is laid on the compute and comm streams with the graph's
dependencies (layer ``r+1`` starts after layer ``r``'s outputs exist; FSDP all-gathers are
prefetched one layer ahead, or chained when prefetch is off). Running a chain of 1 and of 3
layers gives the cost of the first layer of a run (``first``) and the steady-state cost of each
further layer (``period``), so a pipeline chunk of ``n`` layers costs ``first + (n-1)·period``
whatever ``n`` is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from charon_search.ir import OpGraph, OpKind, Phase
from charon_search.sim.costing import CostedGraph
from charon_search.sim.engine import EngineResult, StreamEngine, Task

__all__ = ["LayerCost", "UnitCost", "chain_tasks", "layer_cost"]


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitCost:
    """Cost of running some layers once on one rank (all seconds)."""

    duration_s: float = 0.0
    compute_s: float = 0.0
    slowdown_s: float = 0.0
    exposed_comm_s: tuple[tuple[str, float], ...] = ()
    """(group, seconds) with no compute running."""
    wgrad_s: float = 0.0
    """Weight-gradient GEMM time inside ``compute_s`` (zero-bubble schedules defer it)."""
    hw_flops: float = 0.0

    def __add__(self, other: UnitCost) -> UnitCost:
        ex = dict(self.exposed_comm_s)
        for g, v in other.exposed_comm_s:
            ex[g] = ex.get(g, 0.0) + v
        return UnitCost(duration_s=self.duration_s + other.duration_s,
                        compute_s=self.compute_s + other.compute_s,
                        slowdown_s=self.slowdown_s + other.slowdown_s,
                        exposed_comm_s=tuple(sorted(ex.items())),
                        wgrad_s=self.wgrad_s + other.wgrad_s,
                        hw_flops=self.hw_flops + other.hw_flops)

    def scaled(self, f: float) -> UnitCost:
        return UnitCost(duration_s=self.duration_s * f, compute_s=self.compute_s * f,
                        slowdown_s=self.slowdown_s * f,
                        exposed_comm_s=tuple((g, v * f) for g, v in self.exposed_comm_s),
                        wgrad_s=self.wgrad_s * f, hw_flops=self.hw_flops * f)


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    first: UnitCost
    period: UnitCost
    timeline: EngineResult | None = None
    """The single-layer run (for op-level traces)."""
    tasks: tuple[Task, ...] = field(default_factory=tuple)
    dp_tail_s: tuple[float, float] = (0.0, 0.0)
    """Seconds of ``dp`` traffic (FSDP reduce-scatters) that run past the last gating task of a
    run of 1 and of 3 layers. ``first`` and ``period`` leave it out (the next layer overlaps
    it); after a rank's last backward nothing does, so the step charges it (``dp_tail``)."""

    def layers(self, n: int) -> UnitCost:
        """Cost of ``n`` consecutive layers of this block."""
        if n <= 0:
            return UnitCost()
        return self.first + self.period.scaled(n - 1)

    def dp_tail(self, n: int) -> float:
        """``dp`` traffic left after the last of ``n`` consecutive layers (1: the single-layer
        run's; more: the three-layer run's, whose last layer follows others)."""
        if n <= 0:
            return 0.0
        return self.dp_tail_s[0] if n == 1 else self.dp_tail_s[1]


def _is_wgrad(graph: OpGraph, i: int, outputs: frozenset[int]) -> bool:
    n = graph.nodes[i]
    return (n.phase == Phase.BACKWARD and n.kind in (OpKind.GEMM, OpKind.GROUPED_GEMM)
            and bool(n.outputs) and all(t in outputs for t in n.outputs))


def chain_tasks(cg: CostedGraph, copies: int, *, fsdp_prefetch: bool = True,
                fsdp_backward_prefetch: str = "pre") -> list[Task]:
    """Tasks for ``copies`` chained instances of the costed graph.

    ``fsdp_backward_prefetch="post"`` (``Layout.fsdp_backward_prefetch``) on a backward graph:
    each layer's all-gather waits for the previous layer's gradient computation, and the
    reduce-scatters join the all-gathers' stream in FSDP1's issue order (layer r's all-gather,
    then layer r - 1's reduce-scatter)."""
    g = cg.graph
    post = (fsdp_backward_prefetch == "post" and g.meta.get("direction") == "backward")
    producer_idx = {t: i for i, n in enumerate(g.nodes) for t in n.outputs}
    consumed = {t for n in g.nodes for t in n.inputs}
    deps_local: list[tuple[int, ...]] = []
    for n in g.nodes:
        deps_local.append(tuple(sorted({producer_idx[t] for t in n.inputs if t in producer_idx})))
    # Sinks gate the next layer; dp (gradient / parameter) collectives never do.
    sinks = [i for i, n in enumerate(g.nodes)
             if not any(t in consumed for t in n.outputs) and n.group != "dp"]
    sources = [i for i, n in enumerate(g.nodes) if not deps_local[i] and n.group != "dp"]
    gathers = [i for i, n in enumerate(g.nodes) if not deps_local[i] and n.group == "dp"]
    computed = [i for i, n in enumerate(g.nodes) if n.group != "dp"]
    all_gathers = [i for i in gathers if g.nodes[i].kind == OpKind.ALL_GATHER]
    nn = len(g.nodes)
    gather_stream = g.nodes[all_gathers[0]].stream if all_gathers else ""
    deferred = {i for i, n in enumerate(g.nodes)
                if post and n.group == "dp" and n.kind == OpKind.REDUCE_SCATTER}
    tasks: list[Task] = []
    order: list[int] = []  # task indices in stream-queue order (FSDP1 issue order)
    held: list[int] = []
    for r in range(copies):
        base = r * nn
        for i, n in enumerate(g.nodes):
            deps = [base + d for d in deps_local[i]]
            if r > 0 and i in sources:
                deps += [(r - 1) * nn + k for k in sinks]
            if post and i in sources:
                # FSDP1's pre-backward hook unshards before the layer's first backward op.
                deps += [base + k for k in all_gathers]
            if i in gathers:
                lag = 1 if post or not fsdp_prefetch else 2
                if r >= lag:
                    # BACKWARD_POST fires once the previous layer's gradients (its weight-
                    # gradient GEMMs, which are no sinks) are all computed.
                    deps += [(r - lag) * nn + k for k in (computed if post else sinks)]
            stream = n.stream if n.is_comm else "compute"
            if i in deferred:
                stream = gather_stream or stream
            tasks.append(Task(
                name=n.name, stream=stream,
                duration_s=float(cg.durations_s[i]), deps=tuple(deps), is_comm=n.is_comm,
                group=n.group, tier=cg.tiers[i], label=n.module_path or n.name))
            if i in deferred:
                held.append(base + i)
            else:
                order.append(base + i)
                if i in gathers and held:
                    # FSDP1 issues layer r's all-gather before layer r - 1's reduce-scatter.
                    order.extend(held)
                    held = []
    order.extend(held)
    if not deferred:
        return tasks
    pos = {v: k for k, v in enumerate(order)}
    return [dataclasses.replace(tasks[v], deps=tuple(pos[d] for d in tasks[v].deps))
            for v in order]


def _gate_end(res: EngineResult, tasks: list[Task]) -> float:
    """End of the run's last gating (non-``dp``) task."""
    return max((res.end_s[i] for i, t in enumerate(tasks) if t.group != "dp"), default=0.0)


def _dp_tail(res: EngineResult, tasks: list[Task]) -> float:
    """Time the run's ``dp`` collectives go on after its last gating (non-``dp``) task."""
    return max(res.makespan_s - _gate_end(res, tasks), 0.0)


def _unit(res: EngineResult, wgrad_s: float, flops: float, tasks: list[Task]) -> UnitCost:
    # Exposed dp traffic after the last gating task is not part of the layer: the next layer
    # (or the step's gradient sync) overlaps it.
    gate_end = _gate_end(res, tasks)
    tail = res.makespan_s - gate_end
    ex = dict(res.exposed_comm_s)
    if tail > 0 and "dp" in ex:
        ex["dp"] = max(ex["dp"] - tail, 0.0)
    return UnitCost(duration_s=gate_end, compute_s=res.compute_s, slowdown_s=res.slowdown_s,
                    exposed_comm_s=tuple(sorted((g, v) for g, v in ex.items() if v > 0)),
                    wgrad_s=wgrad_s, hw_flops=flops)


def layer_cost(cg: CostedGraph, *, compute_slowdown: float = 1.0, comm_slowdown: float = 1.0,
               fsdp_prefetch: bool = True, fsdp_backward_prefetch: str = "pre",
               flops: float = 0.0) -> LayerCost:
    """First-layer and steady-state costs of the costed block graph."""
    outputs = frozenset(cg.graph.outputs)
    wgrad = float(sum(cg.durations_s[i] for i in range(len(cg.graph.nodes))
                      if _is_wgrad(cg.graph, i, outputs)))
    runs = {}
    for copies in (1, 3):
        tasks = chain_tasks(cg, copies, fsdp_prefetch=fsdp_prefetch,
                            fsdp_backward_prefetch=fsdp_backward_prefetch)
        eng = StreamEngine(compute_slowdown=compute_slowdown, comm_slowdown=comm_slowdown)
        res = eng.run(tasks)
        runs[copies] = (res, tasks)
    r1, t1 = runs[1]
    r3, t3 = runs[3]
    first = _unit(r1, wgrad, flops, t1)
    three = _unit(r3, 3 * wgrad, 3 * flops, t3)
    period = UnitCost(
        duration_s=max((three.duration_s - first.duration_s) / 2, 0.0),
        compute_s=(three.compute_s - first.compute_s) / 2,
        slowdown_s=max((three.slowdown_s - first.slowdown_s) / 2, 0.0),
        exposed_comm_s=tuple(
            (g, max((v - dict(first.exposed_comm_s).get(g, 0.0)) / 2, 0.0))
            for g, v in three.exposed_comm_s),
        wgrad_s=wgrad, hw_flops=flops)
    return LayerCost(first=first, period=period, timeline=r1, tasks=tuple(t1),
                     dp_tail_s=(_dp_tail(r1, t1), _dp_tail(r3, t3)))
