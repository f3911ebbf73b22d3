"""Search quality and speed on an exhaustively enumerable training space (real simulator).

Space: Llama-3.1-8B training layouts on 8-64 H100 (DGX H100, 400G IB): GPU count, TP, PP,
micro-batch, ZeRO stage, recompute, sequence parallel -> 2,025 valid configurations. Objective:
``objectives/train-fast-cheap.yaml`` (step time vs cost per token, peak memory <= device).

1. Every valid configuration is evaluated once through the real training simulator (grid sampler,
   2 Ray workers): the exhaustive Pareto front and its hypervolume.
2. The sampler (NSGA-II by default; ``--sampler``) replays against those results (in-process
   table lookup, so it costs no simulation) with a budget of 50 % of the valid configurations;
   the hypervolume of the feasible front after the first 10 %, 25 % and 50 % of *evaluations*
   (distinct valid configurations simulated; invalid proposals and memo hits are free) is
   divided by the exhaustive hypervolume. Losses are normalised by the exhaustive feasible set's
   ideal and nadir points, reference point 1.1. Mean over ``--seeds`` seeds.
3. Throughput: configurations evaluated per second with 1 and 2 Ray workers, on the same
   subset (the 16-GPU slice, grid order), in steady state (counted from the moment every worker
   finished its first evaluation, by worker-side end times, i.e. after tracing/warm-up); the
   overall rate including warm-up is reported too, with the median time of one evaluation inside
   a worker and the workers' busy fraction (contention vs driver-bound). The machine's load
   average is recorded: other processes share the cores.

Last printed line: one JSON object with ``hypervolume_ratio_at_10pct``, ``..._25pct``,
``..._50pct``, ``trials_per_s_1_worker``, ``trials_per_s_2_workers`` (+ details).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_search.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPACE = {
    "name": "bench-llama8b-training",
    "evaluator": "training",
    "fixed": {"model": "llama-3.1-8b", "cluster": "dgx-h100-ib400", "seq_len": 4096,
              "global_batch_size": 128, "precision": "bf16", "cp": 1, "schedule": "1f1b"},
    "params": {
        "num_gpus": {"type": "log_int", "low": 8, "high": 64, "base": 2},
        "tp": {"type": "log_int", "low": 1, "high": 8, "base": 2},
        "pp": {"type": "log_int", "low": 1, "high": 4, "base": 2},
        "micro_batch_size": {"type": "log_int", "low": 1, "high": 4, "base": 2},
        "zero_stage": {"type": "categorical", "choices": [0, 1, 3]},
        "recompute": {"type": "categorical", "choices": ["none", "selective", "full"]},
        "sequence_parallel": {"type": "categorical", "choices": [True, False]},
    },
    "derived": {"dp": "num_gpus / (tp * pp * cp)"},
    "normalize": ["pipeline_schedule", "sequence_parallel_needs_tp"],
    "constraints": ["degrees_divide_world_size", "tp_within_node", "tp_divides_heads",
                    "pp_divides_layers", "batch_divides_micro_dp", "micro_batches_fill_pipeline",
                    "gpus_fit_cluster", "layout_valid"],
    "family": ["recompute", "zero_stage"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sampler", default="nsga2")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="num_gpus <= 16 only: a fast check with fewer than 2,000 points")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    from charon_search.search import (
        SearchOptions,
        SearchSpace,
        config_key,
        load_objective,
        normalized_hypervolume,
        run_search,
    )
    from charon_search.search.evaluators import TableEvaluator

    spec = dict(SPACE)
    if args.quick:
        spec["params"] = {**spec["params"],
                          "num_gpus": {"type": "log_int", "low": 8, "high": 16, "base": 2}}
    space = SearchSpace.from_dict(spec, path="benchmarks/bench_search.py")
    objective = load_objective(ROOT / "objectives" / "train-fast-cheap.yaml")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-search-"))
    valid = space.enumerate_valid()
    print(f"space: {space.num_points()} grid points, {len(valid)} valid", flush=True)

    # 1. exhaustive, 2 workers
    t0 = time.perf_counter()
    full = run_search(space, objective, SearchOptions(
        trials=len(valid), workers=2, sampler="grid", out_dir=str(out / "exhaustive"),
        html=False))
    print(f"exhaustive: {full.num_trials} trials ({full.num_feasible} feasible, "
          f"{full.num_errors} errors), front {len(full.pareto)}, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    cfg_keys = full.config_keys
    table = {config_key({k: r[k] for k in cfg_keys if k in r}): r for r in full.rows}
    feas = [objective.minimized(objective.values(r)) for r in full.rows
            if r.get("feasible") and objective.values(r) is not None]
    lo, hi = np.min(feas, axis=0), np.max(feas, axis=0)
    front_losses = [objective.minimized(objective.values(r)) for r in full.pareto]
    hv_full = normalized_hypervolume(front_losses, lower=lo, upper=hi)

    # 2. sampler replay against the exhaustive table
    n_valid = len(valid)
    budget = {p: max(1, round(p / 100 * n_valid)) for p in (10, 25, 50)}
    ratios: dict[int, list[float]] = {p: [] for p in budget}
    trials_used: dict[int, list[int]] = {p: [] for p in budget}
    for seed in range(args.seeds):
        res = run_search(space, objective, SearchOptions(
            trials=3 * n_valid, workers=0, sampler=args.sampler, seed=seed,
            max_evaluations=budget[50]), evaluator=TableEvaluator(_strip(table)))
        rows = sorted(res.rows, key=lambda r: r["trial_number"])
        evaluated = [r for r in rows if r.get("valid") and not r.get("memo_hit")]
        for p, k in budget.items():
            first = evaluated[:k]
            losses = [objective.minimized(objective.values(r)) for r in first
                      if r.get("feasible") and objective.values(r) is not None]
            hv = normalized_hypervolume(losses, lower=lo, upper=hi) if losses else 0.0
            ratios[p].append(hv / hv_full)
            last = first[-1]["trial_number"] + 1 if first else 0
            trials_used[p].append(last)
        print(f"seed {seed}: " + ", ".join(f"{p}%={ratios[p][-1]:.3f}" for p in budget),
              flush=True)

    # 3. throughput, 1 and 2 workers, same subset
    sub = space.with_fixed(num_gpus=16)
    n_sub = len(sub.enumerate_valid())
    rates, overall, busy, med_eval = {}, {}, {}, {}
    load_before = os.getloadavg()[0]
    for w in (1, 2):
        stamps: list[tuple[float, str, float]] = []
        rate_dir = out / f"rate-{w}"
        if rate_dir.exists():  # a fresh study, not a resumed one
            shutil.rmtree(rate_dir)
        r = run_search(sub, objective, SearchOptions(
            trials=n_sub, workers=w, sampler="grid", out_dir=str(rate_dir), html=False),
            on_record=lambda rec, s=stamps: s.append((rec.get("eval_end_unix_s", time.time()),
                                                      rec["worker_id"], rec["eval_wall_s"])))
        overall[w] = r.num_evaluations / r.wall_s
        # steady state: from the moment every worker has returned its first (warm-up) result
        seen: set[str] = set()
        k = 0
        for k, (_, wid, _e) in enumerate(stamps):  # noqa: B007
            seen.add(wid)
            if len(seen) == w:
                break
        # worker-side end times (a batch's records reach the driver together): count the
        # evaluations that finished after every worker had finished its first one
        stamps.sort()
        t_k, t_last = max(min(t for t, x, _ in stamps if x == wid) for wid in seen), stamps[-1][0]
        counted = [min(e, t - t_k) for t, _, e in stamps if t > t_k]  # the part in the window
        rates[w] = len(counted) / (t_last - t_k)
        # steady-state diagnostics: how long one evaluation took inside a worker (grows when
        # the workers compete for cores) and the fraction of the window the workers spent
        # evaluating (~1 = the driver keeps every worker busy; well below 1 = driver-bound)
        evals = counted
        med_eval[w] = 1e3 * float(np.median(evals))
        busy[w] = sum(evals) / (w * (t_last - t_k))
        print(f"{w} worker(s): {r.num_evaluations} evaluations in {r.wall_s:.1f} s = "
              f"{overall[w]:.2f}/s overall, {rates[w]:.2f}/s after warm-up", flush=True)

    result = {
        "hypervolume_ratio_at_10pct": float(np.mean(ratios[10])),
        "hypervolume_ratio_at_25pct": float(np.mean(ratios[25])),
        "hypervolume_ratio_at_50pct": float(np.mean(ratios[50])),
        "trials_per_s_1_worker": rates[1],
        "trials_per_s_2_workers": rates[2],
        "speedup_2_workers": rates[2] / rates[1],
        "trials_per_s_incl_warmup": {"1": overall[1], "2": overall[2]},
        "median_eval_ms_in_worker": {"1": med_eval[1], "2": med_eval[2]},
        "worker_busy_fraction": {"1": busy[1], "2": busy[2]},
        "load_average_1min_before_throughput": load_before,
        "load_average_1min_after": os.getloadavg()[0],
        "sampler": args.sampler, "seeds": args.seeds,
        "hypervolume_ratio_min_over_seeds": {str(p): float(np.min(v)) for p, v in ratios.items()},
        "trials_asked_for_budget_mean": {str(p): float(np.mean(v))
                                         for p, v in trials_used.items()},
        "num_valid": n_valid, "num_grid_points": space.num_points(),
        "num_feasible": full.num_feasible, "exhaustive_front_size": len(full.pareto),
        "exhaustive_wall_s_2_workers": full.wall_s, "throughput_subset_size": n_sub,
        "evaluator": "training (charon_search.training.simulate_training)",
    }
    print(json.dumps(result))


def _strip(table: dict) -> dict:
    """Keep only the evaluator's record fields (drop study bookkeeping) for replay."""
    drop = {"trial_number", "uid", "memo_hit", "valid", "constraint_violation", "family"}
    return {k: {f: v for f, v in r.items() if f not in drop} for k, r in table.items()}


if __name__ == "__main__":
    main()
