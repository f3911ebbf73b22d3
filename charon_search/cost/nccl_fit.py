"""Fit per-tier collective α (per-step latency) and β (bandwidth efficiency) to measured NCCL.

Model (ring schedules, the one ``cost.collectives`` uses for the α-β part)::

    t = steps(kind, p) * α + bus_bytes(kind, p, bytes) / (efficiency * tier_bandwidth)

with ``steps = 2(p-1)`` and ``bus_bytes = 2(p-1)/p * bytes`` for all-reduce, ``p-1`` and
``(p-1)/p * bytes`` for all-gather / reduce-scatter (``bytes`` = the full buffer, IR
convention). ``α`` and ``1 / efficiency`` enter linearly, so the fit is a non-negative least
squares on relative error (each point weighted by 1/t), which fits α on small messages and
efficiency on large ones.

Tiers from the data: ``intra`` = rows inside one node (aiconfigurator 2/4/8-GPU tables, vidur
``devices_per_node == num_workers``); ``inter`` = one GPU per node (vidur ``devices_per_node ==
1``). NCCL's protocol/algorithm switch (LL -> LL128 -> Simple, tree -> ring/NVLS) shows as a
kink in t(bytes); ``switch_bytes`` is the breakpoint of the best two-segment α-β fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from charon_search.cost.profile_db import ProfileDB
from charon_search.errors import ConfigError

__all__ = ["FIT_KINDS", "CollectiveFit", "bus_factors", "calibration_block", "fit_collectives",
           "fit_points"]

FIT_KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def bus_factors(kind: str, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(steps, bus-bytes factor) of a ring ``kind`` over ``p`` ranks."""
    p = np.asarray(p, dtype=float)
    if kind == "all_reduce":
        return 2 * (p - 1), 2 * (p - 1) / p
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return p - 1, (p - 1) / p
    raise ConfigError(f"collective kind {kind!r}: must be one of {FIT_KINDS}")


@dataclass(frozen=True, kw_only=True)
class CollectiveFit:
    """Fitted α-β for one GPU and tier."""

    gpu: str
    tier: str
    """``intra`` (inside a node) or ``inter`` (one GPU per node)."""
    alpha_s: float
    """Per-step latency α."""
    bus_bytes_per_s: float
    """Achieved bus bandwidth 1/β."""
    bw_efficiency: float
    """bus_bytes_per_s / tier bandwidth (NaN when the tier bandwidth is not given)."""
    num_points: int
    mape: float
    """Mean |fit - measured| / measured over the points (ratio)."""
    switch_bytes: float
    """Message size of the protocol/algorithm switch (best two-segment breakpoint)."""
    source: str

    def provenance(self) -> str:
        return (f"fit to {self.source}, {self.num_points} points, MAPE {self.mape:.1%}, "
                f"switch at {self.switch_bytes / 2**10:.0f} KiB")


