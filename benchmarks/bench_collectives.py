"""Speed of the collective model and the roofline fast path (the search calls them a lot).

Prints a table, then one JSON line: {"cases": [{"name", "calls", "us_per_call"}]}.
Run: .venv/bin/python benchmarks/bench_collectives.py
"""

from __future__ import annotations

import argparse
import json
import time

from charon_search.cost import collectives
from charon_search.cost.collectives import collective_time
from charon_search.cost.measured_collectives import measured_nccl_s
from charon_search.cost.roofline import roofline_times
from charon_search.hardware import load_cluster
from charon_search.testing import gemm_graph


def _time(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    cluster = load_cluster("h100-roce-24k")
    cases = []
    for name, kind, n, stride in (
        ("tp8_all_reduce", "all_reduce", 8, 1),
        ("dp128_all_reduce_stride128", "all_reduce", 128, 128),
        ("dp2048_reduce_scatter_stride8", "reduce_scatter", 2048, 8),
        ("ep64_all_to_all", "all_to_all", 64, 8),
        ("pp_send_recv_stride1024", "send_recv", 2, 1024),
    ):
        collectives._CONTEXTS.clear()
        collectives._levels.cache_clear()
        def call(i: int, kind: str = kind, n: int = n, stride: int = stride) -> float:
            return collective_time(kind, 1e8 + i, n, cluster, stride=stride)

        cold = _time(call, 1)
        warm = _time(call, 20000)
        cases.append({"name": name, "calls": 20000, "us_per_call": round(warm, 2),
                      "cold_us": round(cold, 1)})
    # An intra-node collective priced from the profile DB's measured NCCL rows
    # (cost.measured_collectives): interpolation in a cached curve.
    h100 = load_cluster("h100-sxm-8gpu")
    measured_nccl_s("all_reduce", 1e8, 8, h100)  # load the table once
    warm = _time(lambda i: measured_nccl_s("all_reduce", 1e8 + i, 8, h100), 20000)
    cases.append({"name": "measured_nccl_tp8_all_reduce", "calls": 20000,
                  "us_per_call": round(warm, 2)})
    graph = gemm_graph(8192, 8192, 8192)
    warm = _time(lambda i: roofline_times(graph, cluster.gpu, 1 + i % 4, 4096), 20000)
    cases.append({"name": "roofline_times_1_node", "calls": 20000, "us_per_call": round(warm, 2)})
    for c in cases:
        print(f"{c['name']:32s} {c['us_per_call']:8.2f} us/call")
    print(json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()
