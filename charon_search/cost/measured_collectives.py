"""NCCL collectives inside one node, priced from the measured tables of the profile DB.

The α-β model of ``cost.collectives`` is one straight line per tier and algorithm; NCCL's
protocol and algorithm switches (LL -> LL128 -> Simple, ring -> NVLS / tree) bend the measured
curve, and the line fitted through a GPU's 63 intra-node points (``cost.nccl_fit``, the cluster
specs' ``collective_*`` provenance) misses single sizes by 20-50 %: A100 all-reduce over 8 GPUs
+16 % at 64-128 MiB, H100 -22 to -27 % at 8-32 MiB, B200 all-gather +34 % at 128 MiB (the fitted
model against the same rows). Where the DB measured the collective itself, that measurement is
the better cost, as for every compute kernel (profile first, model where nothing was measured).

Covered: all-reduce, all-gather, reduce-scatter and all-to-all of groups inside one node
(``num_nodes == 1`` rows, NCCL's own kernels, variant ``""``) on GPUs whose DB holds the group
size (or whose spec names a same-fabric sibling's rows, ``GpuSpec.nccl_profile_gpu``), where
every group of the axis stays inside a node (``gpus_per_node`` a multiple of ``n·stride``).
Behind an NVSwitch (innermost tier ``fabric: nvlink``) any ranks of the node qualify: a group's
bandwidth does not depend on which GPUs it has or on the other groups of the node, so the
single-group measurement holds for all of them. In a PCIe box (``fabric: pcie``) the path
depends on where the GPUs sit (a shared PCIe switch, one CPU socket, across sockets), so only
consecutive GPUs (``stride == 1``), the placement nccl-tests measured (GPUs ``0..g-1``), use
the rows; the 8x L40S rows fall from ~20 GB/s all-reduce bus bandwidth at 2 GPUs to ~5 at 4 and
~1.5 at 8, which no single α-β line reproduces. Several groups of a PCIe box communicating at
once are not modelled (each keeps its single-group time). Message sizes between measured ones
are interpolated log-log; below the smallest the smallest's time applies (the latency floor),
above the largest the time grows in proportion to the bytes (the bus is saturated there).
Everything else — groups that leave the node, strided PCIe groups, GPUs without a table —
returns ``None`` and keeps the α-β model, never below the slowest measured group it contains
(``measured_floor_s``: where the two sources meet, a larger group must not cost less than a
measured smaller one).

The rows are aiconfigurator-core 0.12.0 ``comm/nccl/<version>/nccl_perf.parquet`` (NCCL 2.27.3
on A100 and L40S, 2.29.2 elsewhere; ``charon_search/data/profiles/ATTRIBUTION.md``); ``bytes``
is the whole buffer, the IR's convention for every collective kind.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from functools import cache
from typing import Any

from charon_search.cost.collectives import rank_domains, whole_number
from charon_search.cost.profile_db import ProfileDB, default_profile_db, normalize_gpu
from charon_search.errors import ConfigError
from charon_search.hardware.spec import ClusterSpec

__all__ = ["MEASURED_KINDS", "Curve", "cost_model_nccl_floor_s", "cost_model_nccl_s",
           "loglog_curve", "loglog_interp", "measured_floor_s", "measured_nccl_s"]

#: Collective kinds with NCCL rows in the DB.
MEASURED_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

Curve = tuple[tuple[float, ...], tuple[float, ...]]
#: Curves per (DB content hash, GPU, kind, group size): two DB objects of the same content
#: share them, and a DB written anew gets its own.
_curves: dict[tuple[str, str, str, int], Curve | None] = {}
#: (group size, curve) of the measured sizes per (DB content hash, GPU, kind).
_sizes: dict[tuple[str, str, str], tuple[tuple[int, Curve], ...]] = {}
_lock = threading.Lock()


#: Innermost-tier fabrics behind which the intra-node rows apply (``TopologyTier.fabric``).
MEASURED_FABRICS = ("nvlink", "pcie")


@cache
def _gpu_key(name: str) -> str | None:
    return normalize_gpu(name)


def _rows_gpu(cluster: ClusterSpec) -> str | None:
    """DB key of the GPU whose NCCL rows price this cluster's intra-node collectives: the
    spec's ``nccl_profile_gpu`` (a same-fabric sibling, e.g. A100 40 GB -> 80 GB) or its own."""
    gpu = cluster.gpu
    return _gpu_key(getattr(gpu, "nccl_profile_gpu", "") or gpu.name)


