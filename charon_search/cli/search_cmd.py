"""Search a space for the Pareto front of an objective (Optuna samplers on Ray workers).

Writes OUT/trials.parquet, OUT/pareto.parquet, OUT/pareto.html and the Optuna study (default a
journal file OUT/study.journal that `optuna-dashboard OUT/study.journal` serves, after
`pip install optuna-dashboard`). Re-running with
the same --out/--storage and study name resumes the study up to --trials trials in total: the
sampler is reseeded from --seed and the trials stored, so it proposes new points, and a space or
objective edited since is refused (its trials would be mixed in one front) unless the study holds
no trial yet. Ctrl-C writes the outputs of the trials stored so far and says how many there are.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from charon_search.cli._common import prepare_out_folder, prepare_outputs

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from charon_search.search.study import SAMPLERS

    parser.add_argument("space", help="space YAML (spaces/<name>.yaml) or a name in spaces/")
    parser.add_argument("--objective", required=True,
                        help="objective YAML (objectives/<name>.yaml) or a name in objectives/")
    parser.add_argument("--guard", type=float, default=None, metavar="Q",
                        help="check the objective's TTFT, TPOT, step-time and memory "
                             "constraints at quantile Q (0.5, 0.75, 0.9 or 0.95) of the "
                             "validated error instead of at the prediction; overrides the "
                             "objective file's `guard`")
    parser.add_argument("--trials", type=int, default=200,
                        help="total trials the study should hold, >= 1 (default 200)")
    parser.add_argument("--workers", type=int, default=1,
                        help="Ray worker actors (default 1; 0 = evaluate in this process)")
    parser.add_argument("--out", default=None,
                        help="output folder (default runs/<space name>)")
    parser.add_argument("--sampler", default="nsga2", choices=SAMPLERS.names(),
                        help="multi-objective sampler (default nsga2; grid = every valid point)")
    parser.add_argument("--storage", default=None,
                        help="Optuna storage: sqlite:///f.db, postgresql://..., a *.journal file "
                             "(default OUT/study.journal)")
    parser.add_argument("--study-name", default=None, help="study name (default: space name)")
    parser.add_argument("--ray-address", default=None,
                        help="existing Ray cluster (auto, ray://host:10001); default RAY_ADDRESS "
                             "or an embedded local Ray")
    parser.add_argument("--seed", type=int, default=0,
                        help="sampler seed, 0 to 2**32 - 1 (default 0)")
    parser.add_argument("--population-size", type=int, default=None,
                        help="NSGA-II population, >= 2 (default 50)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="write a JSON summary (num_trials, num_feasible, num_infeasible, "
                             "pareto_size, wall_s, trials_per_s, workers, nodes_used)")
    parser.add_argument("--no-html", action="store_true", help="skip pareto.html")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from charon_search.search import SearchOptions, load_objective, load_space, run_search
    from charon_search.search.study import SearchInterrupted, check_search_numbers

    check_search_numbers(trials=args.trials, seed=args.seed,
                         population_size=args.population_size, workers=args.workers, flags=True)
    prepare_outputs(args, {"--json": "json"})
    space = load_space(args.space)
    objective = load_objective(args.objective)
    if args.guard is not None:
        import dataclasses

        from charon_search.search.objective import check_guard

        objective = dataclasses.replace(objective, guard=check_guard(args.guard, "`--guard`"))
    out = args.out or str(Path("runs") / space.name)
    prepare_out_folder("--out", out)
    try:
        res = run_search(space, objective, SearchOptions(
            trials=args.trials, workers=args.workers, sampler=args.sampler, seed=args.seed,
            storage=args.storage, study_name=args.study_name, ray_address=args.ray_address,
            out_dir=out, progress=not args.quiet, population_size=args.population_size,
            html=not args.no_html))
    except SearchInterrupted as e:  # Ctrl-C: the stored trials' outputs are written
        print(f"charon-search search: {e}", file=sys.stderr)
        return 130
    summary = res.summary()
    print_summary(res, objective, out)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def print_summary(res, objective, out: str) -> None:  # type: ignore[no-untyped-def]
    """Counts and the Pareto front as a Rich table on stdout."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    console.print(
        f"study [bold]{res.study_name}[/] ({res.storage}): {res.num_trials} trials, "
        f"{res.num_feasible} feasible, {res.num_infeasible} infeasible "
        f"({res.num_invalid} invalid, {res.num_errors} errors); {res.num_new_trials} new in "
        f"{res.wall_s:.1f} s ({res.trials_per_s:.1f} trials/s, {res.num_evaluations} simulated, "
        f"{res.num_memo_hits} memo hits) "
        + (f"on {res.workers} worker(s), {res.nodes_used} node(s)" if res.workers else
           "in this process"))
    if objective.guard is not None:
        console.print(
            f"guard {objective.guard:g}: constraints on TTFT, TPOT, step time and memory were "
            f"checked at the {objective.guard:g} quantile of the validated error "
            "(`guarded.<metric>` columns of trials.parquet)")
    if not res.pareto:
        console.print("no feasible trial: no Pareto front")
        if res.num_trials and res.num_invalid == res.num_trials:
            why = next((r.get("prune_reason") for r in res.rows if r.get("prune_reason")), "")
            console.print(f"every trial broke one of the space's rules (e.g. {why}); check "
                          "its parameter ranges against its `constraints`", markup=False)
        return
    varied = [k for k in res.config_keys if len({repr(r.get(k)) for r in res.rows}) > 1]
    table = Table(title=f"Pareto front ({len(res.pareto)} configs) -> {out}")
    for k in ["trial_number", *varied, *objective.metrics]:
        table.add_column(k)
    for r in res.pareto[:30]:
        table.add_row(*[_fmt(r.get(k)) for k in ["trial_number", *varied, *objective.metrics]])
    console.print(table)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
