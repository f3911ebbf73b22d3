"""Speed of `charon-search validate`: loading, translation, a fixed slice end to end, and
the first ``--parallel-records`` serving records in one process against ``--workers`` Ray
actors (``run_validation(..., workers=N)``), with a check that both give identical rows.

Cache states, stated in the output:

* slices: the first run in this process is the warm-up (traces, cost tables; disk cache as
  found); the timed run is warm in memory.
* parallel comparison: both sides start in fresh processes (cold in memory; the pool's time
  includes starting Ray and its workers). Their disk cache (``$CHARON_CACHE_DIR``: traced graphs,
  trained predictors) is, with ``--disk-cache as-found`` (default), the one the user has: warm
  if validate has run before. The in-process side runs first, so what it adds to the disk cache
  the workers then read; the count of such entries is printed (the speedup is then overstated).
  ``--disk-cache cold`` gives each side its own new empty temporary cache (both trace and train
  everything they need: the same work), removed at exit.

The comparison is NaN-aware (a NaN equals a NaN). When the rows differ the script prints the
first differing record and field and exits with status 1. It also fingerprints the package's
code and data before, during and after both runs: if another process edits the sources while
the benchmark runs, the two sides may simulate different code, which is reported as the cause.

Prints one JSON object on the last line:
``{"load_s", "translate_s", "num_records", "cases": [{"name", "records", "wall_s"}],
"parallel": {"records", "rows", "workers", "disk_cache", "in_process_s", "workers_s", "speedup",
"identical", "differing_rows", "first_difference", "code_changed_during_run"}}``.

    OMP_NUM_THREADS=1 python benchmarks/bench_validate.py --workers 2 --parallel-records 240

``--parallel-records 0`` skips the comparison (about 15 s); 240 records take 2-3 minutes on
two cores with a warm disk cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

warnings.simplefilter("ignore", UserWarning)

from _bench import nonnegative_int, positive_int, row_diffs, temp_dir  # noqa: E402

from charon_search.cache import package_fingerprint  # noqa: E402
from charon_search.validation import (  # noqa: E402
    Unexpressible,
    default_files,
    load_files,
    run_validation,
    select_records,
    to_case,
)

SLICES = {
    "training_sc21": ["megatron_sc21_t1_1.7b", "megatron_sc21_t1_7.5b", "megatron_sc21_t1_39b"],
    "serving_h100_8b": [
        "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_"
        "1024x128_c8_tp1_epnone_1",
        "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_"
        "1024x128_c64_tp1_epnone_28",
    ],
}

#: The in-process side, run in a fresh interpreter: its fingerprint of the code at start and
#: end, its wall time and its rows.
_IN_PROCESS = """
import json, sys, time, warnings
warnings.simplefilter('ignore')
from charon_search.cache import package_fingerprint
from charon_search.validation import default_files, load_files, run_validation, select_records
fp0 = package_fingerprint.__wrapped__()
r = select_records(load_files(default_files()), kind='serving', limit=int(sys.argv[1]))
t = time.perf_counter()
res = run_validation(r)
t = time.perf_counter() - t
print(json.dumps([t, res.rows, fp0, package_fingerprint.__wrapped__()]))
"""


def _fingerprint() -> str:
    return package_fingerprint.__wrapped__()  # type: ignore[attr-defined]  # not the cached one


def _sources_mtimes() -> dict[str, int]:
    """Modification times of the package's code and data files (what ``package_fingerprint``
    hashes), to name the files another process changed during the run."""
    import charon_search

    root = Path(charon_search.__file__).resolve().parent
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if p.suffix in (".py", ".yaml", ".json", ".csv", ".parquet") and p.is_file()
            and "__pycache__" not in p.parts}


def _cache_entries() -> int:
    root = Path(os.environ.get("CHARON_CACHE_DIR", Path.home() / ".cache" / "charon-search"))
    return sum(1 for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=positive_int, default=2,
                    help="Ray actors of the parallel run")
    ap.add_argument("--parallel-records", type=nonnegative_int, default=240,
                    help="serving records of the parallel comparison (0 = skip it)")
    ap.add_argument("--disk-cache", choices=("as-found", "cold"), default="as-found",
                    help="disk cache of the parallel comparison's two sides (see above)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    records = load_files(default_files())
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in records:
        try:
            to_case(r)
        except Unexpressible:
            pass
    translate_s = time.perf_counter() - t0
    cases = []
    for name, ids in SLICES.items():
        recs = select_records(records, ids=ids)
        run_validation(recs)  # warm-up: traces and cost tables
        t0 = time.perf_counter()
        run_validation(recs)
        cases.append({"name": name, "records": len(recs), "cache": "warm in memory",
                      "wall_s": round(time.perf_counter() - t0, 3)})
    out: dict = {"load_s": round(load_s, 3), "translate_s": round(translate_s, 3),
                 "num_records": len(records), "cases": cases}
    failure = None
    if args.parallel_records > 0:
        out["parallel"], failure = _parallel(records, args.workers, args.parallel_records,
                                             args.disk_cache)
    print(json.dumps(out))
    if failure:
        print(f"bench_validate: FAILED: {failure}", file=sys.stderr)
        sys.exit(1)


def _parallel(records: list, workers: int, n: int, disk_cache: str) -> tuple[dict, str | None]:
    """The first ``n`` serving records in a fresh process and on ``workers`` Ray actors;
    the result and a failure message (None when the rows are identical)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    recs = select_records(records, kind="serving", limit=n)
    env = dict(os.environ)
    if disk_cache == "cold":
        env["CHARON_CACHE_DIR"] = temp_dir("charon-bench-validate-inproc-")
    fp_start = _fingerprint()
    mtimes0 = _sources_mtimes()
    entries0 = _cache_entries()
    load_in = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, "-c", _IN_PROCESS, str(n)], capture_output=True,
                          text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"bench_validate: the in-process run failed:\n{proc.stderr[-3000:]}")
    in_s, in_rows, fp_in0, fp_in1 = json.loads(proc.stdout.splitlines()[-1])
    if disk_cache == "cold":  # the workers inherit the driver's environment when Ray starts
        os.environ["CHARON_CACHE_DIR"] = temp_dir("charon-bench-validate-workers-")
    added_by_in_process = _cache_entries() - entries0
    fp_par0 = _fingerprint()
    load_par = os.getloadavg()[0]
    t0 = time.perf_counter()
    par = run_validation(recs, workers=workers)
    par_s = time.perf_counter() - t0
    fp_end = _fingerprint()
    mtimes1 = _sources_mtimes()
    changed = sorted(k for k in mtimes0.keys() | mtimes1.keys()
                     if mtimes0.get(k) != mtimes1.get(k))
    count, first = row_diffs(par.rows, in_rows,
                             key=lambda r: f"id {r.get('id')!r}, metric {r.get('metric')!r}")
    fps = [fp_start, fp_in0, fp_in1, fp_par0, fp_end]
    code_changed = len(set(fps)) > 1 or bool(changed)
    res = {"records": len(recs), "rows": len(par.rows), "workers": workers,
           "disk_cache": disk_cache, "in_process_s": round(in_s, 2),
           "workers_s": round(par_s, 2), "speedup": round(in_s / par_s, 2),
           "identical": count == 0, "differing_rows": count, "first_difference": first,
           "code_changed_during_run": code_changed, "package_fingerprints": fps,
           "files_changed_during_run": changed,
           "load_average_1min_before": {"in_process": load_in, "workers": load_par}}
    if disk_cache == "as-found":
        res["disk_cache_entries_added_by_in_process_side"] = added_by_in_process
        if added_by_in_process:
            print(f"note: the in-process side added {added_by_in_process} disk-cache entries "
                  "that the workers then read: the speedup is overstated (use --disk-cache "
                  "cold for equal work)", file=sys.stderr)
    else:
        res["disk_cache_entries_written_by_workers"] = _cache_entries()
    print(f"parallel: {len(recs)} records ({len(par.rows)} rows), disk cache {disk_cache}: "
          f"in process {in_s:.1f} s, {workers} workers {par_s:.1f} s wall (incl. Ray start), "
          f"{in_s / par_s:.2f}x (1-min load average before each: {load_in:.1f}, "
          f"{load_par:.1f} on {os.cpu_count()} cores); rows identical: {count == 0}",
          file=sys.stderr)
    if code_changed:
        names = ", ".join(changed[:8]) or "fingerprint only"
        print(f"note: the package's files changed during the run ({names}): the two sides may "
              "have run different code", file=sys.stderr)
    if count == 0:
        return res, None
    msg = f"{count} of {len(par.rows)} rows differ between the workers and the in-process run; " \
          f"first: {first}"
    if code_changed:
        msg += (f". The package's code or data changed while the benchmark ran ({changed[:8]}; "
                f"fingerprints {fps}: start, in-process start/end, workers start/end): the two "
                "sides may have simulated different code; rerun when nobody edits the sources")
    return res, msg


if __name__ == "__main__":
    main()
