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
3. Throughput: configurations evaluated per second with 1 and 2 Ray workers on the same subset
   (num_gpus 16 and 32, ~1,080 configs, grid order), in steady state: counted from the moment
   every worker returned its first result (workers trace models and load predictors before
   their first batch), by worker-side end times. The 1- and 2-worker runs are made back to back,
   ``--rate-repeats`` times in alternating order; the speedup is the median of the pairs'
   ratios. Reported with each run: the rate including start-up, the median wall time and the
   mean process CPU of one evaluation inside a worker, the driver's CPU per trial, the workers'
   busy fraction (driver-bound when well below 1) and the load average (other processes share
   the cores). A CPU-time bound on the speedup, 2·cpu1/(cpu2 + driver) (what two workers and
   the driver sharing 2 cores allow when one worker alone has a core to itself), is printed
   beside the measured one; it does not depend on the machine's load. Two controls bound what
   any search can reach here: the machine's own 1 -> 2 process scaling on a pure-Python loop,
   and the *workload's*: the same evaluations in one vs two independent processes (no Ray, no
   driver, no storage; split by affinity key, warmed up first), which also shows what the
   simulator's memory traffic loses when two processes share the cache and memory bus.

Last printed line: one JSON object with ``hypervolume_ratio_at_10pct``, ``..._25pct``,
``..._50pct``, ``trials_per_s_1_worker``, ``trials_per_s_2_workers`` (+ details).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_search.py [--quick]

