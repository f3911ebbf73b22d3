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
from typing import Any

import numpy as np

from charon_search.cost.profile_db import ProfileDB
from charon_search.errors import ConfigError

__all__ = ["FIT_KINDS", "ClusterCollectiveFit", "CollectiveFit", "bus_factors",
           "calibration_block", "fit_cluster_calibration", "fit_collectives",
           "fit_pairwise_alpha", "fit_points"]

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
                      ) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------- cluster fit
def _tier_points(db: ProfileDB, gpu: str, tier: str, gpus_per_node: int = 8,
                 fit_kinds: Sequence[str] = FIT_KINDS
                 ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, str]:
    kinds: list[str] = []
    p, nb, t, src = [], [], [], set()
    for kind in fit_kinds:
        tbl = db.table(gpu, kind)
        if tbl is None:
            continue
        c = tbl.columns
        nodes = np.where(np.isnan(c["num_nodes"]), 1.0, c["num_nodes"])
        variants = c["variant"]
        has_aic = bool((variants == "").any())
        for i in range(len(tbl)):
            if c["group_size"][i] < 2:
                continue
            g = c["group_size"][i]
            here = ("intra" if nodes[i] == 1 else "inter" if nodes[i] == g
                    else "multi" if g == nodes[i] * gpus_per_node else "")
            # intra: aiconfigurator rows where present (one campaign); inter: vidur 1/node.
            if here != tier or (tier == "intra" and has_aic and variants[i] != ""):
                continue
            kinds.append(kind)
            p.append(c["group_size"][i])
            nb.append(c["bytes"][i])
            t.append(c["latency_s"][i])
            src.add(str(c["source"][i]))
    return kinds, np.array(p), np.array(nb), np.array(t), "; ".join(sorted(src))


@dataclass(frozen=True, kw_only=True)
class ClusterCollectiveFit:
    """Calibration values fitted through ``cost.collectives.collective_time`` itself."""

    tier: str
    values: Mapping[str, float]
    """``collective_launch_s``, ``alpha:<key>`` and ``eff:<key>`` (keys as in the YAML)."""
    num_points: int
    mape: float
    """Over every measured point of the tier (all group sizes)."""
    source: str
    num_fit_points: int = 0
    mape_fit: float = float("nan")
    """Over the points the fit used (``min_group_size``)."""
    min_group_size: int = 0
    rows: str = "NCCL"
    """Which measured rows were fitted (``NCCL`` collectives or ``NCCL all-to-all``)."""

    def provenance(self) -> str:
        return (f"fit (charon_search.cost.nccl_fit: log-error least squares through "
                f"cost.collectives) to the {self.rows} rows of {self.source}: "
                f"{self.num_fit_points} points of "
                f">= {self.min_group_size} GPUs, MAPE {self.mape_fit:.1%} on them, "
                f"{self.mape:.1%} on all {self.num_points} points")


