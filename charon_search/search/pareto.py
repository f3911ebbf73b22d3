"""Pareto fronts and hypervolume, on losses (every objective minimised; maximised ones negated)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["hypervolume", "non_dominated", "normalized_hypervolume"]


def non_dominated(losses: Sequence[Sequence[float]] | np.ndarray) -> list[int]:
    """Indices (ascending) of the points no other point dominates (<= everywhere, < somewhere).

    Equal points do not dominate each other, so duplicated objective vectors all stay; callers
    de-duplicate configs before (the study keys every trial by its canonical config). A point
    with a NaN coordinate neither dominates nor is dominated (every comparison with NaN is
    false), so it stays.

    O(n log n) for two objectives (sort, then sweep the running minimum of the second); for
    more, each front point found culls the points it dominates (``_front_cull``), so no pair
    of dominated points is ever compared.
    """
    pts = np.asarray(losses, dtype=float)
    if pts.size == 0:
        return []
    pts = pts.reshape(len(pts), -1)
    nan = np.isnan(pts).any(axis=1)
    rest = np.flatnonzero(~nan)
    sub = pts[rest]
    keep = _front_2d(sub) if sub.shape[1] == 2 else _front_cull(sub)
    return sorted([*rest[keep].tolist(), *np.flatnonzero(nan).tolist()])


def _front_2d(pts: np.ndarray) -> np.ndarray:
    """Non-dominated rows of an (n, 2) array without NaN: sorted by (x, y), a point stays when
    its y is the least of its x group and below every y of the smaller x values."""
    order = np.lexsort((pts[:, 1], pts[:, 0]))
    x, y = pts[order, 0], pts[order, 1]
    first = np.ones(len(x), dtype=bool)
    first[1:] = x[1:] != x[:-1]
    group = np.cumsum(first) - 1                     # group index of each sorted point
    group_min = y[first]                             # least y per x group (sorted by y)
    below = np.ones(len(group_min), dtype=bool)     # least y of the group < all earlier y
    below[1:] = group_min[1:] < np.minimum.accumulate(group_min)[:-1]
    keep = (y == group_min[group]) & below[group]
    return np.sort(order[keep])


def _front_cull(pts: np.ndarray) -> np.ndarray:
    """Non-dominated rows of an (n, k) array without NaN, for any k.

    The remaining point with the least sum of per-objective ranks is on the front (a point
    dominating it would have a smaller sum, and a point it culled earlier is dominated by a
    front point, which would have culled it too); it then culls every remaining point it
    dominates in one vectorised pass. O(n·f·k) for a front of f points, but a low rank sum
    dominates many points, so the remaining set shrinks fast.
    """
    ranks = np.column_stack([np.unique(col, return_inverse=True)[1] for col in pts.T])
    rest = np.argsort(ranks.sum(axis=1), kind="stable")
    kept: list[int] = []
    while len(rest):
        i, rest = rest[0], rest[1:]
        kept.append(int(i))
        p, q = pts[i], pts[rest]
        rest = rest[~(np.all(p <= q, axis=1) & np.any(p < q, axis=1))]
    return np.sort(np.asarray(kept, dtype=np.intp))


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