Run time on a 2-core machine: ``--quick --seeds 1 --rate-repeats 1`` (the smallest setting)
about 1 min 40 s; the full run is several times longer (the exhaustive grid is 2,025
simulations, the throughput subset ~1,080 per run, 2 x ``--rate-repeats`` runs). Studies are
written under ``--out``, or a temporary folder removed at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _bench import config_errors, positive_int, temp_dir  # noqa: E402

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
    ap.add_argument("--seeds", type=positive_int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="num_gpus <= 16 only: a fast check with fewer than 2,000 points")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rate-only", action="store_true",
                    help="throughput only (skip the exhaustive run and the sampler replay)")
    ap.add_argument("--rate-repeats", type=positive_int, default=3,
                    help="pairs of 1- and 2-worker throughput runs (median reported)")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    from charon_search.search import (
        SAMPLERS,
        SearchSpace,
        load_objective,
    )

    with config_errors(ap):
        SAMPLERS.get(args.sampler)
    spec = dict(SPACE)
    if args.quick:
        spec["params"] = {**spec["params"],
                          "num_gpus": {"type": "log_int", "low": 8, "high": 16, "base": 2}}
    space = SearchSpace.from_dict(spec, path="benchmarks/bench_search.py")
    objective = load_objective(ROOT / "objectives" / "train-fast-cheap.yaml")
    out = Path(args.out or temp_dir("bench-search-"))
    print(f"space: {space.num_points()} grid points", flush=True)

    quality: dict = {f"hypervolume_ratio_at_{p}pct": None for p in (10, 25, 50)}
    if not args.rate_only:
        quality = _quality(space, objective, args, out)

    # 3. throughput, 1 and 2 workers, same subset, back to back, repeated (the cores are shared)
    sub = _rate_space(space, args.quick)
    n_sub = len(sub.enumerate_valid())
    gpus = sorted({cfg["num_gpus"] for _, cfg in sub.enumerate_valid()})
    print(f"throughput subset: {n_sub} valid configs (num_gpus {gpus}), "
          f"{args.rate_repeats} pair(s) of runs", flush=True)
    runs: dict[int, list[dict]] = {1: [], 2: []}
    ceilings: list[float] = []
    for rep in range(args.rate_repeats):
        ceilings.append(_machine_scaling())
        print(f"  pair {rep + 1}: the machine's own 1 -> 2 process scaling (pure-Python loop): "
              f"{ceilings[-1]:.2f}x", flush=True)
        for w in ((1, 2) if rep % 2 == 0 else (2, 1)):  # alternate the order against drift
            m = _measure_rate(sub, objective, w, n_sub, out / f"rate-{w}-{rep}")
            runs[w].append(m)
            print(f"  pair {rep + 1}, {w} worker(s): {m['rate']:.1f}/s after warm-up "
                  f"({m['overall']:.1f}/s incl. start-up); per eval {m['med_eval_ms']:.1f} ms "
                  f"wall, {m['cpu_ms_per_eval']:.1f} ms worker CPU; driver "
                  f"{m['driver_cpu_ms_per_trial']:.2f} ms CPU/trial; busy "
                  f"{m['busy']:.2f}; load {m['load_before']:.2f}", flush=True)
    pair_ratios = [r2["rate"] / r1["rate"] for r1, r2 in zip(runs[1], runs[2])]
    rate1 = float(np.median([m["rate"] for m in runs[1]]))
    rate2 = float(np.median([m["rate"] for m in runs[2]]))
    speedup = float(np.median(pair_ratios))
    # What the CPU time alone allows when the driver and both workers share 2 cores and one
    # worker has a core to itself: 2 * cpu(1 worker) / (cpu per eval of 2 workers + driver),
    # at most 2 (Raylet and GCS, ~0.3 ms per trial here, are not counted).
    w1 = float(np.median([m["cpu_ms_per_eval"] for m in runs[1]]))
    w2 = float(np.median([m["cpu_ms_per_eval"] for m in runs[2]]))
    d2 = float(np.median([m["driver_cpu_ms_per_trial"] for m in runs[2]]))
    cpu_bound = min(2.0, 2 * w1 / (w2 + d2))
    loads = [m["load_before"] for w in runs for m in runs[w]]
    print(f"speedup 1 -> 2 workers: {speedup:.2f}x (median of {len(pair_ratios)} pair(s): "
          f"{', '.join(f'{x:.2f}' for x in pair_ratios)}; {rate1:.1f} -> {rate2:.1f} configs/s; "
          f"load average {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores); target "
          f">= 1.7: {'met' if speedup >= 1.7 else 'NOT met'}", flush=True)
    print(f"CPU-time bound on the speedup: {cpu_bound:.2f}x (worker CPU per eval {w1:.1f} ms "
          f"alone, {w2:.1f} ms with 2 workers; driver {d2:.2f} ms CPU per trial)", flush=True)
    ceiling = float(np.median(ceilings))
    print(f"machine ceiling: two independent CPU-bound processes run {ceiling:.2f}x as fast as "
          f"one (median of {', '.join(f'{x:.2f}' for x in ceilings)}); the search reaches "
          f"{speedup / ceiling:.0%} of it", flush=True)
    workload, wl_rate1 = _workload_scaling(sub)
    print(f"workload ceiling: the same {n_sub} evaluations in two independent processes (no "
          f"Ray, no driver, no storage; split by affinity key) run {workload:.2f}x as fast as "
          f"in one ({wl_rate1:.1f}/s); the search reaches {speedup / workload:.0%} of it",
          flush=True)
    autogroup = _autogroup_enabled()
    if autogroup and max(loads) > 1.0:
        # Linux autogroup shares the CPU between sessions: Ray's workers (process-group leaders,
        # so they cannot start sessions of their own) are in this process's session, and next
        # to another session's CPU-bound job that session gets ~1 core however many workers run.
        print("note: sched_autogroup is on and other processes were running (load > 1): the "
              "workers share one session's CPU share, so the measured speedup understates "
              "what 2 workers do on an idle machine; see the CPU-time bound", flush=True)

    result = {
        **quality,
        "trials_per_s_1_worker": rate1,
        "trials_per_s_2_workers": rate2,
        "speedup_2_workers": speedup,
        "speedup_2_workers_per_pair": pair_ratios,
        "speedup_cpu_time_bound": cpu_bound,
        "machine_two_process_scaling": ceiling,
        "machine_two_process_scaling_per_pair": ceilings,
        "workload_two_process_scaling": workload,
        "workload_trials_per_s_1_process": wl_rate1,
        "trials_per_s_incl_warmup": {str(w): float(np.median([m["overall"] for m in runs[w]]))
                                     for w in runs},
        "median_eval_ms_in_worker": {str(w): float(np.median([m["med_eval_ms"] for m in runs[w]]))
                                     for w in runs},
        "worker_cpu_ms_per_eval": {"1": w1, "2": w2},
        "driver_cpu_ms_per_trial": {str(w): float(np.median(
            [m["driver_cpu_ms_per_trial"] for m in runs[w]])) for w in runs},
        "worker_busy_fraction": {str(w): float(np.median([m["busy"] for m in runs[w]]))
                                 for w in runs},
        "load_average_1min_during_throughput": loads,
        "load_average_1min_after": os.getloadavg()[0],
        "sched_autogroup_enabled": autogroup,
        "sampler": args.sampler, "seeds": args.seeds, "rate_repeats": args.rate_repeats,
        "num_grid_points": space.num_points(), "throughput_subset_size": n_sub,
        "evaluator": "training (charon_search.training.simulate_training)",
    }
    print(json.dumps(result))


