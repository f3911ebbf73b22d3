"""Compare simulator predictions with published and measured results (accuracy check).

Reads records in the schema of ``charon_search/data/validation/SCHEMA.md`` (YAML) and measured
serving rows in the column layout of aiconfigurator-core's ``silicon_sample.csv`` (CSV). Without
files it runs the validation data shipped with the package. Prints a table per record (id, metric,
measured, predicted, signed error) and summaries per kind, source and metric group; records that
cannot be expressed are listed with the reason.

    charon-search validate --kind training --json validate.json
    charon-search validate my_records.yaml --ids megatron_sc21_t1_1.7b --html report.html
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", type=Path,
                        help="record YAML files and/or silicon CSV files (default: shipped data)")
    parser.add_argument("--json", type=Path, default=None, dest="json_out",
                        help="write {records, skipped, summary, ...} as JSON")
    parser.add_argument("--html", type=Path, default=None, help="write an HTML report")
    parser.add_argument("--kind", choices=("training", "serving"), default=None)
    parser.add_argument("--limit", type=int, default=None, help="validate the first N records")
    parser.add_argument("--ids", nargs="+", default=None, help="only these record ids")
    parser.add_argument("--rows", type=int, default=200,
                        help="per-record rows printed (0 = none, -1 = all)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    from charon_search.cli._common import silence_tracing_noise

    silence_tracing_noise()
    from charon_search.validation import (
        default_files,
        load_files,
        render_html,
        render_text,
        run_validation,
        select_records,
    )

    files = args.files or default_files()
    records = select_records(load_files(files), kind=args.kind, ids=args.ids, limit=args.limit)

    def progress(i: int, n: int, rec) -> None:  # type: ignore[no-untyped-def]
        if not args.quiet and (i % 25 == 0 or i == n - 1):
            print(f"[{i + 1}/{n}] {rec.id}", file=sys.stderr, flush=True)

    result = run_validation(records, progress=progress)
    max_rows = None if args.rows < 0 else args.rows
    print(render_text(result, max_rows=max_rows))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result.to_json(), indent=1, default=str))
        print(f"wrote {args.json_out}")
    if args.html:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(render_html(result))
        print(f"wrote {args.html}")
    return 0
