"""Pareto fronts and hypervolume, on losses (every objective minimised; maximised ones negated)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["hypervolume", "non_dominated", "normalized_hypervolume"]


def non_dominated(losses: Sequence[Sequence[float]] | np.ndarray) -> list[int]:
    """Indices of the points no other point dominates (<= everywhere, < somewhere).

    Equal points do not dominate each other, so duplicated objective vectors all stay; callers
    de-duplicate configs before (the study keys every trial by its canonical config).
    """
    pts = np.asarray(losses, dtype=float)
    if pts.size == 0:
        return []
    keep = []
    for i, p in enumerate(pts):
        le = np.all(pts <= p, axis=1)
        lt = np.any(pts < p, axis=1)
        if not np.any(le & lt):
            keep.append(i)
    return keep


def hypervolume(losses: Sequence[Sequence[float]], reference: Sequence[float]) -> float:
    """Volume dominated by ``losses`` and bounded by ``reference`` (points beyond it ignored)."""
    pts = np.asarray(losses, dtype=float).reshape(-1, len(reference))
    ref = np.asarray(reference, dtype=float)
    pts = pts[np.all(pts < ref, axis=1)]
    if len(pts) == 0:
        return 0.0
    pts = pts[non_dominated(pts)]
    if pts.shape[1] == 2:
        order = np.argsort(pts[:, 0])
        pts = pts[order]
        vol, prev_y = 0.0, ref[1]
        for x, y in pts:
            if y < prev_y:
                vol += (ref[0] - x) * (prev_y - y)
                prev_y = y
        return float(vol)
    from optuna._hypervolume import compute_hypervolume

    return float(compute_hypervolume(pts, ref, assume_pareto=True))


def normalized_hypervolume(losses: Sequence[Sequence[float]], *, lower: Sequence[float],
                           upper: Sequence[float], margin: float = 0.1) -> float:
    """Hypervolume after scaling each loss to [0, 1] by ``lower``/``upper``, reference 1+margin.

    Used to compare a sampler's front with the exhaustive one: both are scaled by the exhaustive
    feasible set's ideal (``lower``) and nadir (``upper``) points.
    """
    lo, hi = np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)
    span = np.where(hi > lo, hi - lo, 1.0)
    pts = (np.asarray(losses, dtype=float).reshape(-1, len(lo)) - lo) / span
    return hypervolume(pts, [1.0 + margin] * len(lo))