def _quality(space, objective, args, out: Path) -> dict:  # type: ignore[no-untyped-def]
    """Sections 1 and 2: the exhaustive front (2 workers) and the sampler's hypervolume."""
    from charon_search.search import (
        SearchOptions,
        config_key,
        normalized_hypervolume,
        run_search,
    )
    from charon_search.search.evaluators import TableEvaluator

    valid = space.enumerate_valid()
    print(f"{len(valid)} valid configurations", flush=True)
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
    hv25 = float(np.mean(ratios[25]))
    verdict = "met" if hv25 >= 0.95 else "NOT met"
    print(f"hypervolume after 25 % of the evaluations: {hv25:.3f} of the exhaustive front's "
          f"(mean of {args.seeds} seed(s)); target >= 0.95: {verdict}", flush=True)

    return {
        "hypervolume_ratio_at_10pct": float(np.mean(ratios[10])),
        "hypervolume_ratio_at_25pct": float(np.mean(ratios[25])),
        "hypervolume_ratio_at_50pct": float(np.mean(ratios[50])),
        "hypervolume_ratio_min_over_seeds": {str(p): float(np.min(v))
                                             for p, v in ratios.items()},
        "trials_asked_for_budget_mean": {str(p): float(np.mean(v))
                                         for p, v in trials_used.items()},
        "num_valid": n_valid, "num_feasible": full.num_feasible,
        "exhaustive_front_size": len(full.pareto), "exhaustive_wall_s_2_workers": full.wall_s,
    }


def _spin(n: int) -> float:
    """Wall seconds of a fixed pure-Python loop (the control workload)."""
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i
    return time.perf_counter() - t0


def _machine_scaling(n: int = 8_000_000) -> float:
    """Throughput of two concurrent CPU-bound processes over one, on this machine, now.

    The control for the search's speedup: with shared or SMT virtual cores (or neighbours on the
    host), two independent processes reach less than 2x, and no search can beat that.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        pool.map(_spin, [n // 8, n // 8])  # start both interpreters before timing
        one = pool.apply(_spin, (n,))
        two = max(pool.map(_spin, [n, n]))
    return 2 * one / two


def _eval_chunk(cfgs: list[dict]) -> tuple[float, int]:
    """In a fresh process: warm the training evaluator on ``cfgs``, then evaluate them all in
    order; wall seconds of the evaluations (not the warm-up) and their count."""
    from charon_search.search.evaluators import EVALUATORS
    from charon_search.search.worker import evaluate_config

    evaluators = {"training": EVALUATORS.get("training")()}
    evaluators["training"].warm_up(cfgs)
    t0 = time.perf_counter()
    for cfg in cfgs:
        evaluate_config(evaluators, "training", cfg)
    return time.perf_counter() - t0, len(cfgs)


def _workload_scaling(sub) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The simulator workload's own 1 -> 2 process scaling, without Ray, driver or storage.

    One process evaluates every config of the throughput subset; then two processes evaluate
    half each, split by affinity key (every graph context built once, as in the search's best
    case), concurrently. Both warm up first (untimed, like the search's steady state). Returns
    (scaling, configs/s of one process). What two workers of any search can reach here: the
    simulator's memory traffic shares the cache and memory bus, which a pure-Python loop
    (``_machine_scaling``) does not show.
    """
    import multiprocessing as mp

    from charon_search.search.evaluators import EVALUATORS

    cfgs = [dict(cfg) for _, cfg in sub.enumerate_valid()]
    key = EVALUATORS.get("training").affinity_key
    keys = sorted({key(c) for c in cfgs}, key=repr)
    half = {k for i, k in enumerate(keys) if i % 2 == 0}
    parts = [[c for c in cfgs if key(c) in half], [c for c in cfgs if key(c) not in half]]
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        wall1, n1 = pool.apply(_eval_chunk, (cfgs,))
    with ctx.Pool(2) as pool:
        res = pool.map(_eval_chunk, parts)
    rate1 = n1 / wall1
    rate2 = sum(n for _, n in res) / max(w for w, _ in res)
    return rate2 / rate1, rate1


