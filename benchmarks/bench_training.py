"""Speed of ``simulate_training`` for large layouts (cold vs warm).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_training.py [--repeats 5]
[--disk-cache as-found|cold]`` (smallest: ``--repeats 1``).

``cold_s``: the first evaluation of the case in this process (pass pipeline, per-layer engine
runs, pipeline, memory model; model trace and cost-model predictors from the disk cache). The
disk cache is stated in the output: ``as-found`` (default) uses ``$CHARON_CACHE_DIR`` as it is
(traces and predictors of an earlier run are disk hits); ``cold`` starts from a new empty
temporary folder (removed at exit), so the first case also traces its model and trains the
predictors it needs.
``warm_s``: mean over repeated evaluations of the same layout once graphs, predictors and
per-layer costs are cached (what a search worker pays per trial); ``warm_new_batch_s``: mean
over layouts that differ only in the global batch (pipeline and DP sync re-simulated).
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

from _bench import fresh_cache_dir, positive_int

from charon_search.layout import Layout
from charon_search.training import simulate_training

CASES = [
    ("llama-3.1-8b-fsdp-64", "llama-3.1-8b", "dgx-h100-ib400", 64,
     Layout(dp=64, zero_stage=3, global_batch_size=64, seq_len=8192)),
    ("llama-3.1-70b-tp8pp4-1024", "llama-3.1-70b", "dgx-h100-ib400", 1024,
     Layout(tp=8, pp=4, dp=32, vpp=5, schedule="interleaved-1f1b", sequence_parallel=True,
            zero_stage=1, global_batch_size=512, seq_len=8192)),
    ("llama-3.1-405b-16k", "llama-3.1-405b", "h100-roce-24k", 16384,
     Layout(tp=8, pp=16, dp=128, vpp=4, schedule="interleaved-1f1b", sequence_parallel=True,
            zero_stage=1, global_batch_size=2048, seq_len=8192)),
    ("deepseek-v3-2048", "deepseek-v3", "h800-cluster", 2048,
     Layout(pp=16, dp=128, ep=64, schedule="dualpipe", zero_stage=1, global_batch_size=15360,
            seq_len=4096, precision="fp8", moe_a2a_overlap=True)),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive_int, default=5)
    ap.add_argument("--disk-cache", choices=("as-found", "cold"), default="as-found",
                    help="disk cache of the cold evaluations (see above)")
    args = ap.parse_args()
    if args.disk_cache == "cold":
        fresh_cache_dir()
    print(f"disk cache: {args.disk_cache}", flush=True)
    out = []
    for name, model, cluster, gpus, layout in CASES:
        t0 = time.perf_counter()
        r = simulate_training(model, cluster, layout, num_gpus=gpus)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            simulate_training(model, cluster, layout, num_gpus=gpus)
        warm = (time.perf_counter() - t0) / args.repeats
        t0 = time.perf_counter()
        for k in range(1, args.repeats + 1):
            simulate_training(model, cluster, layout.replace(
                global_batch_size=layout.global_batch_size * (1 + k % 2)), num_gpus=gpus)
        warm_batch = (time.perf_counter() - t0) / args.repeats
        print(f"{name:28s} gpus={gpus:6d} step={r.step_time_s:8.3f}s mfu={r.mfu:6.1%} "
              f"cold={cold:7.2f}s warm={warm * 1e3:8.1f}ms new-batch={warm_batch * 1e3:8.1f}ms",
              flush=True)
        out.append({"name": name, "model": model, "gpus": gpus, "cold_s": round(cold, 4),
                    "warm_s": round(warm, 5), "warm_new_batch_s": round(warm_batch, 5),
                    "step_time_s": r.step_time_s, "mfu": r.mfu})
    print(json.dumps({"disk_cache": args.disk_cache, "repeats": args.repeats, "cases": out}))


if __name__ == "__main__":
    main()
