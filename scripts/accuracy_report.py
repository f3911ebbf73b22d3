"""Regenerate ``docs/accuracy.md``: validate every record, then render.

Every training record and every serving record (the published ones and all silicon rows) are
validated, in two merged runs, about 5 minutes on 2 cores with ``--workers 2``; ``--systems``
and ``--catalog-only`` narrow the serving rows for a quicker partial report::

    .venv/bin/python scripts/accuracy_report.py --workers 2   # writes docs/accuracy.md, docs/img/
    .venv/bin/python scripts/accuracy_report.py --systems h100_sxm h200_sxm --catalog-only \
        --json /tmp/v.json --out /tmp/accuracy.md

It also rewrites the shipped validated error bands (``charon_search/data/validation/
error_bands.json``, ``charon-search accuracy --bands``) from the same run, so that they and the
report's "Validated error bands" table agree.

The calibration tables come from ``docs/calibration/*.yaml``, written by ``charon-search
calibrate`` (``docs/calibration/README.md`` has the commands). When the JSON it overwrites
exists, the run ends with how every metric group moved against it (``validate --baseline``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]


def _validate(records, label: str, workers: int = 0) -> dict:
    from charon_search.cli._common import silence_tracing_noise
    from charon_search.validation import run_validation

    silence_tracing_noise()
    bar = tqdm(total=len(records), desc=label, unit="rec", file=sys.stderr)

    def progress(i, n, rec):
        bar.update(1)

    res = run_validation(records, progress=progress, workers=workers)
    bar.close()
    return res.to_json()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", nargs="+", default=None,
                    help="silicon `system` values to include (default: every system)")
    ap.add_argument("--catalog-only", action="store_true",
                    help="only silicon rows whose model is in the catalog (the others are "
                         "reported as not expressible)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "accuracy.md")
    ap.add_argument("--json", type=Path, default=REPO / "validate_merged.json",
                    help="where the merged validate JSON goes")
    ap.add_argument("--calibration-dir", type=Path, default=REPO / "docs" / "calibration",
                    help="`charon-search calibrate` outputs whose leave-one-source-out tables "
                         "the report includes (every *.yaml there)")
    ap.add_argument("--workers", type=int, default=0,
                    help="Ray worker actors for the simulations (0 = in this process)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="do not compare with the JSON this run overwrites")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from charon_search.validation import load_files, merge_json, select_records
    from charon_search.validation.names import Unexpressible, resolve_model_name
    from charon_search.validation.records import default_files

    records = load_files(default_files())
    known = sorted({str(r.hardware.get("gpu")) for r in records if r.origin == "silicon"})
    unknown = sorted(set(args.systems or ()) - set(known))
    if unknown:
        print(f"error: `--systems` must be among {known}, but got {unknown}", file=sys.stderr)
        return 2
    training = select_records(records, kind="training")

    def in_catalog(rec) -> bool:
        try:
            resolve_model_name(rec.model.get("catalog") or rec.model.get("name"))
        except Unexpressible:
            return False
        return True

    serving = [r for r in select_records(records, kind="serving")
               if r.origin != "silicon"
               or ((args.systems is None or r.hardware.get("gpu") in args.systems)
                   and (not args.catalog_only or in_catalog(r)))]
    n_sil = sum(r.origin == "silicon" for r in serving)
    n_all = sum(r.origin == "silicon" for r in records)
    if n_sil == n_all:
        scope = (f"Serving: all {len(serving) - n_sil} published serving records and all "
                 f"{n_all} silicon rows (aggregated and disaggregated; "
                 "`charon-search validate --kind serving`)")
    else:
        where = f" on {', '.join(args.systems)}" if args.systems else ""
        which = " whose model is in the catalog" if args.catalog_only else ""
        scope = (f"Serving: the {len(serving) - n_sil} published serving records plus the "
                 f"{n_sil} of {n_all} silicon rows{where}{which} (aggregated and "
                 "disaggregated; `scripts/accuracy_report.py`). Not covered here: the other "
                 "rows; the full run is `charon-search validate` with no filter")
    parts = [
        (_validate(training, "training", args.workers),
         f"Training: all {len(training)} training records of `published-dev.yaml` "
         "(`charon-search validate --kind training`)"),
        (_validate(serving, "serving", args.workers), scope),
    ]
    merged = merge_json(parts)
    baseline = None
    if args.json.exists() and not args.no_baseline:
        from charon_search.validation import read_result

        baseline = read_result(args.json, "--json (the previous run)")[0]
    args.json.write_text(json.dumps(merged, indent=1) + "\n")
    from charon_search.cli import main as cli

    os.chdir(REPO)  # the report quotes its command: keep repository-relative paths in it
    rel = [os.path.relpath(p, REPO) for p in (args.json, args.out)]
    cal = [os.path.relpath(p, REPO) for p in sorted(args.calibration_dir.glob("*.yaml"))]
    rc = cli(["accuracy", "--from", rel[0], "--out", rel[1], "--bands",
              os.path.relpath(REPO / "charon_search" / "data" / "validation" / "error_bands.json",
                              REPO),
              *(["--calibration", *cal] if cal else [])])
    if baseline is not None:
        from charon_search.validation.compare import compare_runs, render_comparison

        print(render_comparison(compare_runs(baseline, merged),
                                baseline=f"the previous {rel[0]}"))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
