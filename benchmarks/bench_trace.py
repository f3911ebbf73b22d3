"""Cold and warm trace times of training blocks (one decoder layer per type + embedding/head).

    python benchmarks/bench_trace.py [--models llama-3.1-8b ...] [--phase train]

cold: first trace in this process with a new empty temporary cache directory
(``CHARON_CACHE_DIR``; imports already warm: a debug model is traced first, into another
temporary folder); warm: the same request again (in-memory cache hit) and a fresh process-like
disk hit (memory cache cleared). Both temporary folders are removed at exit. Smallest setting:
``--models llama-3.1-8b`` (about 10 s). Also reports one `evaluate` at a new (b, s). Prints
one row per model and, as the last line, one JSON object with all figures.
"""

from __future__ import annotations

import argparse
import json
import time

from _bench import config_errors, fresh_cache_dir

DEFAULT = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-30b-a3b", "deepseek-v3"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT, metavar="MODEL")
    parser.add_argument("--phase", default="train", choices=("train", "prefill", "decode"))
    args = parser.parse_args()
    fresh_cache_dir()

    from charon_search import frontend
    from charon_search.catalog import load_model
    from charon_search.frontend import trace_model

    with config_errors(parser):
        specs = {name: load_model(name) for name in args.models}
    # Warm the imports with a throwaway cache, then forget that trace: a measured debug-llama
    # is then as cold as any other model.
    trace_model("debug-llama", args.phase)
    frontend.clear_memory_cache()
    fresh_cache_dir()
    results: dict[str, dict[str, float]] = {}
    for name, spec in specs.items():
        t0 = time.perf_counter()
        tm = trace_model(spec, args.phase)
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        trace_model(spec, args.phase)
        warm_memory_s = time.perf_counter() - t0
        frontend.clear_memory_cache()
        t0 = time.perf_counter()
        trace_model(spec, args.phase)
        warm_disk_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        flops = tm.total_flops(2, 8192)
        evaluate_s = time.perf_counter() - t0
        nodes = sum(len(g.nodes) for blk in tm.blocks.values()
                    for g in (blk.forward, blk.backward) if g is not None)
        results[name] = {"cold_s": cold_s, "warm_memory_s": warm_memory_s,
                         "warm_disk_s": warm_disk_s, "evaluate_s": evaluate_s, "nodes": nodes,
                         "flops_b2_s8192": flops}
        print(f"{name:18s} cold {cold_s:7.2f} s  warm(mem) {warm_memory_s * 1e3:7.3f} ms  "
              f"warm(disk) {warm_disk_s * 1e3:7.1f} ms  evaluate {evaluate_s * 1e3:6.2f} ms  "
              f"{nodes} nodes", flush=True)
    print(json.dumps({"bench": "trace", "phase": args.phase, "models": results}))


if __name__ == "__main__":
    main()
