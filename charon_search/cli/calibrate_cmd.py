"""Fit unpublished physical parameters on development records (leave-one-source-out report).

Fits the parameters of ``charon_search.validation.calibration.PARAMETERS`` (GEMM and HBM
efficiency where no profile covers an op, collective bandwidth scale, overlap slowdown,
per-iteration CPU overhead) as ONE vector shared by all clusters, on development records only
(confidence high/medium, fully specified), and reports train vs held-out error per source. No
per-record factors. Writes the fitted calibration blocks with provenance to a YAML file;
``--write DIR`` also updates the ``calibration:`` blocks of ``DIR/<cluster>.yaml``.

    charon-search calibrate --kind training --params compute_efficiency overlap_compute_slowdown

Without ``--params`` it fits the cluster-level parameters of ``--kind`` (the ``calibration:``
block): a GPU-level factor (``gpu.*``) fitted as one value would replace each GPU's own shipped
value, so those are fitted only when named. ``--holdout-by gpu`` holds out one GPU at a time
instead of one source (a serving engine's parameter: all its rows come from one or two sources).

    charon-search calibrate --kind serving --params disagg_handoff_trtllm_s --holdout-by gpu
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from charon_search.validation.calibration import HOLDOUT_GROUPS, PARAMETERS

    parser.add_argument("files", nargs="*", type=Path,
                        help="record YAML / silicon CSV files (default: shipped data)")
    parser.add_argument("--kind", choices=("training", "serving"), default="training",
                        help="which records to fit on (default: training)")
    parser.add_argument("--params", nargs="+", default=None, choices=sorted(PARAMETERS),
                        metavar="PARAM",
                        help="parameters to fit (default: the cluster-level ones affecting "
                             "--kind; GPU-level factors such as compute_efficiency are fitted "
                             "only when named, since one shared value replaces every GPU's "
                             "own); one of: " + ", ".join(sorted(PARAMETERS)))
    parser.add_argument("--ids", nargs="+", default=None, help="only these record ids")
    parser.add_argument("--limit", type=int, default=None,
                        help="first N records (serving; default: all)")
    parser.add_argument("--systems", nargs="+", default=None, metavar="SYSTEM",
                        help="silicon serving rows only from these `system` values (e.g. "
                             "h100_sxm h200_sxm); published records are kept")
    parser.add_argument("--sweeps", type=int, default=2,
                        help="coordinate-descent sweeps (default: 2)")
    parser.add_argument("--workers", type=int, default=0,
                        help="Ray worker actors simulating records in parallel, kept for the "
                             "whole calibration (0 = in this process)")
    parser.add_argument("--ray-address", default=None,
                        help="existing Ray cluster for --workers (default: embedded local Ray)")
    parser.add_argument("--no-loso", action="store_true",
                        help="skip the leave-one-source-out report")
    parser.add_argument("--holdout-by", choices=HOLDOUT_GROUPS, default="source",
                        help="what the held-out report leaves out, one at a time: a source "
                             "(default), or a GPU (a silicon row's system), for parameters of "
                             "a serving engine whose rows come from one source")
    parser.add_argument("--out", type=Path, default=Path("calibration.yaml"),
                        help="YAML output (default: calibration.yaml)")
    parser.add_argument("--cache", type=Path, default=None, metavar="FILE",
                        help="JSON-lines store of finished record simulations, so an "
                             "interrupted run resumes (default: <cache dir>/calibrate/"
                             "<kind>.jsonl; entries go stale with any change to the package)")
    parser.add_argument("--write", type=Path, default=None, metavar="SPEC_DIR",
                        help="also update calibration: blocks of SPEC_DIR/<cluster>.yaml, "
                             "when the fit beats the shipped specs and (unless --no-loso) the "
                             "records have two or more held-out groups and the fit lowers the "
                             "held-out error of most of them; parameters no record's "
                             "prediction depends on keep their shipped values")


def run(args: argparse.Namespace) -> int:
    from charon_search.cli._common import prepare_outputs, silence_tracing_noise

    silence_tracing_noise()
    prepare_outputs(args, {"--out": "out"}, inputs={"FILE": "files", "--cache": "cache"})
    from charon_search.errors import ConfigError
    from charon_search.validation import default_files, load_files, select_records
    from charon_search.validation.calibration import check_parameters

    # Every flag is checked before the first simulation, not after an hour of them.
    if args.sweeps < 1:
        raise ConfigError(f"`--sweeps` must be >= 1 (coordinate-descent sweeps), but got "
                          f"{args.sweeps}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"`--limit` must be >= 1 (the first N records), but got {args.limit}")
    if args.workers < 0:
        raise ConfigError(f"--workers must be >= 0 (0 = in this process), but got "
                          f"{args.workers}")
    if args.write is not None and not args.write.is_dir():
        raise ConfigError(f"`--write` {str(args.write)!r} must be an existing folder of cluster "
                          "YAML files (<cluster>.yaml), e.g. charon_search/cluster_specs")
    if args.params:
        check_parameters(args.params, args.kind)

    records = select_records(load_files(args.files or default_files()), kind=args.kind,
                             ids=args.ids)
    if args.systems:
        known = sorted({str(r.hardware.get("gpu")) for r in records if r.origin == "silicon"})
        if unknown := sorted(set(args.systems) - set(known)):
            raise ConfigError(f"--systems: no silicon rows on {unknown}; the rows' systems are "
                              f"{known}")
        records = [r for r in records
                   if r.origin != "silicon" or r.hardware.get("gpu") in args.systems]
    if args.limit is not None:
        records = records[: args.limit]
    from tqdm import tqdm

    from charon_search.cache import cache_dir

    # One memo for the baseline, the fit and the held-out fits: each (parameter vector,
    # record) pair is simulated once, and kept in a store that survives an interruption.
    store = args.cache or cache_dir("calibrate") / f"{args.kind}.jsonl"
    try:  # fail now, not after the first hour of simulations
        store.parent.mkdir(parents=True, exist_ok=True)
        store.open("a").close()
    except OSError as e:
        raise ConfigError(f"--cache {str(store)!r}: cannot write the store ({e.strerror}); "
                          "give a writable file path") from e
    bar = tqdm(desc="calibrate", unit="sim", file=sys.stderr, disable=None)
    executor = None
    if args.workers:
        from charon_search.search.worker import make_executor

        executor = make_executor(args.workers, address=args.ray_address)
    try:
        return _calibrate(args, records, store, bar, executor)
    finally:
        if executor is not None:
            executor.close()


def _calibrate(args: argparse.Namespace, records: list[Any], store: Path, bar: Any,
               executor: Any) -> int:
    """The baseline, the fit and the held-out fits (``run``'s body once its records, store,
    progress bar and optional worker pool are set up)."""
    import yaml

    from charon_search.cache import package_fingerprint
    from charon_search.errors import ConfigError
    from charon_search.validation.calibration import (
        MemoizedEvaluate,
        calibration_document,
        default_evaluate,
        default_parameters,
        development_records,
        fit_parameters,
        holdout_group,
        leave_one_source_out,
        shipped_values,
        write_cluster_specs,
        write_refusal,
    )
    from charon_search.validation.translate import to_case

    evaluate = MemoizedEvaluate(default_evaluate(progress=lambda i, n, rec: bar.update(1),
                                                 executor=executor),
                                store=store, fingerprint=package_fingerprint())
    candidates = development_records(records)
    if not candidates:
        raise ConfigError(f"no development record (kind {args.kind!r}, confidence high or "
                          f"medium, fully specified) among the {len(records)} selected "
                          "record(s): nothing to fit")
    baseline = evaluate(candidates, {})  # the cluster specs as shipped
    dev = development_records(records, baseline)
    dev = [r for r in dev if r.id in {row["id"] for row in baseline.rows}]
    if not dev:
        raise ConfigError(f"none of the {len(candidates)} development record(s) of kind "
                          f"{args.kind!r} is expressible (skipped: {len(baseline.skipped)}, "
                          "see `charon-search validate` for the reasons): nothing to fit")
    groups = sorted({holdout_group(r, args.holdout_by) for r in dev})
    if args.write and not args.no_loso and len(groups) < 2:
        # Before the fit, not after it: --write could only refuse (write_refusal).
        raise ConfigError(f"`--write` needs a held-out check, but the {len(dev)} development "
                          f"record(s) all come from one {args.holdout_by} ({groups[0]}), so "
                          f"leave-one-{args.holdout_by}-out has no held-out fit; pass "
                          "--no-loso to write anyway")
    names = args.params or default_parameters(args.kind)
    clusters = {}
    for r in dev:
        case = to_case(r)
        clusters[case.cluster.name] = case.cluster
    # Each parameter starts from its shipped value where the records' clusters agree on one.
    start = shipped_values(names, list(clusters.values()))
    bar.write(f"fitting {names} on {len(dev)} development records (store {store}: the "
              f"baseline reused {evaluate.reused} of its {len(candidates)} record "
              "simulations)", file=sys.stdout)
    fit = fit_parameters(dev, names, sweeps=args.sweeps, evaluate=evaluate, start=start)
    bar.write(f"fit: {json.dumps(fit.values)}  median |log err| {fit.objective:.4f} "
              f"(shipped specs {fit.uncalibrated_objective:.4f}; "
              f"{fit.evaluations} parameter vectors, {evaluate.pairs} record simulations)",
              file=sys.stdout)
    loso = [] if args.no_loso else leave_one_source_out(dev, names, sweeps=args.sweeps,
                                                        evaluate=evaluate, by=args.holdout_by,
                                                        start=start)
    bar.close()
    for row in loso:
        print(f"  held out {row['held_out']:<44} train {row['train_median_abs_log_error']:.3f}"
              f"  test {row['test_median_abs_log_error']:.3f}  (uncalibrated "
              f"{row['test_median_abs_log_error_uncalibrated']:.3f})")
    if loso:
        print(f"leave-one-{args.holdout_by}-out: {len(loso)} held-out fits; {evaluate.pairs} "
              "record simulations in all")
    elif not args.no_loso:
        print(f"calibrate: warning: the records come from one {args.holdout_by} only: no "
              f"held-out fit checks the values (--no-loso skips the check)", file=sys.stderr)
    if fit.no_effect:
        print(f"no record's prediction moves with {', '.join(fit.no_effect)} across "
              f"{'its' if len(fit.no_effect) == 1 else 'their'} grid: not fitted, "
              "the shipped value stays")
    doc = calibration_document(fit, clusters, loso, kind=args.kind,
                               holdout_by=args.holdout_by)
    args.out.write_text(yaml.safe_dump(doc, sort_keys=False, width=99))
    print(f"wrote {args.out}")
    held_out_by = None if args.no_loso else args.holdout_by
    if args.write and (refusal := write_refusal(fit, loso, held_out_by=held_out_by)):
        print(f"calibrate: --write: cluster specs not changed: {refusal} (the fit is in "
              f"{args.out})", file=sys.stderr)
    elif args.write:
        written = write_cluster_specs(doc, args.write)
        for path in written:
            print(f"updated calibration block of {path}")
        missing = [f"{name}.yaml" for name in sorted(set(doc["clusters"])
                                                     - {p.stem for p in written})]
        if missing:
            # The fit is in --out already; say which spec files were not there to update.
            print(f"calibrate: --write {str(args.write)!r} has no {', '.join(missing)}: "
                  f"{'that' if len(missing) == 1 else 'those'} calibration block(s) not "
                  f"written (they are in {args.out})", file=sys.stderr)
            if not written:
                return 1
    return 0
