"""How well the simulator orders serving configurations: what a configuration search relies on.

A search ranks candidate configurations by their simulated metrics and sends the best ones to
real hardware. A constant bias leaves that ranking intact; what breaks it is an error that
differs between configurations. Two views of a validation run measure it over the measured
sweeps, grouped by workload (model, input length, output length: the things a user fixes;
GPU, engine, layout and concurrency are the configuration):

* **pairwise concordance** (``pairwise_concordance``): over every pair of configurations of a
  workload whose measured values differ by at least ``min_gap``, the fraction the simulation
  orders the same way. Pairs closer than ``min_gap`` are left out: the measurements themselves
  move a few per cent between runs of one setup (``stats.run_to_run``).
* **Pareto agreement** (``pareto_agreement``): a serving search reports the front of output
  tokens/s per GPU against tokens/s per user (``1 / TPOT``, InferenceX's "interactivity"). Per
  workload, the measured front and the simulated front (each computed from its own values) are
  compared: recall (measured front points the simulation also puts on its front), precision,
  and the *shortfall* of every simulated-front configuration: its measured throughput per GPU
  over the best measured throughput per GPU at the same or a higher measured interactivity.
  A shortfall of 1.0 means that verifying the simulation's pick found the best measured
  configuration for its latency.
* **verifying the top k** (``verification_capture``): a user with a TPOT target (a minimum
  interactivity) keeps the configurations simulated to meet it, verifies the k with the highest
  simulated throughput per GPU, and deploys the best of those that meet the target when
  measured. Per workload, ``TARGETS_PER_WORKLOAD`` targets are spread evenly on a log scale
  from the lowest to the highest measured interactivity; the capture is the deployed
  throughput over the best measured throughput that meets the target (0 when none of the k
  does). A simulated pick near its target fails it as often as its TPOT error has that sign,
  which is what verifying more than one configuration buys back.
* **verifying under a guard** (``guarded_verification``): the same, with the configurations
  kept as an objective's ``guard: q`` keeps them (``search.objective``): a configuration is a
  candidate when its simulated TPOT times the validated TPOT band's ``r_q`` meets the target.
  Each record's band is computed without its own source (``validation.bands.held_out_bands``),
  so a workload's own errors never set its margin. A guard trades targets no configuration is
  simulated to meet (``no_candidate``) for picks that hold.

Throughput per GPU is derived the same way on both sides from a closed loop's Little's law,
``concurrency * output_len / (ttft + (output_len - 1) * tpot) / num_gpus`` (the nominal output
length, as ``stats.request_latency_rows``), so it needs the record's concurrency, output length
and GPU count; records without them (offline benchmarks, disaggregated rows without a stated
concurrency) are left out of the front, not of the concordance of the metrics they have.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from charon_search.search.pareto import non_dominated

__all__ = ["MIN_CONFIGS", "MIN_GAP", "VERIFY_GUARDS", "ConfigPoint", "configuration_ordering",
           "guarded_verification", "ordering_lines", "pairwise_concordance", "pareto_agreement",
           "pareto_front", "pareto_sentence", "serving_points", "verification_capture",
           "verify_sentence", "workload_of"]

#: Smallest measured difference of a pair that counts: 10 %, about three times the median
#: run-to-run spread of the shipped serving TTFT (3.4 %) and above its TPOT p90 (8.7 %).
MIN_GAP = 0.10
#: Workloads with fewer configurations have no front worth comparing.
MIN_CONFIGS = 4
#: How many of the simulation's best configurations ``verification_capture`` verifies.
VERIFY_TOP_K = (1, 3, 5)
#: TPOT targets per workload of ``verification_capture``.
TARGETS_PER_WORKLOAD = 10
#: Guard levels (an objective's ``guard``) ``guarded_verification`` reports.
VERIFY_GUARDS = (0.9,)
#: Measured metrics whose pairwise order is reported (besides the derived throughput per GPU).
ORDERED_METRICS = ("ttft_s", "tpot_s")


def workload_of(info: Mapping[str, Any]) -> tuple[str, int, int] | None:
    """``(model, input_len, output_len)`` of a serving case (``None``: not a serving record
    or lengths unknown)."""
    if info.get("kind") != "serving" or not info.get("input_len") or not info.get("output_len"):
        return None
    return (str(info.get("model")), int(info["input_len"]), int(info["output_len"]))


@dataclass(frozen=True, slots=True)
class ConfigPoint:
    """One measured configuration of a workload on the throughput / interactivity plane."""

    id: str
    measured: tuple[float, float]
    """(output tokens/s per GPU, tokens/s per user) from the measured TTFT and TPOT."""
    predicted: tuple[float, float]
    """The same from the simulated TTFT and TPOT."""


def _plane_point(ttft: float, tpot: float, concurrency: float, output_len: int,
                 num_gpus: float) -> tuple[float, float]:
    e2e = ttft + (output_len - 1) * tpot
    return (concurrency * output_len / e2e / num_gpus, 1.0 / tpot)


def serving_points(rows: Sequence[Mapping[str, Any]],
                   cases: Mapping[str, Mapping[str, Any]]) -> dict[tuple, list[ConfigPoint]]:
    """Workload -> its configurations with measured and predicted TTFT and TPOT, concurrency,
    output length and GPU count (``cases[id]``: ``concurrency``, ``num_gpus``, else the
    simulated ``sim_num_gpus``)."""
    metrics: dict[str, dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        if r["metric"] in ("ttft_s", "tpot_s"):
            metrics.setdefault(r["id"], {})[r["metric"]] = r
    out: dict[tuple, list[ConfigPoint]] = {}
    for rid, m in metrics.items():
        info = cases.get(rid) or {}
        wl = workload_of(info)
        conc = info.get("concurrency")
        gpus = info.get("num_gpus") or info.get("sim_num_gpus")
        if wl is None or len(m) < 2 or not conc or not gpus:
            continue
        vals = [m[k][side] for side in ("measured", "predicted") for k in ("ttft_s", "tpot_s")]
        if min(vals) <= 0:
            continue
        osl = wl[2]
        out.setdefault(wl, []).append(ConfigPoint(
            rid, _plane_point(m["ttft_s"]["measured"], m["tpot_s"]["measured"], conc, osl, gpus),
            _plane_point(m["ttft_s"]["predicted"], m["tpot_s"]["predicted"], conc, osl, gpus)))
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates, both coordinates maximised (equal points
    are all kept): ``search.pareto.non_dominated`` on the negated points."""
    return non_dominated(-np.asarray(points, dtype=float).reshape(-1, 2))


