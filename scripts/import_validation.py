"""Copy the validation data shipped with the package from ``/work/shared`` (run once per update).

The package and its tests never read ``/work/shared``; this script copies

- ``validation/published-dev.yaml``, ``SCHEMA.md``, ``SOURCES.md`` (published measurements), and
- ``data/peers/aiconfigurator-core/systems/silicon_sample.csv`` (measured serving points of NVIDIA
  aiconfigurator-core 0.12.0, Apache-2.0) with its license and an attribution ``NOTICE``

into ``charon_search/data/validation/``, and checks that the YAML loads with the package's loader.

The package copy of ``published-dev.yaml`` carries amendments: launch facts completed from a
record's own sources (each names the file it read in ``read_from`` and says so in ``notes``).
A re-import therefore leaves an existing copy that differs from the shared one in place and
prints the difference; ``--overwrite-amended`` replaces it (re-apply the amendments by hand).

Usage: ``python scripts/import_validation.py [--shared /work/shared] [--out DIR]`` (``--out``
writes elsewhere, e.g. to compare a fresh import with the package copy; an empty folder gets the
shared ``published-dev.yaml`` without the amendments).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEST = REPO / "charon_search" / "data" / "validation"

NOTICE = """\
silicon_sample.csv
==================
Copied unchanged from the PyPI wheel `aiconfigurator-core` 0.12.0 (NVIDIA), file
`aiconfigurator_core/systems/silicon_sample.csv` (a deterministic sample of 3131 of the 5221
published end-to-end measured serving points). License: Apache-2.0 (`License-Expression:
Apache-2.0` in the wheel's METADATA); the license text is in `LICENSE.Apache-2.0.txt` next to this
file.
Copyright NVIDIA CORPORATION & AFFILIATES.

published-dev.yaml, SCHEMA.md, SOURCES.md
=========================================
Published measurements transcribed from papers, vendor documentation and framework benchmark pages;
every record names its source (title, url, the exact files/tables read); see SOURCES.md.
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it."""
    return str(path.relative_to(REPO)) if path.resolve().is_relative_to(REPO) else str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path("/work/shared"))
    parser.add_argument("--out", type=Path, default=DEST,
                        help=f"folder to write (default {DEST.relative_to(REPO)})")
    parser.add_argument("--overwrite-amended", action="store_true",
                        help="replace an amended published-dev.yaml with the shared copy")
    args = parser.parse_args()
    dest = args.out
    val = args.shared / "validation"
    peers = args.shared / "data" / "peers" / "aiconfigurator-core"
    copies = {
        val / "published-dev.yaml": dest / "published-dev.yaml",
        val / "SCHEMA.md": dest / "SCHEMA.md",
        val / "SOURCES.md": dest / "SOURCES.md",
        peers / "systems" / "silicon_sample.csv": dest / "silicon_sample.csv",
        peers / "LICENSE.Apache-2.0.txt": dest / "LICENSE.Apache-2.0.txt",
    }
    dest.mkdir(parents=True, exist_ok=True)
    for src, dst in copies.items():
        if (dst.name == "published-dev.yaml" and dst.exists() and not args.overwrite_amended
                and dst.read_bytes() != src.read_bytes()):
            diff = difflib.unified_diff(src.read_text().splitlines(), dst.read_text().splitlines(),
                                        str(src), _shown(dst), lineterm="")
            print("\n".join(diff))
            print(f"kept the amended {_shown(dst)} (--overwrite-amended replaces it)")
            continue
        shutil.copyfile(src, dst)
        dst.chmod(0o644)
        print(f"{src} -> {_shown(dst)} ({dst.stat().st_size} bytes, sha {_sha(dst)})")
    (dest / "NOTICE").write_text(NOTICE)

    from charon_search.validation.records import load_records, load_silicon_csv

    records = load_records(dest / "published-dev.yaml")
    rows = load_silicon_csv(dest / "silicon_sample.csv")
    print(f"checked: {len(records)} records (variants expanded), {len(rows)} silicon rows")


if __name__ == "__main__":
    main()