def _nnls2(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    return nnls(A, y)[0]


def fit_points(kinds: Sequence[str], group_sizes: np.ndarray, nbytes: np.ndarray,
               latency_s: np.ndarray) -> tuple[float, float, float]:
    """(α, bus bytes/s, MAPE) of the ring α-β model on these measurements."""
    steps = np.empty(len(kinds))
    factor = np.empty(len(kinds))
    for kind in set(kinds):
        m = np.array([k == kind for k in kinds])
        st, fa = bus_factors(kind, group_sizes[m])
        steps[m], factor[m] = st, fa
    A = np.column_stack([steps, factor * nbytes]) / latency_s[:, None]
    coef = _nnls2(A, np.ones(len(latency_s)))
    alpha, inv_bw = float(coef[0]), float(coef[1])
    pred = steps * alpha + factor * nbytes * inv_bw
    mape = float(np.mean(np.abs(pred - latency_s) / latency_s))
    return alpha, (1.0 / inv_bw if inv_bw > 0 else float("inf")), mape


def _switch_point(kinds: Sequence[str], p: np.ndarray, nbytes: np.ndarray,
                  lat: np.ndarray) -> float:
    sizes = np.unique(nbytes)
    best = (np.inf, float(sizes[0]) if len(sizes) else 0.0)
    for cut in sizes[2:-2]:
        lo, hi = nbytes <= cut, nbytes > cut
        err = 0.0
        for m in (lo, hi):
            _, _, mape = fit_points([k for k, x in zip(kinds, m) if x], p[m], nbytes[m], lat[m])
            err += mape * m.sum()
        if err < best[0]:
            best = (err, float(cut))
    return best[1]


def fit_collectives(db: ProfileDB, gpu: str, *,
                    tier_bandwidth_bytes_per_s: Mapping[str, float] | None = None,
                    min_bytes: float = 0.0) -> dict[str, CollectiveFit]:
    """Fit ``intra`` and (where measured) ``inter`` tiers for ``gpu`` from the profile DB.

    Args:
        db: profile DB with collective rows.
        gpu: DB GPU key.
        tier_bandwidth_bytes_per_s: ``{"intra": ..., "inter": ...}`` link bandwidths per GPU
            (unidirectional) to express 1/β as an efficiency; omitted tiers get NaN.
        min_bytes: ignore messages smaller than this.
    """
    bw = dict(tier_bandwidth_bytes_per_s or {})
    pts: dict[str, dict[str, list]] = {}
    for kind in FIT_KINDS:
        tbl = db.table(gpu, kind)
        if tbl is None:
            continue
        c = tbl.columns
        nodes = np.where(np.isnan(c["num_nodes"]), 1.0, c["num_nodes"])
        for i in range(len(tbl)):
            p, nb = c["group_size"][i], c["bytes"][i]
            if nb < min_bytes or p < 2:
                continue
            if nodes[i] == 1:
                tier = "intra"
            elif nodes[i] == p:
                tier = "inter"
            else:
                continue  # mixed hierarchical rows: not a single-tier measurement
            d = pts.setdefault(tier, {"k": [], "p": [], "b": [], "t": [], "src": [], "v": []})
            d["v"].append(str(c["variant"][i]))
            d["k"].append(kind)
            d["p"].append(p)
            d["b"].append(nb)
            d["t"].append(c["latency_s"][i])
            d["src"].append(str(c["source"][i]))
    out = {}
    for tier, d in sorted(pts.items()):
        # One measurement campaign per tier: prefer the aiconfigurator NCCL tables (variant "")
        # over vidur's older ones (variant "vidur") where both exist.
        keep = np.array([v != "vidur" for v in d["v"]])
        if not keep.any():
            keep[:] = True
        p, nb, t = (np.asarray(d[x], dtype=float)[keep] for x in ("p", "b", "t"))
        kinds = [k for k, x in zip(d["k"], keep) if x]
        alpha, bus_bw, mape = fit_points(kinds, p, nb, t)
        src = "; ".join(sorted({s for s, x in zip(d["src"], keep) if x}))
        out[tier] = CollectiveFit(
            gpu=gpu, tier=tier, alpha_s=alpha, bus_bytes_per_s=bus_bw,
            bw_efficiency=bus_bw / bw[tier] if tier in bw else float("nan"),
            num_points=len(t), mape=mape, switch_bytes=_switch_point(kinds, p, nb, t),
            source=src)
    return out


def calibration_block(fits: Mapping[str, CollectiveFit], tier_names: Mapping[str, str]
                      ) -> dict[str, dict[str, object]]:
    """YAML-ready ``calibration`` entries: ``collective_alpha_us``, ``collective_bw_efficiency``
    and ``provenance`` keyed by the cluster's tier names (``tier_names``: intra/inter -> name).
    """
    alpha: dict[str, float] = {}
    eff: dict[str, float] = {}
    prov: dict[str, str] = {}
    for tier, fit in fits.items():
        name = tier_names.get(tier)
        if name is None:
            continue
        alpha[name] = round(fit.alpha_s * 1e6, 3)
        if np.isfinite(fit.bw_efficiency):
            eff[name] = round(min(fit.bw_efficiency, 1.0), 3)
        prov[f"collective.{name}"] = fit.provenance()
    return {"collective_alpha_us": alpha, "collective_bw_efficiency": eff, "provenance": prov}
