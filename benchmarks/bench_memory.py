"""Per-configuration cost of ``memory.fits`` with a warm trace/liveness cache.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_memory.py [--model llama-3.1-70b]
[--framework torchtitan] [--disk-cache cold]`` (``--framework`` applies
``MemoryOptions.for_framework``).
The first call traces the model and walks its blocks (reported as ``cold_s``). With
``--disk-cache cold`` (default) it runs against a new empty temporary ``CHARON_CACHE_DIR``
(removed at exit), so it includes tracing the model; ``--disk-cache as-found`` uses the
user's cache (``~/.cache/charon-search``), where a model traced before is a disk hit (about
25x faster). Imports are warmed first (a debug model is traced into a throwaway cache). Then a
grid of layouts (TP/PP/DP/ZeRO/recompute/micro-batch/schedule) is checked and the mean time per
configuration reported (warm: in-memory caches). The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

from _bench import config_errors, fresh_cache_dir, positive_int

from charon_search.catalog import load_model
from charon_search.errors import ConfigError
from charon_search.hardware import load_cluster
from charon_search.layout import Layout
from charon_search.memory import MemoryOptions, fits


def _layouts(num_gpus: int, num_layers: int) -> list[Layout]:
    out = []
    for tp, pp, zero, rec, mbs in itertools.product(
        (1, 2, 4, 8), (1, 2, 4, 8), (0, 1, 3), ("none", "selective", "full"), (1, 2, 4),
    ):
        if num_gpus % (tp * pp) or num_layers < pp:
            continue
        dp = num_gpus // (tp * pp)
        try:
            out.append(Layout(
                tp=tp, pp=pp, dp=dp, zero_stage=zero if dp > 1 else 0,
                schedule="1f1b" if pp > 1 else "none", sequence_parallel=tp > 1,
                micro_batch_size=mbs, global_batch_size=mbs * dp * 8, seq_len=8192,
                recompute=rec))
        except ConfigError:
            continue
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--cluster", default="dgx-h100-ib400")
    ap.add_argument("--gpus", type=positive_int, default=64)
    ap.add_argument("--framework", default=None,
                    choices=("torchtitan", "megatron", "megatron-lm", "megatron-core", "nemo"),
                    help="a framework's conventions (MemoryOptions.for_framework); default: none")
    ap.add_argument("--disk-cache", choices=("cold", "as-found"), default="cold",
                    help="cache of the first call: a new empty temporary folder (cold) or the "
                         "user's CHARON_CACHE_DIR as it is")
    args = ap.parse_args()
    with config_errors(ap):
        opts = MemoryOptions.for_framework(args.framework) if args.framework else None
        spec = load_model(args.model)
        cluster = load_cluster(args.cluster)
    layouts = _layouts(args.gpus, spec.num_layers)
    if not layouts:
        ap.error(f"no TP x PP layout of the grid (1-8 each) divides --gpus {args.gpus} for "
                 f"{spec.name} ({spec.num_layers} layers)")
    from charon_search import frontend

    user_cache = os.environ.get("CHARON_CACHE_DIR")
    fresh_cache_dir()  # warm the imports (torch, the tracer) into a throwaway cache
    frontend.trace_model("debug-llama", "train")
    frontend.clear_memory_cache()
    if args.disk_cache == "cold":
        fresh_cache_dir()
        state = "empty disk cache: the model is traced"
    else:
        if user_cache is None:
            del os.environ["CHARON_CACHE_DIR"]
        else:
            os.environ["CHARON_CACHE_DIR"] = user_cache
        state = f"disk cache as found in {user_cache or '~/.cache/charon-search'}"
    t0 = time.perf_counter()
    fits(spec, layouts[0], cluster, options=opts)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    feasible = 0
    for layout in layouts:
        ok, _ = fits(spec, layout, cluster, options=opts)
        feasible += ok
    warm_s = time.perf_counter() - t0
    per = warm_s / len(layouts)
    print(f"{len(layouts)} layouts of {spec.name} on {args.gpus} x {cluster.gpu.name}: "
          f"{feasible} fit; first call {cold_s:.2f} s ({state}), then warm "
          f"{per * 1e6:.0f} us per configuration (in-memory caches)")
    print(json.dumps({"bench": "memory_fits", "model": spec.name, "cluster": cluster.name,
                      "framework": args.framework, "disk_cache": args.disk_cache,
                      "num_configs": len(layouts), "feasible": feasible,
                      "cold_s": round(cold_s, 4), "per_config_s": per}))


if __name__ == "__main__":
    main()