Points = Mapping[tuple, Sequence[ConfigPoint]]
"""``serving_points`` of a run, which the views below take precomputed when given."""


def pareto_agreement(rows: Sequence[Mapping[str, Any]],
                     cases: Mapping[str, Mapping[str, Any]], *,
                     min_configs: int = MIN_CONFIGS, points: Points | None = None
                     ) -> dict[str, Any]:
    """Measured against simulated fronts of the workloads with at least ``min_configs``
    configurations.

    Returns ``{"workloads", "configs", "measured_front", "simulated_front", "both", "recall",
    "precision", "shortfall": {"n", "median", "p10", "mean"}}`` (``recall`` / ``precision`` /
    shortfall stats ``None`` without workloads)."""
    workloads = configs = n_meas = n_sim = n_both = 0
    shortfall: list[float] = []
    for pts in (serving_points(rows, cases) if points is None else points).values():
        if len(pts) < min_configs:
            continue
        workloads += 1
        configs += len(pts)
        meas = np.asarray([p.measured for p in pts])
        front_m = set(pareto_front(meas))
        front_s = set(pareto_front([p.predicted for p in pts]))
        n_meas, n_sim, n_both = n_meas + len(front_m), n_sim + len(front_s), \
            n_both + len(front_m & front_s)
        for i in front_s:
            x, y = meas[i]
            best = meas[meas[:, 1] >= y, 0].max()
            shortfall.append(float(x / best))
    s = np.asarray(shortfall, dtype=float)
    return {
        "workloads": workloads, "configs": configs, "measured_front": n_meas,
        "simulated_front": n_sim, "both": n_both,
        "recall": n_both / n_meas if n_meas else None,
        "precision": n_both / n_sim if n_sim else None,
        "shortfall": {"n": int(s.size),
                      "median": float(np.median(s)) if s.size else None,
                      "p10": float(np.percentile(s, 10)) if s.size else None,
                      "mean": float(s.mean()) if s.size else None},
    }


