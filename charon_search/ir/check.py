"""Structural checks of an ``OpGraph``; run after every pass in tests and under ``--debug``."""

from __future__ import annotations

from charon_search.errors import PassError
from charon_search.ir.graph import DTYPE_BYTES, OpGraph
from charon_search.ir.ops import PARAMS_BY_KIND, OpKind

__all__ = ["check"]

# Sample points at which non-negativity of FLOPs/bytes is checked.
_SAMPLE_POINTS = ((1, 1, 1), (2, 128, 128), (4, 4096, 4096), (64, 1, 8192))


def check(graph: OpGraph, *, where: str = "") -> None:
    """Raise ``PassError`` if ``graph`` is malformed.

    Checks: unique node ids and names; every input tensor is a graph input or produced by an
    earlier node (topological order); every output tensor is produced exactly once; every tensor
    referenced exists with a known dtype; every kind carries its declared params; FLOPs and bytes
    are non-negative at a few sample points.
    """
    prefix = f"{where}: " if where else ""

    def fail(msg: str) -> None:
        raise PassError(f"{prefix}graph {graph.name!r}: {msg}")

    seen_ids: set[int] = set()
    seen_names: set[str] = set()
    available = set(graph.inputs)
    written: set[int] = set()
    for t in graph.inputs:
        if t not in graph.tensors:
            fail(f"input tensor {t} is not in graph.tensors")
    for n in graph.nodes:
        if n.id in seen_ids:
            fail(f"duplicate node id {n.id} ({n.name})")
        if n.name in seen_names:
            fail(f"duplicate node name {n.name!r}")
        seen_ids.add(n.id)
        seen_names.add(n.name)
        if not isinstance(n.kind, OpKind):
            fail(f"node {n.name} has kind {n.kind!r}, not an OpKind")
        for t in n.inputs:
            if t not in graph.tensors:
                fail(f"node {n.name} reads unknown tensor {t}")
            if t not in available:
                fail(f"node {n.name} reads tensor {t} before it is produced")
        for t in n.outputs:
            if t not in graph.tensors:
                fail(f"node {n.name} writes unknown tensor {t}")
            if t in written or t in graph.inputs:
                fail(f"tensor {t} is written twice (second writer {n.name})")
            written.add(t)
            available.add(t)
        missing = [p for p in PARAMS_BY_KIND[n.kind] if p not in n.params]
        if missing:
            fail(f"node {n.name} ({n.kind}) lacks params {missing}")
        if n.dtype not in DTYPE_BYTES:
            fail(f"node {n.name} has dtype {n.dtype!r}; allowed: {sorted(DTYPE_BYTES)}")
    for t in graph.outputs:
        if t not in available:
            fail(f"output tensor {t} is never produced")
    for spec in graph.tensors.values():
        if spec.dtype not in DTYPE_BYTES:
            fail(f"tensor {spec.id} has dtype {spec.dtype!r}; allowed: {sorted(DTYPE_BYTES)}")
    for b, s, c in _SAMPLE_POINTS:
        ev = graph.evaluate(b, s, c)
        if (ev.flops < 0).any() or (ev.bytes < 0).any():
            bad = int(((ev.flops < 0) | (ev.bytes < 0)).argmax())
            fail(f"node {graph.nodes[bad].name} has negative FLOPs or bytes at b={b} s={s} c={c}")
