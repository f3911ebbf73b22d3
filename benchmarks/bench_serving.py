"""Serving simulator speed: 10,000 requests of Llama-3.1-70B TP4 on H100 (+ a PD-disaggregated
case, and gpt-oss-120b on one H100 with its sliding-window layers paged and not: the cost of
tracking which requests have filled their window, on a KV-bound replica). Graphs are traced and
the cost model warmed first (a run on another sample of the same traffic); the timed runs
measure the discrete-event simulation with a warm cost grid, as a search worker would see it.

    python benchmarks/bench_serving.py [--num-requests 10000]

Last line: ``{"cases": [{"name", "num_requests", "wall_s", "requests_per_s", ...}]}``.
"""

from __future__ import annotations

import argparse
import json
import time

from charon_search.catalog import load_model
from charon_search.hardware import load_cluster
from charon_search.serving import LengthDistribution, ServingConfig, WorkloadSpec
from charon_search.serving.simulator import ServingSimulation


def _case(name: str, model, cluster, cfg: ServingConfig, wl: WorkloadSpec) -> dict:  # type: ignore[no-untyped-def]
    requests = wl.generate()
    models: dict = {}
    # Warm-up on another sample of the same traffic (seed + 1): traces the graphs, trains or
    # loads the predictors and fills the cost grid a search worker keeps between evaluations.
    warm = ServingSimulation(model, cluster, cfg, cost_cache=models)
    warm.run(wl.replace(seed=wl.seed + 1).generate())
    sim = ServingSimulation(model, cluster, cfg, cost_cache=models)
    t0, c0 = time.perf_counter(), time.process_time()
    reqs = sim.run(requests)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0  # CPU time: meaningful on a shared, oversubscribed host
    rep = sim.report(reqs, num_requests=len(requests), closed_loop=False)
    print(f"{name}: {len(requests)} requests in {wall:.2f} s wall "
          f"({len(requests) / wall:.0f} simulated req/s, {rep.num_iterations} iterations); "
          f"{rep.summary()}")
    return {"name": name, "num_requests": len(requests), "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "requests_per_s": round(len(requests) / wall, 1),
            "num_iterations": rep.num_iterations,
            "simulated_ttft_p50_s": rep.ttft_s["p50"], "simulated_tpot_p50_s": rep.tpot_s["p50"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--cluster", default="h100-sxm-8gpu")
    args = ap.parse_args()
    model = load_model("llama-3.1-70b")
    cluster = load_cluster(args.cluster)
    wl = WorkloadSpec(arrival="poisson", rate_per_s=4.0, num_requests=args.num_requests, seed=0,
                      input_len=LengthDistribution(kind="lognormal", mean=2000, sigma=0.6),
                      output_len=LengthDistribution(kind="lognormal", mean=200, sigma=0.6))
    cases = [
        _case("llama-3.1-70b tp4 vllm", model, cluster,
              ServingConfig(tp=4, max_num_seqs=256, max_num_batched_tokens=8192), wl),
        _case("llama-3.1-70b disagg prefill=1xTP4,decode=1xTP4", model, cluster,
              ServingConfig(disagg="prefill=1xTP4,decode=1xTP4"), wl.replace(rate_per_s=6.0)),
    ]
    oss = load_model("gpt-oss-120b")
    for windowed in (True, False):
        cases.append(_case(f"gpt-oss-120b tp1 vllm, windowed_kv={windowed}", oss, cluster,
                           ServingConfig(tp=1, engine="vllm", precision="fp4",
                                         windowed_kv=windowed), wl.replace(rate_per_s=8.0)))
    print(json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()
