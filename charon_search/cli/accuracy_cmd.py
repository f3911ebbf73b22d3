"""Write the accuracy report (markdown + log-log scatter PNGs) from `validate --json` output.

    charon-search validate --json validate.json
    charon-search accuracy --from validate.json --out docs/accuracy.md \\
        --calibration docs/calibration/*.yaml   # + each calibration's leave-one-source-out table
    charon-search accuracy --from validate.json --out docs/accuracy.md \\
        --calibration docs/calibration/*.yaml \\
        --bands charon_search/data/validation/error_bands.json   # + the validated error bands

Without `--calibration` the report has no calibration sections. The shipped docs/accuracy.md
is regenerated in one step by `python scripts/accuracy_report.py --workers 2` (validates every
record, then runs the last command above).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from charon_search.cli._common import prepare_outputs

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", type=Path, required=True,
                        help="JSON written by `charon-search validate --json`")
    parser.add_argument("--out", type=Path, required=True,
                        help="the markdown report to write, e.g. docs/accuracy.md")
    parser.add_argument("--calibration", type=Path, nargs="+", action="extend", default=None,
                        help="YAML files written by `charon-search calibrate` (each adds its "
                             "leave-one-source-out table)")
    parser.add_argument("--img-dir", type=Path, default=None,
                        help="where the PNGs go (default: <out dir>/img)")
    parser.add_argument("--bands", type=Path, default=None,
                        help="also write the validated error bands (quantiles of measured / "
                             "predicted per metric family, engine and mode) as JSON here; the "
                             "shipped copy is charon_search/data/validation/error_bands.json")


def run(args: argparse.Namespace) -> int:
    from charon_search.errors import ConfigError
    from charon_search.validation import read_result
    from charon_search.validation.accuracy import check_calibration, render_accuracy

    prepare_outputs(args, {"--out": "out", "--bands": "bands"},
                    inputs={"--from": "source", "--calibration": "calibration"})
    result, data = read_result(args.source, "--from")
    img_dir = args.img_dir or args.out.parent / "img"
    import os

    rel = os.path.relpath(img_dir, args.out.parent)
    import yaml

    cal = []
    for path in args.calibration or []:
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise ConfigError(f"--calibration {str(path)!r}: {e}") from e
        check_calibration(doc, f"--calibration {str(path)!r}")
        cal.append(doc)
    text = render_accuracy(result, img_dir=img_dir, img_rel=rel, calibration=cal,
                           command=f"charon-search accuracy --from {args.source} "
                                   f"--out {args.out}" + "".join(
                                       f" --calibration {p}" for p in args.calibration or [])
                                   + (f" --bands {args.bands}" if args.bands else ""),
                           generated_at=str(data.get("generated_at") or ""))
    args.out.write_text(text + "\n")
    print(f"wrote {args.out} and plots under {img_dir}")
    if args.bands:
        import json

        from charon_search.validation.bands import compute_bands

        args.bands.write_text(json.dumps(compute_bands(data), indent=1) + "\n")
        print(f"wrote {args.bands}")
    return 0
