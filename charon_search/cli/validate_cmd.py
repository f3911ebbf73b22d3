"""Compare simulator predictions with published and measured results (accuracy check).

Reads records in the schema of ``charon_search/data/validation/SCHEMA.md`` (YAML) and measured
serving rows in the column layout of aiconfigurator-core's ``silicon_sample.csv`` (CSV). Without
files it runs the validation data shipped with the package. Prints a table per record (id, metric,
measured, predicted, signed error) and summaries per kind, source and metric group; records that
cannot be expressed are listed with the reason.

    charon-search validate --kind training --json validate.json
    charon-search validate my_records.yaml --ids megatron_sc21_t1_1.7b --html report.html
    charon-search validate --explain --ids megatron_sc21_t1_1.7b
    charon-search validate --workers 2 --json validate.json   # records on 2 Ray actors
    charon-search validate --kind serving --group-by model cluster engine --rows 0
    charon-search validate --kind training --baseline validate.json   # what moved since then
    charon-search validate --from new.json --baseline old.json --group-by engine
    charon-search validate --json new.json --baseline old.json --max-regression 0.5  # a gate

``--baseline OLD.json`` compares this run with an earlier ``--json`` output, row by row: median,
p90, bias and summed |error| per metric group before and after, how many rows got better or
worse, and the largest improvements and regressions (``validation.compare``). ``--from RUN.json``
reads a saved run instead of simulating, to re-summarize it or compare it.

``--explain`` prints, for each selected record (name them with ``--ids``), what the simulator did
to reach its prediction: a training step's breakdown, cost sources and the largest operators of
one layer of each block (with the TFLOP/s each GEMM and attention kernel reaches), or a serving
row's engine facts, iteration mix and largest prompt- and decode-step operators
(``validation.explain``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]

#: Records ``--explain`` accepts at once (each is a full simulation with every iteration kept).
MAX_EXPLAIN = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", type=Path,
                        help="record YAML files and/or silicon CSV files (default: shipped data)")
    parser.add_argument("--json", type=Path, default=None, dest="json_out",
                        help="write {records, skipped, summary, ...} as JSON")
    parser.add_argument("--html", type=Path, default=None, help="write an HTML report")
    parser.add_argument("--kind", choices=("training", "serving"), default=None,
                        help="only training or only serving records (default both)")
    parser.add_argument("--limit", type=int, default=None,
                        help="validate the first N records (default all)")
    parser.add_argument("--ids", nargs="+", default=None, help="only these record ids")
    parser.add_argument("--rows", type=int, default=200,
                        help="per-record rows printed (0 = none, -1 = all; default 200)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--group-by", nargs="+", default=None, metavar="FIELD",
                        help="also print the errors per combination of these record fields "
                             "(model, cluster, engine, gpu, source, kind, origin, confidence, "
                             "fully_specified; serving rows also mode, engine_version, "
                             "measured_month (YYYY-MM) and precision), e.g. --group-by model "
                             "cluster engine; --json gets them as summary.by_fields")
    parser.add_argument("--workers", type=int, default=0,
                        help="Ray worker actors simulating records in parallel (0 = in this "
                             "process; same results either way)")
    parser.add_argument("--ray-address", default=None,
                        help="existing Ray cluster for --workers (default: embedded local Ray)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="JSON",
                        help="an earlier `validate --json` output: also print how each metric "
                             "group's errors moved against it and the largest movers")
    parser.add_argument("--from", dest="from_json", type=Path, default=None, metavar="JSON",
                        help="summarize a saved `validate --json` output instead of simulating "
                             "(with --baseline: compare two saved runs)")
    parser.add_argument("--top", type=int, default=10,
                        help="largest improvements and regressions listed with --baseline "
                             "(default 10)")
    parser.add_argument("--max-regression", type=float, default=None, metavar="POINTS",
                        help="with --baseline: exit 1 when a metric group's median or p90 "
                             "|error| grew by more than POINTS percentage points, when a record "
                             "the baseline predicted is now skipped, or when no row matches the "
                             "baseline (a gate for scheduled re-validation)")
    parser.add_argument("--explain", action="store_true",
                        help="show how each selected record's prediction arises (step breakdown "
                             "and per-layer operators, or iteration mix and decode-step "
                             "operators) instead of the table; "
                             f"at most {MAX_EXPLAIN} records, chosen with --ids")


def run(args: argparse.Namespace) -> int:
    from charon_search.cli._common import prepare_outputs, silence_tracing_noise
    from charon_search.errors import ConfigError
    from charon_search.validation import read_result, render_html, render_text
    from charon_search.validation.report import render_grouped
    from charon_search.validation.stats import check_group_fields, grouped_summary

    silence_tracing_noise()
    prepare_outputs(args, {"--json": "json_out", "--html": "html"},
                    inputs={"FILE": "files", "--from": "from_json", "--baseline": "baseline"})
    # Every input is checked before the simulations, not after them.
    if args.group_by:
        check_group_fields(args.group_by)
        args.group_by = list(dict.fromkeys(args.group_by))  # `model model` is one column
    if args.explain:
        extra = [name for name, on in (("--baseline", args.baseline), ("--from", args.from_json),
                                       ("--html", args.html), ("--group-by", args.group_by),
                                       ("--max-regression", args.max_regression is not None))
                 if on]
        if extra:
            raise ConfigError(f"`--explain` prints how each record's prediction arises, so it "
                              f"takes no {extra[0]} (run `validate` without --explain for that)")
    if args.top < 0:
        raise ConfigError(f"`--top` must be >= 0, but got {args.top}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"`--limit` must be >= 1 (validate the first N records), but got "
                          f"{args.limit}")
    if args.rows < -1:
        raise ConfigError(f"`--rows` must be >= 0 (0 = none) or -1 (all), but got {args.rows}")
    if args.max_regression is not None and not (
            args.baseline and math.isfinite(args.max_regression) and args.max_regression >= 0):
        raise ConfigError("`--max-regression` needs `--baseline` and a finite value >= 0 "
                          f"(percentage points), but got {args.max_regression} "
                          f"{'with' if args.baseline else 'without'} a baseline")
    baseline = read_result(args.baseline, "--baseline")[0] if args.baseline else None
    if args.from_json:
        chosen = [name for name, on in (("record files", args.files), ("--ids", args.ids),
                                        ("--kind", args.kind), ("--limit", args.limit),
                                        ("--explain", args.explain),
                                        ("--workers", args.workers),
                                        ("--ray-address", args.ray_address)) if on]
        if chosen:
            raise ConfigError(f"`--from` re-reads a saved run and simulates nothing, so it takes "
                              f"no {chosen[0]} (select and simulate the records with `validate "
                              "--json`)")
        result = read_result(args.from_json, "--from")[0]
    else:
        records = _select(args)
        if args.explain:
            return _explain(records, args)
        result = _simulate(records, args)
    max_rows = None if args.rows < 0 else args.rows
    print(render_text(result, max_rows=max_rows))
    if args.group_by:
        grouped = grouped_summary(result.rows, result.cases, args.group_by)
        result.summary["by_fields"] = grouped
        print(render_grouped(grouped))
    worse: list[str] = []
    if baseline is not None:
        from charon_search.validation.compare import compare_runs, regressions, render_comparison

        comparison = compare_runs(baseline, result, group_by=args.group_by or (),
                                  top=args.top)
        result.summary["against_baseline"] = {"baseline": str(args.baseline), **comparison}
        print()
        print(render_comparison(comparison, baseline=str(args.baseline)))
        if args.max_regression is not None:
            worse = regressions(comparison, args.max_regression)
            result.summary["against_baseline"]["regressions"] = worse
            for line in worse:
                print(f"regression: {line}", file=sys.stderr)
    if args.json_out:
        args.json_out.write_text(json.dumps(result.to_json(), indent=1, default=str))
        print(f"wrote {args.json_out}")
    if args.html:
        args.html.write_text(render_html(result))
        print(f"wrote {args.html}")
    return 1 if worse else 0


def _select(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from charon_search.errors import ConfigError
    from charon_search.validation import default_files, load_files, select_records

    files = args.files or default_files()
    loaded = load_files(files)
    if not loaded:  # an empty selection would print empty tables and pass a scheduled check
        raise ConfigError(f"no record in {', '.join(map(str, files))}: nothing to validate")
    records = select_records(loaded, kind=args.kind, ids=args.ids, limit=args.limit)
    if not records:
        named = [r for r in loaded
                 if not args.ids or r.id in args.ids or r.parent_id in args.ids]
        kinds = sorted({r.kind for r in named})
        raise ConfigError(f"`--kind {args.kind}` selects none of the {len(named)} record(s)"
                          + (" named by --ids" if args.ids else "")
                          + f"; their kinds: {kinds}")
    return records


def _simulate(records, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from charon_search.validation import run_validation

    def progress(i: int, n: int, rec) -> None:  # type: ignore[no-untyped-def]
        if not args.quiet and (i % 25 == 0 or i == n - 1):
            print(f"[{i + 1}/{n}] {rec.id}", file=sys.stderr, flush=True)

    return run_validation(records, progress=progress, workers=args.workers,
                          address=args.ray_address)


def _explain(records, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from charon_search.errors import ConfigError
    from charon_search.validation import Unexpressible, to_case
    from charon_search.validation.explain import explain_case, render_explanation
    from charon_search.validation.runner import check_record_names

    if not records:
        raise ConfigError("`--explain` found no record: name them with `--ids` (ids are in the "
                          "first column of `charon-search validate`)")
    if len(records) > MAX_EXPLAIN:
        raise ConfigError(f"`--explain` takes at most {MAX_EXPLAIN} records, but {len(records)} "
                          "are selected: name them with `--ids`")
    out = []
    for rec in records:
        try:
            check_record_names(rec)
            exp = explain_case(to_case(rec))
        except Unexpressible as e:
            print(f"explain {rec.id}: not expressible: {e}")
            continue
        out.append(exp)
        print(render_explanation(exp))
        print()
    if args.json_out:
        args.json_out.write_text(json.dumps({"explanations": out}, indent=1, default=str))
        print(f"wrote {args.json_out}")
    return 0
