"""Speed of `charon-search validate`: loading, translation, a fixed slice end to end, and
the first ``--parallel-records`` serving records in this process against ``--workers`` Ray
actors (``run_validation(..., workers=N)``; both from cold caches, the pool's time includes
starting Ray and its workers; the results must be identical).

Prints one JSON object on the last line:
``{"load_s", "translate_s", "num_records", "cases": [{"name", "records", "wall_s"}],
"parallel": {"records", "workers", "in_process_s", "workers_s", "speedup", "identical"}}``.

    python benchmarks/bench_validate.py --workers 2 --parallel-records 240
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

warnings.simplefilter("ignore", UserWarning)

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="Ray actors of the parallel run")
    ap.add_argument("--parallel-records", type=int, default=240,
                    help="serving records of the parallel comparison (0 = skip it)")
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
        run_validation(recs)  # cold: traces and cost tables
        t0 = time.perf_counter()
        run_validation(recs)
        cases.append({"name": name, "records": len(recs),
                      "wall_s": round(time.perf_counter() - t0, 3)})
    out = {"load_s": round(load_s, 3), "translate_s": round(translate_s, 3),
           "num_records": len(records), "cases": cases}
    if args.parallel_records > 0:
        out["parallel"] = _parallel(records, args.workers, args.parallel_records)
    print(json.dumps(out))


def _parallel(records: list, workers: int, n: int) -> dict:
    """The first ``n`` serving records in a fresh process (cold caches, like the workers) and
    on ``workers`` Ray actors."""
    import subprocess
    import sys

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    recs = select_records(records, kind="serving", limit=n)
    code = ("import json, sys, time, warnings; warnings.simplefilter('ignore');"
            "from charon_search.validation import *;"
            f"r = select_records(load_files(default_files()), kind='serving', limit={n});"
            "t = time.perf_counter(); res = run_validation(r);"
            "print(json.dumps([time.perf_counter() - t, res.rows]))")
    cold = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                     text=True, check=True).stdout.splitlines()[-1])
    t0 = time.perf_counter()
    par = run_validation(recs, workers=workers)
    par_s = time.perf_counter() - t0
    return {"records": len(recs), "workers": workers, "in_process_s": round(cold[0], 2),
            "workers_s": round(par_s, 2), "speedup": round(cold[0] / par_s, 2),
            "identical": par.rows == cold[1]}


if __name__ == "__main__":
    main()
