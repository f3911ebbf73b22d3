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
size, on clusters whose innermost tier is NVLink (an NVSwitch: a group's bandwidth does not
depend on the other groups of the node, so the single-group measurement holds for all of
them). Message sizes between measured ones are interpolated log-log; below the smallest the
smallest's time applies (the latency floor), above the largest the time grows in proportion to
the bytes (the bus is saturated there). Everything else — groups that leave the node, PCIe
boxes, GPUs without a table — returns ``None`` and keeps the α-β model.

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

from charon_search.cost.profile_db import ProfileDB, default_profile_db, normalize_gpu
from charon_search.hardware.spec import ClusterSpec

__all__ = ["MEASURED_KINDS", "Curve", "cost_model_nccl_s", "loglog_curve", "loglog_interp",
           "measured_nccl_s"]

#: Collective kinds with NCCL rows in the DB.
MEASURED_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

Curve = tuple[tuple[float, ...], tuple[float, ...]]
#: Curves per (DB content hash, GPU, kind, group size): two DB objects of the same content
#: share them, and a DB written anew gets its own.
_curves: dict[tuple[str, str, str, int], Curve | None] = {}
_lock = threading.Lock()


@cache
def _gpu_key(name: str) -> str | None:
    return normalize_gpu(name)


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
    n = int(group_size)
    if kind not in MEASURED_KINDS or n <= 1 or nbytes <= 0:
        return None
    inner = cluster.tiers[0]
    # Ranks 0, stride, ..., (n-1)·stride all inside the first node, behind one NVSwitch.
    if inner.name != "nvlink" or (n - 1) * max(1, int(stride)) >= cluster.gpus_per_node:
        return None
    db = db if db is not None else default_profile_db()
    gpu = _gpu_key(cluster.gpu.name)
    if db is None or gpu is None:
        return None
    curve = _curve(db, gpu, kind, n)
    return None if curve is None else loglog_interp(curve, nbytes)


def cost_model_nccl_s(cost_model: Any, kind: str, nbytes: float, group_size: int,
                      cluster: ClusterSpec, *, stride: int = 1) -> float | None:
    """``measured_nccl_s`` from ``cost_model``'s profile DB when that model reads profiles
    (``use_profile`` and a ``db``), else None: a model told not to use measurements, or one
    without a DB (the roofline, the FLOP counter), prices collectives by the topology model."""
    db = getattr(cost_model, "db", None)
    if not getattr(cost_model, "use_profile", False) or db is None:
        return None
    return measured_nccl_s(kind, nbytes, group_size, cluster, stride=stride, db=db)