def loglog_curve(points: list[tuple[float, float]]) -> Curve:
    """(log bytes, log seconds) of measured ``(bytes, seconds)`` points, sorted, under their
    lower monotone envelope: a message never costs more than a larger one (the kernel could
    pad it, or run the larger one's protocol), which also removes single-size outliers."""
    pts = sorted(points)
    lat = [t for _, t in pts]
    for i in range(len(lat) - 2, -1, -1):
        lat[i] = min(lat[i], lat[i + 1])
    return tuple(math.log(b) for b, _ in pts), tuple(math.log(t) for t in lat)


def loglog_interp(curve: Curve, nbytes: float, *, beyond: str = "linear") -> float | None:
    """Seconds at ``nbytes`` on a ``loglog_curve``: log-log interpolation between measured
    sizes, the smallest's time below them; above the largest, time in proportion to the bytes
    (``beyond="linear"``: a saturated bus) or None (``beyond="none"``)."""
    xs, ys = curve
    x = math.log(nbytes)
    if x <= xs[0]:
        return math.exp(ys[0])
    if x >= xs[-1]:
        if x > xs[-1] and beyond == "none":
            return None
        return math.exp(ys[-1] + x - xs[-1])
    i = bisect_left(xs, x)
    f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return math.exp(ys[i - 1] + f * (ys[i] - ys[i - 1]))


def _curve(db: ProfileDB, gpu: str, kind: str, group_size: int) -> Curve | None:
    """``loglog_curve`` of one GPU's intra-node NCCL ``kind`` over ``group_size`` ranks, or
    None if the DB lacks it."""
    key = (db.content_hash, gpu, kind, group_size)
    with _lock:
        if key in _curves:
            return _curves[key]
    table = db.table(gpu, kind) if db.has(gpu, kind) else None
    out: Curve | None = None
    if table is not None:
        cols = table.select(variant="").columns
        pts = [(float(b), float(t)) for b, t, g, nn in zip(
            cols["bytes"], cols["latency_s"], cols["group_size"], cols["num_nodes"])
            if g == group_size and nn == 1 and b > 0 and t > 0]
        if len(pts) >= 2:
            out = loglog_curve(pts)
    with _lock:
        _curves[key] = out
    return out


def measured_nccl_s(kind: str, nbytes: float, group_size: int, cluster: ClusterSpec, *,
                    stride: int = 1, db: ProfileDB | None = None) -> float | None:
    """Seconds of one NCCL ``kind`` over ``group_size`` ranks at ``stride``, from the profile
    DB's intra-node measurements; None where they do not cover it (see the module docstring).

    ``db`` defaults to the shipped profile DB.
    """
    n, stride = _checked(nbytes, group_size, stride)
    if kind not in MEASURED_KINDS or n <= 1 or nbytes <= 0:
        return None
    inner = cluster.tiers[0]
    node = cluster.gpus_per_node
    # Every group of the axis (ranks o, o + stride, ... for o = r + b·n·stride) inside one
    # node: behind one NVSwitch any such group; over PCIe consecutive GPUs only.
    if (inner.fabric not in MEASURED_FABRICS or n * stride > node or node % (n * stride)
            or (inner.fabric == "pcie" and stride != 1)):
        return None
    db = db if db is not None else default_profile_db()
    gpu = _rows_gpu(cluster)
    if db is None or gpu is None:
        return None
    curve = _curve(db, gpu, kind, n)
    return None if curve is None else loglog_interp(curve, nbytes)


def _checked(nbytes: float, group_size: int, stride: int) -> tuple[int, int]:
    """(group size, stride) as ints, or ``ConfigError`` for NaN / infinite bytes and sizes
    that are not whole numbers >= 1 (what ``cost.collectives`` rejects too)."""
    if not nbytes < math.inf or nbytes != nbytes:
        raise ConfigError(f"`nbytes >= 0` must hold for a finite number, but got {nbytes!r}")
    return whole_number("group_size", group_size), whole_number("stride", stride)


def _measured_curves(db: ProfileDB, gpu: str, kind: str) -> tuple[tuple[int, Curve], ...]:
    """(group size, curve) of every intra-node ``kind`` curve in ``db`` for ``gpu``, by size."""
    key = (db.content_hash, gpu, kind)
    hit = _sizes.get(key)  # a dict read is atomic; writes take the lock
    if hit is not None:
        return hit
    out: list[tuple[int, Curve]] = []
    if db.has(gpu, kind):
        cols = db.table(gpu, kind).select(variant="").columns
        for g in sorted({int(g) for g, nn in zip(cols["group_size"], cols["num_nodes"])
                         if nn == 1 and g > 1}):
            curve = _curve(db, gpu, kind, g)
            if curve is not None:
                out.append((g, curve))
    with _lock:
        _sizes[key] = tuple(out)
    return _sizes[key]


