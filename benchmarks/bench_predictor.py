"""Speed of the measured-cost path: DB lookups, predictor loading, fused graph costing.

Run: ``python benchmarks/bench_predictor.py`` (about 6 s with a warm disk cache). The last
printed line is one JSON object. The disk cache is used as found (``$CHARON_CACHE_DIR``, default
``~/.cache/charon-search``, stated in the output): ``warmup_s`` trains the H100 predictors only
when they are not cached there yet (first use), and loads them otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from charon_search.cost.predictor import PredictorStore
from charon_search.cost.profile_db import ProfileDB, default_profile_db, shipped_profile_dir
from charon_search.cost.selector import FusedCostModel
from charon_search.hardware.loader import load_cluster
from charon_search.passes.synthetic import synthetic_model


def _best(fn, repeats: int = 5) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> None:
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    db = default_profile_db()
    cluster = load_cluster("h100-sxm-8gpu")
    t0 = time.perf_counter()
    fresh = ProfileDB(shipped_profile_dir())
    fresh.exact("h100-sxm-80gb", "gemm", "", "bf16", {"m": 4096, "n": 4096, "k": 4096})
    first_lookup_s = time.perf_counter() - t0
    lookup_s = _best(lambda: [fresh.exact("h100-sxm-80gb", "gemm", "", "bf16",
                                          {"m": 4096, "n": 4096, "k": 4096})
                              for _ in range(1000)]) / 1000
    model = FusedCostModel(cluster)
    blocks = synthetic_model(layer_types=("dense", "moe"), hidden=4096, heads=32, kv_heads=8,
                             ffn=14336, vocab=128256, num_experts=8, top_k=2, moe_ffn=14336)
    graphs = [g for b in blocks.blocks.values() for g in (b.forward, b.backward) if g]
    t0 = time.perf_counter()
    for g in graphs:  # trains or loads every predictor these graphs need
        model.cost_graph(g, 1, 4096)
    warmup_s = time.perf_counter() - t0
    # A fresh store in a new "worker": load the pickled predictors from disk.
    t0 = time.perf_counter()
    store = PredictorStore(db)
    for fam in ("prefill", "decode"):
        store.get("h100-sxm-80gb", "attention", fam, "bf16")
    store.get("h100-sxm-80gb", "gemm", "", "bf16")
    load_s = time.perf_counter() - t0
    memo_s = _best(lambda: [model.cost_graph(g, 1, 4096) for g in graphs]) / len(graphs)
    rng = np.random.default_rng(0)
    points = [(int(b), int(s)) for b, s in zip(rng.integers(1, 64, 50),
                                               rng.integers(128, 8192, 50))]
    t0 = time.perf_counter()
    for b, s in points:
        for g in graphs:
            model.cost_graph(g, b, s)
    new_point_s = (time.perf_counter() - t0) / (len(points) * len(graphs))
    nodes = sum(len(g.nodes) for g in graphs)
    print(f"exact lookup {lookup_s * 1e6:.2f} us (first, incl. reading one table: "
          f"{first_lookup_s * 1e3:.1f} ms); predictor warm-up {warmup_s:.2f} s; "
          f"3 predictors loaded from disk {load_s * 1e3:.1f} ms; cost_graph memo hit "
          f"{memo_s * 1e6:.1f} us, new (b, s) point {new_point_s * 1e3:.2f} ms per graph "
          f"({nodes / len(graphs):.0f} nodes); disk cache as found in "
          f"{os.environ.get('CHARON_CACHE_DIR', '~/.cache/charon-search')}")
    print(json.dumps({"exact_lookup_s": lookup_s, "first_lookup_s": first_lookup_s,
                      "predictor_load_s": load_s, "cost_graph_memo_s": memo_s,
                      "cost_graph_new_point_s": new_point_s, "warmup_s": warmup_s,
                      "nodes_per_graph": nodes / len(graphs), "disk_cache": "as-found"}))


if __name__ == "__main__":
    main()