def verification_capture(rows: Sequence[Mapping[str, Any]],
                         cases: Mapping[str, Mapping[str, Any]], *,
                         ks: Sequence[int] = VERIFY_TOP_K,
                         min_configs: int = MIN_CONFIGS, points: Points | None = None,
                         tpot_ratio: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Per k of ``ks``: ``{"targets", "mean", "median", "at_least_90", "missed",
    "no_candidate"}`` over the targets of the workloads with at least ``min_configs``
    configurations (``at_least_90``: fraction of targets where the verified pick reaches 90 %
    of the best; ``missed``: fraction where none of the k meets the target when measured, no
    candidate included; ``no_candidate``: fraction where no configuration is simulated to meet
    it). ``tpot_ratio`` (record id -> ``r``, 1 where absent) makes a configuration a candidate
    when its simulated TPOT x ``r`` meets the target, as a guard checks it. ``{}`` without
    workloads."""
    captured: dict[int, list[float]] = {k: [] for k in ks}
    empty: list[bool] = []
    for pts in (serving_points(rows, cases) if points is None else points).values():
        if len(pts) < min_configs:
            continue
        meas = np.asarray([p.measured for p in pts])
        pred = np.asarray([p.predicted for p in pts])
        # interactivity 1 / TPOT as the candidate test sees it: 1 / (TPOT x r)
        seen = pred[:, 1] / np.asarray([(tpot_ratio or {}).get(p.id, 1.0) for p in pts])
        order = np.argsort(-pred[:, 0], kind="stable")
        lo, hi = meas[:, 1].min(), meas[:, 1].max()
        for target in np.geomspace(lo, hi, TARGETS_PER_WORKLOAD):
            target = min(max(target, lo), hi)  # the ends exactly, despite rounding
            best = meas[meas[:, 1] >= target, 0].max()
            candidates = [i for i in order if seen[i] >= target]
            empty.append(not candidates)
            for k in ks:
                got = [meas[i, 0] for i in candidates[:k] if meas[i, 1] >= target]
                captured[k].append(max(got, default=0.0) / best)
    out: dict[str, Any] = {}
    for k, v in captured.items():
        a = np.asarray(v, dtype=float)
        if a.size:
            out[str(k)] = {"targets": int(a.size), "mean": float(a.mean()),
                           "median": float(np.median(a)),
                           "at_least_90": float((a >= 0.9).mean()),
                           "missed": float((a == 0).mean()),
                           "no_candidate": float(np.mean(empty))}
    return out


def guarded_verification(rows: Sequence[Mapping[str, Any]],
                         cases: Mapping[str, Mapping[str, Any]], *,
                         levels: Sequence[float] = VERIFY_GUARDS,
                         min_configs: int = MIN_CONFIGS, points: Points | None = None
                         ) -> dict[str, Any]:
    """``{str(level): verification_capture(...)}`` with each configuration's TPOT scaled by the
    ``r_level`` of its engine and mode's TPOT band (``validation.bands``, falling back as an
    objective's guard does), the bands computed without the configuration's own source.
    A configuration without a band keeps ``r = 1``. ``{}`` without workloads."""
    from charon_search.validation.bands import held_out_bands, source_of

    pts = serving_points(rows, cases) if points is None else points
    if not any(len(p) >= min_configs for p in pts.values()):
        return {}
    bands = held_out_bands({"records": rows, "cases": cases})
    out: dict[str, Any] = {}
    for level in levels:
        ratio: dict[str, float] = {}
        for group in pts.values():
            for p in group:
                case = cases.get(p.id) or {}
                band = bands[source_of(case)].lookup(
                    "serving_tpot", str(case.get("engine") or ""), str(case.get("mode") or ""))
                if band is not None:
                    ratio[p.id] = band.ratio(level)
        out[str(level)] = verification_capture(rows, cases, min_configs=min_configs,
                                               points=pts, tpot_ratio=ratio)
    return out


def _concordance(groups: Mapping[Any, Sequence[tuple[float, float, Any]]],
                 min_gap: float) -> dict[str, Any] | None:
    pairs = concordant = used = 0
    for vals in groups.values():
        n0 = pairs
        for (ma, pa, _), (mb, pb, _) in itertools.combinations(vals, 2):
            if abs(ma - mb) < min_gap * min(ma, mb):
                continue
            pairs += 1
            concordant += (ma < mb) == (pa < pb)
        used += pairs > n0
    if not pairs:
        return None
    return {"pairs": pairs, "concordant": concordant, "fraction": concordant / pairs,
            "groups": used}


def pairwise_concordance(rows: Sequence[Mapping[str, Any]],
                         cases: Mapping[str, Mapping[str, Any]], *,
                         min_gap: float = MIN_GAP, points: Points | None = None
                         ) -> dict[str, Any]:
    """Per metric of ``ORDERED_METRICS`` and for the derived throughput per GPU
    (``output_tokens_per_s_per_gpu``): ``{"pairs", "concordant", "fraction", "groups" (workloads
    with a counted pair), "equal_concurrency": {the same four} | None}`` over the pairs of one
    workload whose measured values differ by at least ``min_gap`` (relative to the smaller one).
    ``equal_concurrency`` keeps the pairs run at the same client concurrency: configurations
    compared under the same load (layout, GPU, engine), which a larger load does not order by
    itself."""
    # metric -> workload -> (measured, predicted, concurrency) per configuration
    by_metric: dict[str, dict[tuple, list[tuple[float, float, Any]]]] = {}

    def add(metric: str, wl: tuple, rid: str, measured: float, predicted: float) -> None:
        conc = (cases.get(rid) or {}).get("concurrency")
        by_metric.setdefault(metric, {}).setdefault(wl, []).append((measured, predicted, conc))

    for r in rows:
        wl = workload_of(cases.get(r["id"]) or {})
        if r["metric"] in ORDERED_METRICS and wl is not None and r["measured"] > 0:
            add(r["metric"], wl, r["id"], float(r["measured"]), float(r["predicted"]))
    for wl, pts in (serving_points(rows, cases) if points is None else points).items():
        for p in pts:
            add("output_tokens_per_s_per_gpu", wl, p.id, p.measured[0], p.predicted[0])
    out: dict[str, Any] = {}
    for metric, groups in by_metric.items():
        stats = _concordance(groups, min_gap)
        if stats is None:
            continue
        same: dict[tuple, list[tuple[float, float, Any]]] = {}
        for wl, vals in groups.items():
            for v in vals:
                if v[2]:
                    same.setdefault((*wl, v[2]), []).append(v)
        out[metric] = {**stats, "equal_concurrency": _concordance(same, min_gap)}
    return out


def configuration_ordering(rows: Sequence[Mapping[str, Any]],
                           cases: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{"min_gap", "min_configs", "concordance": pairwise_concordance, "pareto":
    pareto_agreement, "verify_top_k": verification_capture, "verify_guarded":
    guarded_verification}`` (``{}`` when no serving workload has two configurations). The
    workloads' points are derived once for the four views."""
    points = serving_points(rows, cases)
    conc = pairwise_concordance(rows, cases, points=points)
    pareto = pareto_agreement(rows, cases, points=points)
    if not conc and not pareto["workloads"]:
        return {}
    return {"min_gap": MIN_GAP, "min_configs": MIN_CONFIGS, "concordance": conc,
            "pareto": pareto,
            "verify_top_k": verification_capture(rows, cases, points=points),
            "verify_guarded": guarded_verification(rows, cases, points=points)}


#: Display names of the ordered metrics.
_LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT",
           "output_tokens_per_s_per_gpu": "output tokens/s per GPU (derived)"}