def fit_cluster_calibration(db: ProfileDB, gpu: str, cluster: object, *,
                            data_tier: str = "intra", tier_name: str | None = None,
                            fit_launch: bool = True, min_group_size: int = 0,
                            large_weight: float = 1.0) -> ClusterCollectiveFit:
    """Fit ``collective_launch_s`` and the α / efficiency of one cluster tier (and its
    ``<tier>.nvls`` variant when the tier lists NVLS) to measured NCCL rows, by minimizing
    log(model / measured) of ``cost.collectives.collective_time`` over the points.

    Args:
        db: profile DB with collective rows for ``gpu``.
        gpu: DB GPU key.
        cluster: the ``ClusterSpec`` whose model is fitted (its other values stay).
        data_tier: ``intra`` (single-node tables; stride 1), ``inter`` (one GPU per node;
            stride = ``gpus_per_node``) or ``multi`` (several full nodes, ``gpus_per_node``
            GPUs each, stride 1: crosses the innermost tier and the next, as DP does).
        tier_name: the cluster tier the points exercise (default: innermost for intra,
            second for inter).
        fit_launch: also fit ``collective_launch_s`` (else keep the cluster's).
        min_group_size: fit only points of at least this many GPUs (the MAPE is still
            reported over every point of the tier).
        large_weight: weight of messages >= 16 MiB in the fit relative to smaller ones
            (bandwidth-bound collectives dominate training step time).
    """
    import dataclasses

    from scipy.optimize import least_squares

    from charon_search.cost.collectives import collective_time

    all_kinds, all_p, all_nb, all_t, src = _tier_points(
        db, gpu, data_tier, cluster.gpus_per_node)  # type: ignore[attr-defined]
    sel = all_p >= min_group_size
    kinds = [k for k, x in zip(all_kinds, sel) if x]
    p, nb, t = all_p[sel], all_nb[sel], all_t[sel]
    if len(t) < 4:
        raise ConfigError(f"no {data_tier} collective measurements for {gpu} in the profile DB")
    tiers = cluster.tiers  # type: ignore[attr-defined]
    tier = next((x for x in tiers if x.name == tier_name), None) if tier_name else (
        tiers[0] if data_tier == "intra" else tiers[1])
    if tier is None:
        raise ConfigError(f"tier_name {tier_name!r}: must be one of {[x.name for x in tiers]}")
    stride = cluster.gpus_per_node if data_tier == "inter" else 1  # type: ignore[attr-defined]
    keys = [tier.name] + ([f"{tier.name}.nvls"] if "nvls" in tier.algorithms else [])
    cal = cluster.calibration  # type: ignore[attr-defined]
    x0 = ([cal.collective_launch_s] if fit_launch else [])
    for k in keys:
        x0 += [cal.collective_alpha_s.get(k, tier.latency_s),
               cal.collective_bw_efficiency.get(k, 0.8)]
    lo = [0.0] * (1 if fit_launch else 0) + [0.0, 0.05] * len(keys)
    hi = [100e-6] * (1 if fit_launch else 0) + [100e-6, 1.0] * len(keys)
    x0 = [min(max(v, a + 1e-9), b - 1e-9) for v, a, b in zip(x0, lo, hi)]
    # x_scale: seconds (launch, each α) live near 1e-5, efficiencies near 1
    scale = np.array(([1e-5] if fit_launch else []) + [1e-5, 1.0] * len(keys))

    def unpack(x: np.ndarray) -> Any:
        vals = list(x)
        launch = vals.pop(0) if fit_launch else cal.collective_launch_s
        alpha, eff = dict(cal.collective_alpha_s), dict(cal.collective_bw_efficiency)
        for k in keys:
            alpha[k], eff[k] = vals.pop(0), vals.pop(0)
        return dataclasses.replace(cluster, calibration=dataclasses.replace(  # type: ignore
            cal, collective_launch_s=launch, collective_alpha_s=alpha,
            collective_bw_efficiency=eff))

    def resid(x: np.ndarray) -> np.ndarray:
        cl = unpack(x)
        pred = np.array([collective_time(k, b, int(g), cl, stride=stride)
                         for k, b, g in zip(kinds, nb, p)])
        return np.log(pred / t)

    weight = np.sqrt(np.where(nb >= 2**24, large_weight, 1.0))
    res = least_squares(lambda x: resid(x) * weight, np.array(x0), bounds=(lo, hi),
                        x_scale=scale)
    final = unpack(res.x)
    mape_fit = float(np.mean(np.abs(np.exp(resid(res.x)) - 1)))
    num_fit = len(t)
    kinds, p, nb, t = all_kinds, all_p, all_nb, all_t  # report over every point
    pred = np.exp(resid(res.x)) * t
    mape = float(np.mean(np.abs(pred - t) / t))
    fcal = final.calibration
    values: dict[str, float] = {"collective_launch_s": fcal.collective_launch_s}
    for k in keys:
        values[f"alpha:{k}"] = fcal.collective_alpha_s[k]
        values[f"eff:{k}"] = fcal.collective_bw_efficiency[k]
    return ClusterCollectiveFit(tier=tier.name, values=values, num_points=len(t), mape=mape,
                                source=src, num_fit_points=num_fit, mape_fit=mape_fit,
                                min_group_size=int(min_group_size))


#: Largest all-to-all message (bytes per rank) ``fit_pairwise_alpha`` fits: where the measured
#: time is mostly latency (8 H100s: 6.5 us at 512 B, 15.6 us at 1 MiB, 41 us at 8 MiB).
PAIRWISE_FIT_MAX_BYTES = 2**20


