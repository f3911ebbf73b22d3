"""Speed of `charon-search calibrate`: the fit plus its leave-one-source-out report, with the
per-(parameter vector, record) memo against evaluating every requested set afresh (each fit
still caches its own vectors, as before the memo).

Slice: the fully specified training records of three sources (SC21 Megatron, Korthikanti,
torchtitan), fitting ``overlap_compute_slowdown`` (6 grid points). Both runs must reach the
same fit and the same held-out errors; the script checks that before it reports.

``--sources 2`` keeps the first two sources (a smaller check; leave-one-source-out needs two).
Run time on a 2-core machine: about 4 minutes with the three sources.

Prints one JSON object on the last line:
``{"records", "sources", "memo": {"wall_s", "simulations"}, "plain": {...}, "speedup"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

warnings.simplefilter("ignore", UserWarning)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from charon_search.validation import (  # noqa: E402
    default_files,
    load_files,
    run_validation,
    select_records,
)
from charon_search.validation.calibration import (  # noqa: E402
    MemoizedEvaluate,
    default_evaluate,
    development_records,
    fit_parameters,
    leave_one_source_out,
)
from charon_search.validation.runner import source_label  # noqa: E402

SOURCES = ("Narayanan et al.", "Korthikanti et al.", "torchtitan team")
PARAMS = ["overlap_compute_slowdown"]


class _Plain(MemoizedEvaluate):
    """Every call simulates every requested record (the behaviour before the memo)."""

    def __call__(self, records, values):  # type: ignore[no-untyped-def]
        self.pairs += len(records)
        return self._evaluate(records, values)


def _run(evaluate: MemoizedEvaluate, dev) -> tuple[float, dict, list]:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fit = fit_parameters(dev, PARAMS, evaluate=evaluate)
    loso = leave_one_source_out(dev, PARAMS, evaluate=evaluate)
    return time.perf_counter() - t0, fit.values, loso


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", type=int, choices=(2, 3), default=3,
                    help="how many of the three sources to fit on (first ones)")
    args = ap.parse_args()
    sources = SOURCES[:args.sources]
    records = select_records(load_files(default_files()), kind="training")
    records = [r for r in records if source_label(r.source) in sources]
    dev = development_records(records, run_validation(development_records(records)))
    results = {}
    for name, cls in (("memo", MemoizedEvaluate), ("plain", _Plain)):
        ev = cls(default_evaluate())
        wall, values, loso = _run(ev, dev)
        results[name] = {"wall_s": round(wall, 2), "simulations": ev.pairs,
                         "values": values, "loso": loso}
    assert results["memo"]["values"] == results["plain"]["values"]
    assert results["memo"]["loso"] == results["plain"]["loso"], "memo changed the LOSO report"
    out = {"records": len(dev), "sources": sorted({source_label(r.source) for r in dev}),
           "fit": results["memo"]["values"],
           "memo": {k: results["memo"][k] for k in ("wall_s", "simulations")},
           "plain": {k: results["plain"][k] for k in ("wall_s", "simulations")},
           "speedup": round(results["plain"]["wall_s"] / results["memo"]["wall_s"], 2)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