def ordering_lines(ordering: Mapping[str, Any]) -> list[str]:
    """Plain sentences of a ``configuration_ordering`` result for the text report of
    ``validate`` (empty for a run without serving workloads)."""
    if not ordering:
        return []
    gap = ordering["min_gap"]
    lines = []
    for metric, c in ordering["concordance"].items():
        eq = c.get("equal_concurrency")
        lines.append(
            f"{_LABELS.get(metric, metric)}: {c['fraction']:.1%} of {c['pairs']} pairs of "
            f"configurations of one workload ({c['groups']} "
            f"workload{'s' if c['groups'] != 1 else ''}, measured values >= {gap:.0%} apart) "
            "ordered as measured"
            + (f"; at equal concurrency {eq['fraction']:.1%} of {eq['pairs']}" if eq else ""))
    pareto = pareto_sentence(ordering)
    verify = verify_sentence(ordering)
    return lines + [x for x in (pareto, verify) if x]


def _capture_parts(v: Mapping[str, Any]) -> str:
    return "; ".join(f"top {k}: median {c['median']:.1%}, mean {c['mean']:.1%}, >= 90 % in "
                     f"{c['at_least_90']:.1%}, none meets the target in {c['missed']:.1%}"
                     for k, c in v.items())


def verify_sentence(ordering: Mapping[str, Any]) -> str:
    """``verification_capture`` and ``guarded_verification`` of a ``configuration_ordering``
    result in sentences."""
    v = ordering.get("verify_top_k") or {}
    if not v:
        return ""
    plain = next(iter(v.values()))
    out = (f"Verifying the simulation's best configurations for a TPOT target "
           f"({plain['targets']} targets, "
           f"{TARGETS_PER_WORKLOAD} per workload across its measured tokens/s per user) and "
           "deploying the best one that meets it reaches, of the best measured throughput per "
           f"GPU that meets it: {_capture_parts(v)}.")
    for level, g in (ordering.get("verify_guarded") or {}).items():
        if not g:
            continue
        top = next(iter(g.values()))
        out += (f" Under an objective's `guard: {level}` (a configuration counts when its "
                f"simulated TPOT x the TPOT band's r_{level}, computed without its own source, "
                "meets the target), no configuration is simulated to meet "
                f"{top['no_candidate']:.1%} of the targets (unguarded "
                f"{plain.get('no_candidate', 0.0):.1%}), and the top pick misses "
                f"{_pick_missed(top):.1%} of the others (unguarded {_pick_missed(plain):.1%}): "
                f"{_capture_parts(g)}.")
    return out