def measured_floor_s(kind: str, nbytes: float, group_size: int, cluster: ClusterSpec, *,
                     stride: int = 1, db: ProfileDB | None = None) -> float | None:
    """Seconds that a collective the α-β model prices cannot beat: the slowest measured
    intra-node NCCL ``kind`` over a group the given group contains; None without one.

    The measured rows (``measured_nccl_s``) and the model meet where a group outgrows them
    (more ranks than any measured size, ranks in several nodes or NVL72 trays, a strided group
    on an NVL72 rack); the two disagree by 20-60 % at mid sizes, so without this the cost could
    fall as the group grows. Physically it cannot: the ``k`` ranks of the group behind one
    NVSwitch (``k`` = group ranks in the first domain of the innermost ``nvlink`` tier: a DGX
    node, a whole NVL72 rack) do at least the work of a measured group of ``g <= k`` ranks
    (every GPU of an NVSwitch domain reaches the switch over the same links, so ``g`` ranks of
    the domain cost what the measured ``g`` did):

    * all-reduce, all-gather, reduce-scatter at the same ``S`` bytes: each of the ``k`` ranks
      still reduces or receives the whole buffer (``(n-1)/n·S`` grows with ``n``), and a group
      across nodes adds a network stage (NCCL's 2·log2(nNodes) inter-node latencies, its
      bandwidth bounded by min(NVLink, NICs)) to the intra-node one;
    * all-to-all at the same ``S``: every rank sends ``(n-1)/n·S`` (more) to ``n-1`` (more)
      peers, the ones outside the domain over links slower than its NVLink.

    The floor is the largest such measured time over the measured sizes ``g <= k`` (measured
    sizes are not monotone among themselves: NVLS makes 8 H100s faster than 4 above 64 MiB).
    Measured groups themselves keep their own rows (``measured_nccl_s``). In a PCIe box the
    measured ``g`` consecutive GPUs are the best-placed ``g`` of the node (a shared PCIe
    switch or socket), so their time bounds any ``g`` ranks there from below too. None where no
    measurement applies (kind not measured, innermost tier neither ``nvlink`` nor ``pcie``,
    GPU without rows).
    """
    n, stride = _checked(nbytes, group_size, stride)
    if kind not in MEASURED_KINDS or n <= 1 or nbytes <= 0:
        return None
    inner = cluster.tiers[0]
    domain = rank_domains(cluster)[0]  # consecutive ranks of the job in one domain
    if inner.fabric not in MEASURED_FABRICS or stride >= domain:
        return None
    db = db if db is not None else default_profile_db()
    gpu = _rows_gpu(cluster)
    if db is None or gpu is None:
        return None
    k = min(n, -(-domain // stride))  # ranks 0, stride, ... inside domain 0
    best: float | None = None
    for g, curve in _measured_curves(db, gpu, kind):
        if g > k:
            break
        t = loglog_interp(curve, nbytes)
        if best is None or t > best:
            best = t
    return best


def cost_model_nccl_floor_s(cost_model: Any, kind: str, nbytes: float, group_size: int,
                            cluster: ClusterSpec, *, stride: int = 1) -> float:
    """``measured_floor_s`` from ``cost_model``'s profile DB (0.0 where there is none, or
    where the model does not read measurements: see ``cost_model_nccl_s``).

    The callers that price a collective by ``cost_model_nccl_s`` and else by the α-β model
    take ``max(model seconds, this)`` for the latter, so that a group never costs less than a
    measured group it contains."""
    db = getattr(cost_model, "db", None)
    if not getattr(cost_model, "use_profile", False) or db is None:
        return 0.0
    t = measured_floor_s(kind, nbytes, group_size, cluster, stride=stride, db=db)
    return 0.0 if t is None else t


def cost_model_nccl_s(cost_model: Any, kind: str, nbytes: float, group_size: int,
                      cluster: ClusterSpec, *, stride: int = 1) -> float | None:
    """``measured_nccl_s`` from ``cost_model``'s profile DB when that model reads profiles
    (``use_profile`` and a ``db``), else None: a model told not to use measurements, or one
    without a DB (the roofline, the FLOP counter), prices collectives by the topology model."""
    db = getattr(cost_model, "db", None)
    if not getattr(cost_model, "use_profile", False) or db is None:
        return None
    return measured_nccl_s(kind, nbytes, group_size, cluster, stride=stride, db=db)