def _autogroup_enabled() -> bool | None:
    """Whether Linux shares the CPU between sessions (``kernel.sched_autogroup_enabled``)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return None


#: GPU counts of the throughput subset (grid order, every valid point once).
_RATE_GPUS = (16, 32)


def _rate_space(space, quick: bool):  # type: ignore[no-untyped-def]
    """The throughput subset: the space restricted to ``_RATE_GPUS`` (16 only with --quick)."""
    import dataclasses

    lo, hi = (16, 16) if quick else (min(_RATE_GPUS), max(_RATE_GPUS))
    params = tuple(dataclasses.replace(p, low=lo, high=hi) if p.name == "num_gpus" else p
                   for p in space.params)
    return dataclasses.replace(space, params=params)


def _measure_rate(sub, objective, workers: int, n: int,  # type: ignore[no-untyped-def]
                  out: Path) -> dict:
    """One grid run over ``sub`` with ``workers`` Ray workers; steady-state measures.

    Steady state starts once every worker has returned its first result (workers warm up,
    i.e. trace and load predictors, before their first batch) and ends at the last result, by
    worker-side end times (a batch's records reach the driver together). Also: the median wall
    time and the mean process CPU of one evaluation inside a worker, the workers' busy
    fraction (~1 = the driver keeps every worker fed) and the driver's CPU per trial in the
    window (its process CPU between the first and last record it received there).
    """
    from charon_search.search import SearchOptions, run_search

    if out.exists():  # a fresh study, not a resumed one
        shutil.rmtree(out)
    stamps: list[tuple[float, str, float, float, float, float]] = []

    def on_record(rec: dict) -> None:
        stamps.append((rec.get("eval_end_unix_s", time.time()), rec["worker_id"],
                       rec["eval_wall_s"], rec.get("eval_cpu_s") or 0.0, time.time(),
                       time.process_time()))

    load = os.getloadavg()[0]
    r = run_search(sub, objective, SearchOptions(
        trials=n, workers=workers, sampler="grid", out_dir=str(out), html=False),
        on_record=on_record)
    stamps.sort()
    first = {}
    for st in stamps:
        first.setdefault(st[1], st[0])
    t_k, t_last = max(first.values()), stamps[-1][0]
    window = [st for st in stamps if st[0] > t_k]
    counted = [min(st[2], st[0] - t_k) for st in window]  # the part inside the window
    by_arrival = sorted(window, key=lambda st: st[4])
    drv = (by_arrival[-1][5] - by_arrival[0][5]) / max(len(by_arrival) - 1, 1)
    return {
        "rate": len(window) / (t_last - t_k),
        "overall": r.num_evaluations / r.wall_s,
        "med_eval_ms": 1e3 * float(np.median([st[2] for st in window])),
        "cpu_ms_per_eval": 1e3 * float(np.mean([st[3] for st in window])),
        "driver_cpu_ms_per_trial": 1e3 * drv,
        "busy": sum(counted) / (workers * (t_last - t_k)),
        "load_before": load,
    }


def _strip(table: dict) -> dict:
    """Keep only the evaluator's record fields (drop study bookkeeping) for replay."""
    drop = {"trial_number", "uid", "memo_hit", "valid", "constraint_violation", "family"}
    return {k: {f: v for f, v in r.items() if f not in drop} for k, r in table.items()}


if __name__ == "__main__":
    main()