def _pick_missed(c: Mapping[str, Any]) -> float:
    """Of the targets some configuration is simulated to meet, the fraction the verified picks
    miss (``verification_capture``'s ``missed`` without its ``no_candidate``)."""
    empty = c.get("no_candidate", 0.0)
    return (c["missed"] - empty) / (1.0 - empty) if empty < 1.0 else 0.0


def pareto_sentence(ordering: Mapping[str, Any]) -> str:
    """The Pareto agreement of a ``configuration_ordering`` result in one sentence (empty
    without workloads)."""
    p = ordering.get("pareto") or {}
    if not p.get("workloads"):
        return ""
    sf = p["shortfall"]
    return (f"Pareto fronts of output tokens/s per GPU against tokens/s per user (1 / TPOT), "
            f"per workload with at least {ordering['min_configs']} configurations "
            f"({p['workloads']} workloads, {p['configs']} configurations): the simulated front "
            f"holds {p['both']} of the {p['measured_front']} configurations of the measured "
            f"front (recall {p['recall']:.1%}) and {p['simulated_front']} in all (precision "
            f"{p['precision']:.1%}). Verified on hardware, the simulated-front configurations "
            f"reach a median {sf['median']:.1%} (mean {sf['mean']:.1%}, p10 {sf['p10']:.1%}) "
            "of the best measured throughput per GPU at the same or a higher measured "
            "interactivity.")
