"""Regenerate ``docs/accuracy.md``: validate training records and a serving subset, then render.

The full ``charon-search validate`` (every silicon row) takes ~25 minutes on 2 cores; this report
covers every training record and every H100/H200 silicon row (aggregated and disaggregated) of a
model in the catalog, plus the published serving records, in about 8 minutes::

    .venv/bin/python scripts/accuracy_report.py            # writes docs/accuracy.md, docs/img/
    .venv/bin/python scripts/accuracy_report.py --systems h100_sxm --json /tmp/v.json
    .venv/bin/python scripts/accuracy_report.py --workers 2    # simulations on 2 Ray actors

The calibration tables come from ``docs/calibration/*.yaml``, written by ``charon-search
calibrate`` (``docs/calibration/README.md`` has the commands).
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
    ap.add_argument("--systems", nargs="+", default=["h100_sxm", "h200_sxm"],
                    help="silicon `system` values to include")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "accuracy.md")
    ap.add_argument("--json", type=Path, default=REPO / "validate_merged.json",
                    help="where the merged validate JSON goes")
    ap.add_argument("--calibration-dir", type=Path, default=REPO / "docs" / "calibration",
                    help="`charon-search calibrate` outputs whose leave-one-source-out tables "
                         "the report includes (every *.yaml there)")
    ap.add_argument("--workers", type=int, default=0,
                    help="Ray worker actors for the simulations (0 = in this process)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from charon_search.validation import load_files, merge_json, select_records
    from charon_search.validation.names import Unexpressible, resolve_model_name
    from charon_search.validation.records import default_files

    records = load_files(default_files())
    training = select_records(records, kind="training")

    def in_catalog(rec) -> bool:
        try:
            resolve_model_name(rec.model.get("catalog") or rec.model.get("name"))
        except Unexpressible:
            return False
        return True

    serving = [r for r in select_records(records, kind="serving")
               if r.origin != "silicon"
               or (r.hardware.get("gpu") in args.systems and in_catalog(r))]
    n_sil = sum(r.origin == "silicon" for r in serving)
    n_all = sum(r.origin == "silicon" for r in records)
    parts = [
        (_validate(training, "training", args.workers),
         f"Training: all {len(training)} training records of `published-dev.yaml` "
         "(`charon-search validate --kind training`)"),
        (_validate(serving, "serving", args.workers),
         f"Serving: the {len(serving) - n_sil} published serving records plus the {n_sil} of "
         f"{n_all} silicon rows on {', '.join(args.systems)} whose model is in the catalog "
         "(aggregated and disaggregated; `scripts/accuracy_report.py`). Not covered here: "
         "other systems' rows and models outside the catalog; the full run is "
         "`charon-search validate` with no filter"),
    ]
    merged = merge_json(parts)
    args.json.write_text(json.dumps(merged, indent=1) + "\n")
    from charon_search.cli import main as cli

    os.chdir(REPO)  # the report quotes its command: keep repository-relative paths in it
    rel = [os.path.relpath(p, REPO) for p in (args.json, args.out)]
    cal = [os.path.relpath(p, REPO) for p in sorted(args.calibration_dir.glob("*.yaml"))]
    return cli(["accuracy", "--from", rel[0], "--out", rel[1],
                *(["--calibration", *cal] if cal else [])])


if __name__ == "__main__":
    raise SystemExit(main())