def fit_pairwise_alpha(db: ProfileDB, gpu: str, cluster: object, *,
                       max_bytes: float = PAIRWISE_FIT_MAX_BYTES) -> ClusterCollectiveFit:
    """Fit the innermost tier's ``<tier>.pairwise`` α (all-to-all latency) to the measured
    NCCL all-to-all rows of at most ``max_bytes``, through ``cost.collectives.collective_time``
    (log-error least squares; launch and bandwidth efficiency stay the cluster's).

    The ring α of the tier is a ring step's latency; an all-to-all sends to every peer at
    once, so its latency is its own number. Only α is fitted: the bulk bandwidth of the EP
    exchanges the simulator prices comes from the engines' kernels (DeepEP intranode moves
    153-158 GB/s on H800 NVLink, ~0.77 of its 200 GB/s per direction: DeepEP README), not from
    NCCL's all-to-all, so the tier's ring efficiency stays for the bandwidth term.
    """
    import dataclasses

    from scipy.optimize import least_squares

    from charon_search.cost.collectives import collective_time

    _, p, nb, t, src = _tier_points(db, gpu, "intra",
                                        cluster.gpus_per_node,  # type: ignore[attr-defined]
                                        fit_kinds=("all_to_all",))
    keep = nb <= max_bytes
    if keep.sum() < 4:
        raise ConfigError(f"no NCCL all-to-all measurements for {gpu} in the profile DB")
    p, nb, t = p[keep], nb[keep], t[keep]
    tier = cluster.tiers[0]  # type: ignore[attr-defined]
    key = f"{tier.name}.pairwise"
    cal = cluster.calibration  # type: ignore[attr-defined]

    def with_alpha(a: float) -> Any:
        alpha = dict(cal.collective_alpha_s)
        alpha[key] = a
        return dataclasses.replace(cluster, calibration=dataclasses.replace(  # type: ignore
            cal, collective_alpha_s=alpha))

    def resid(x: np.ndarray) -> np.ndarray:
        cl = with_alpha(float(x[0]))
        pred = np.array([collective_time("all_to_all", b, int(g), cl) for b, g in zip(nb, p)])
        return np.log(pred / t)

    res = least_squares(resid, np.array([tier.latency_s]), bounds=([0.0], [100e-6]),
                        x_scale=np.array([1e-5]))
    mape = float(np.mean(np.abs(np.exp(resid(res.x)) - 1)))
    return ClusterCollectiveFit(
        tier=tier.name, values={"collective_launch_s": cal.collective_launch_s,
                                f"alpha:{key}": float(res.x[0])},
        num_points=len(t), mape=mape, source=src, num_fit_points=len(t), mape_fit=mape,
        min_group_size=int(p.min()), rows=f"NCCL all-to-all (<= {max_bytes / 2**10:.0f} KiB)")


def write_calibration(cluster: object, fit: ClusterCollectiveFit, path: str | None = None
                      ) -> object:
    """Write ``fit`` into the ``calibration:`` block of the cluster's YAML file (in place).

    Only ``collective_launch_us``, ``collective_alpha_us`` / ``collective_bw_efficiency`` entries
    of the fitted keys and their ``provenance`` lines change; comments and other keys stay. A
    ``<tier>.pairwise`` fit (``fit_pairwise_alpha``) leaves the launch
    and the other provenance lines alone and sets ``provenance.collective.<tier>.pairwise``.
    """
    import re
    from pathlib import Path

    import yaml

    from charon_search.hardware.loader import spec_dirs

    name = cluster.name  # type: ignore[attr-defined]
    target = Path(path) if path else next(
        (d / f"{name}.yaml" for d in spec_dirs() if (d / f"{name}.yaml").exists()), None)
    if target is None:
        raise ConfigError(f"cluster {name}: no YAML file found to write the calibration into")
    lines = target.read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("calibration:")), None)
    if start is None:
        raise ConfigError(f"{target}: no `calibration:` block")
    prov = fit.provenance()
    alpha = {k[6:]: round(v * 1e6, 3) for k, v in fit.values.items() if k.startswith("alpha:")}
    eff = {k[4:]: round(v, 3) for k, v in fit.values.items() if k.startswith("eff:")}
    launch = round(fit.values["collective_launch_s"] * 1e6, 3)
    pairwise = bool(alpha) and all(k.endswith(".pairwise") for k in alpha)
    seen: set[str] = set()
    in_prov = False
    prov_at = None
    for i in range(start + 1, len(lines)):
        ln = lines[i]
        if ln and not ln.startswith(" "):
            break
        if pairwise and in_prov and ln.strip().startswith(f"collective.{fit.tier}.pairwise:"):
            prov_at = i
            continue
        m = re.match(r"^(\s+)(collective_alpha_us|collective_bw_efficiency|"
                     r"collective_launch_us|provenance):\s*(.*)$", ln)
        if not m:
            continue
        indent, key, value = m.groups()
        if key == "provenance":
            in_prov = True
            prov_at = prov_at or i
            continue
        if in_prov and len(indent) > 2:
            if not pairwise:
                lines[i] = f'{indent}{key}: {json_str(prov)}'
            seen.add("prov:" + key)
            continue
        if key == "collective_launch_us":
            if not pairwise:
                lines[i] = f"{indent}{key}: {launch}"
        else:
            current = dict(yaml.safe_load(value) or {})
            current.update(alpha if key == "collective_alpha_us" else eff)
            body = ", ".join(f"{k}: {v}" for k, v in current.items())
            lines[i] = f"{indent}{key}: {{{body}}}"
        seen.add(key)
    missing = {"collective_launch_us", "collective_alpha_us", "collective_bw_efficiency"} - seen
    if missing:
        raise ConfigError(f"{target}: calibration block lacks {sorted(missing)}; add them first")
    if pairwise and prov_at is not None:
        entry = f"    collective.{fit.tier}.pairwise: {json_str(prov)}"
        if lines[prov_at].strip().startswith("collective."):
            lines[prov_at] = entry
        else:
            lines.insert(prov_at + 1, entry)
    target.write_text("\n".join(lines) + "\n")
    return target


def json_str(text: str) -> str:
    """A double-quoted YAML scalar."""
    import json

    return json.dumps(text)
