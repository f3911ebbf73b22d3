"""Run a capacity sweep (sweeps/*.yaml) into a partitioned Parquet dataset.

Output: OUT/sweep=<name>/model=<model>/gpu=<label>/date=<date>/part-<space>-<objective>.parquet
(all trials, with boolean `pareto` (on the front) and `pareto_representative` columns; partition
values URI-encoded); read with charon_search.search.read_sweep(OUT) or
pyarrow.dataset.dataset(OUT, partitioning="hive"). Ctrl-C keeps the stored trials: re-running the
same command with the same --date resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from charon_search.cli._common import prepare_out_folder, prepare_outputs

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", help="sweep YAML (sweeps/<name>.yaml) or a name in sweeps/")
    parser.add_argument("--out", required=True,
                        help="dataset root folder (made if missing; Parquet partitions and "
                             "the resumable studies under _studies/)")
    parser.add_argument("--workers", type=int, default=None,
                        help="Ray worker actors (default: the sweep's `workers`, else 1)")
    parser.add_argument("--trials", type=int, default=None,
                        help="trials per combination, >= 1 (default: the sweep's)")
    parser.add_argument("--date", default=None,
                        help="partition label of this run (default: the sweep's or today UTC)")
    parser.add_argument("--guard", type=float, default=None, metavar="Q",
                        help="check every run's TTFT, TPOT, step-time and memory constraints "
                             "at quantile Q (0.5, 0.75, 0.9 or 0.95) of the validated error "
                             "(overrides the objectives' `guard`)")
    parser.add_argument("--ray-address", default=None,
                        help="existing Ray cluster (auto, ray://host:10001); default: an "
                             "embedded local Ray")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="write the run summaries as JSON to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from charon_search.search.study import SearchInterrupted, check_search_numbers
    from charon_search.search.sweep import load_sweep, run_sweep

    check_search_numbers(trials=args.trials, workers=args.workers, flags=True)
    prepare_outputs(args, {"--json": "json"})
    prepare_out_folder("--out", args.out)
    spec = load_sweep(args.sweep)
    guard = None
    if args.guard is not None:
        from charon_search.search.objective import check_guard

        guard = check_guard(args.guard, "`--guard`")
    try:
        summaries = run_sweep(spec, args.out, workers=args.workers, trials=args.trials,
                              date=args.date, ray_address=args.ray_address,
                              progress=not args.quiet, guard=guard)
    except SearchInterrupted as e:  # Ctrl-C: the combination's stored trials are kept
        print(f"charon-search sweep: {e}", file=sys.stderr)
        return 130
    for s in summaries:
        print(f"{s['sweep']} model={s['model']} gpu={s['gpu']} date={s['date']}: "
              f"{s['num_trials']} trials, {s['num_feasible']} feasible, "
              f"pareto {s['pareto_size']}, {s['wall_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(summaries, indent=2) + "\n")
    return 0
