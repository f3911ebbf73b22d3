"""Serving simulator speed: Llama-3.1-70B TP4 on H100 (+ a PD-disaggregated case), and the cost
of paging gpt-oss-120b's sliding-window layers (``ServingConfig.windowed_kv``) on one H100.

Graphs are traced and the cost model warmed first (a run on another sample of the same traffic);
every timed run then simulates the same requests with a warm cost grid, as a search worker would
see it. Each case is timed ``--repeats`` times in process CPU time (wall time is printed with its
spread); the figures are the best and the median of the repeats.

The windowed-KV comparison is made twice, both sides timed alternately in the same process:

* ``same schedule`` (4 req/s): the KV cache never fills, so paged and unpaged run the same
  scheduler iterations with the same batches (checked: equal iteration and preemption counts).
  The ratio is the cost of tracking which requests have filled their window.
* ``KV-bound`` (8 req/s): paging frees pages, so the engine admits more requests per step and
  the two sides run *different* schedules; the time per run mixes the tracking cost with the
  different schedule, so the time per scheduler iteration is printed as well.

Disk cache: whatever ``$CHARON_CACHE_DIR`` holds (the warm-up run fills what is missing; no
timed run reads it). Smallest useful setting: ``--num-requests 500 --repeats 3``.

    OMP_NUM_THREADS=1 python benchmarks/bench_serving.py [--num-requests 10000] [--repeats 5]

Last line: ``{"cases": [{"name", "num_requests", "cpu_s": {"min", "median", "max"}, "wall_s":
{...}, "num_iterations", ...}], "windowed_kv": [{"name", "paged", "unpaged",
"same_schedule", "cpu_ratio_best", "cpu_ratio_median", "cpu_ratio_pairs": {...},
"cpu_per_iteration_ratio_best"}]}``; ratios are paged / unpaged CPU time.
"""

from __future__ import annotations

import argparse
import json
import time

from _bench import config_errors, positive_int, spread

from charon_search.catalog import load_model
from charon_search.hardware import load_cluster
from charon_search.serving import LengthDistribution, ServingConfig, WorkloadSpec
from charon_search.serving.simulator import ServingSimulation


class _Case:
    """One simulated configuration: warmed up once, then timed run by run."""

    def __init__(self, name: str, model, cluster, cfg: ServingConfig,  # type: ignore[no-untyped-def]
                 wl: WorkloadSpec) -> None:
        self.name, self.model, self.cluster, self.cfg = name, model, cluster, cfg
        self.requests = wl.generate()
        self.models: dict = {}
        # Warm-up on another sample of the same traffic (seed + 1): traces the graphs, trains or
        # loads the predictors and fills the cost grid a search worker keeps between evaluations.
        ServingSimulation(model, cluster, cfg, cost_cache=self.models).run(
            wl.replace(seed=wl.seed + 1).generate())
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self.rep = None

    def run_once(self) -> None:
        sim = ServingSimulation(self.model, self.cluster, self.cfg, cost_cache=self.models)
        c0, t0 = time.process_time(), time.perf_counter()
        reqs = sim.run(self.requests)
        self.cpu.append(time.process_time() - c0)
        self.wall.append(time.perf_counter() - t0)
        rep = sim.report(reqs, num_requests=len(self.requests), closed_loop=False)
        if self.rep is not None and (rep.num_iterations, rep.num_preemptions) != (
                self.rep.num_iterations, self.rep.num_preemptions):
            raise SystemExit(f"{self.name}: a repeat ran a different schedule "
                             f"({rep.num_iterations} vs {self.rep.num_iterations} iterations)")
        self.rep = rep

    def result(self) -> dict:
        rep, n = self.rep, len(self.requests)
        assert rep is not None
        cpu, wall = spread(self.cpu), spread(self.wall)
        print(f"{self.name}: {n} requests, CPU best {cpu['min']:.3f} s / median "
              f"{cpu['median']:.3f} s over {len(self.cpu)} runs (wall median "
              f"{wall['median']:.3f} s, {wall['min']:.3f}-{wall['max']:.3f} s); "
              f"{n / cpu['min']:.0f} simulated req per CPU-s; {rep.num_iterations} iterations "
              f"({1e6 * cpu['min'] / rep.num_iterations:.1f} us CPU each), "
              f"{rep.num_preemptions} preemptions, KV util {rep.kv_utilization:.1%}", flush=True)
        return {"name": self.name, "num_requests": n, "repeats": len(self.cpu),
                "cpu_s": {k: round(v, 4) for k, v in cpu.items()},
                "wall_s": {k: round(v, 4) for k, v in wall.items()},
                "requests_per_cpu_s": round(n / cpu["min"], 1),
                "num_iterations": rep.num_iterations, "num_preemptions": rep.num_preemptions,
                "cpu_us_per_iteration": round(1e6 * cpu["min"] / rep.num_iterations, 3),
                "kv_utilization": rep.kv_utilization,
                "simulated_ttft_p50_s": rep.ttft_s["p50"],
                "simulated_tpot_p50_s": rep.tpot_s["p50"]}


def _windowed_pair(name: str, oss, cluster, wl: WorkloadSpec,  # type: ignore[no-untyped-def]
                   repeats: int) -> tuple[list[dict], dict]:
    """Paged vs unpaged windowed layers on the same requests, timed alternately."""
    sides = {w: _Case(f"gpt-oss-120b tp1 vllm {name}, windowed_kv={w}", oss, cluster,
                      ServingConfig(tp=1, engine="vllm", precision="fp4", windowed_kv=w), wl)
             for w in (True, False)}
    for r in range(repeats):  # alternate the order against drift in the machine's load
        for w in ((True, False) if r % 2 == 0 else (False, True)):
            sides[w].run_once()
    paged, plain = (sides[w].result() for w in (True, False))
    pairs = [a / b for a, b in zip(sides[True].cpu, sides[False].cpu)]
    same = (paged["num_iterations"], paged["num_preemptions"]) == (
        plain["num_iterations"], plain["num_preemptions"])
    best = paged["cpu_s"]["min"] / plain["cpu_s"]["min"]
    med = paged["cpu_s"]["median"] / plain["cpu_s"]["median"]
    per_it = paged["cpu_us_per_iteration"] / plain["cpu_us_per_iteration"]
    pr = spread(pairs)
    print(f"windowed_kv {name}: paged / unpaged CPU time {best:.3f}x best-of-{repeats} "
          f"({paged['cpu_s']['min']:.3f} s vs {plain['cpu_s']['min']:.3f} s), median "
          f"{med:.3f}x, per alternating pair {pr['min']:.3f}-{pr['max']:.3f}x; "
          + ("same schedule on both sides "
             f"({paged['num_iterations']} iterations, {paged['num_preemptions']} preemptions)"
             if same else
             f"DIFFERENT schedules ({paged['num_iterations']} vs {plain['num_iterations']} "
             f"iterations, {paged['num_preemptions']} vs {plain['num_preemptions']} "
             f"preemptions): per iteration {paged['cpu_us_per_iteration']:.2f} vs "
             f"{plain['cpu_us_per_iteration']:.2f} us CPU ({per_it:.3f}x)"), flush=True)
    return [paged, plain], {
        "name": name, "rate_per_s": wl.rate_per_s, "paged": paged["name"],
        "unpaged": plain["name"], "same_schedule": same,
        "cpu_ratio_best": round(best, 4), "cpu_ratio_median": round(med, 4),
        "cpu_ratio_pairs": {k: round(v, 4) for k, v in pr.items()},
        "cpu_per_iteration_ratio_best": round(per_it, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=positive_int, default=10_000)
    ap.add_argument("--repeats", type=positive_int, default=5,
                    help="timed runs per case (best and median reported)")
    ap.add_argument("--cluster", default="h100-sxm-8gpu")
    args = ap.parse_args()
    with config_errors(ap):
        model = load_model("llama-3.1-70b")
        oss = load_model("gpt-oss-120b")
        cluster = load_cluster(args.cluster)
        wl = WorkloadSpec(arrival="poisson", rate_per_s=4.0, num_requests=args.num_requests,
                          seed=0,
                          input_len=LengthDistribution(kind="lognormal", mean=2000, sigma=0.6),
                          output_len=LengthDistribution(kind="lognormal", mean=200, sigma=0.6))
    t0 = time.perf_counter()
    cases = []
    for case in (_Case("llama-3.1-70b tp4 vllm", model, cluster,
                       ServingConfig(tp=4, max_num_seqs=256, max_num_batched_tokens=8192), wl),
                 _Case("llama-3.1-70b disagg prefill=1xTP4,decode=1xTP4", model, cluster,
                       ServingConfig(disagg="prefill=1xTP4,decode=1xTP4"),
                       wl.replace(rate_per_s=6.0))):
        for _ in range(args.repeats):
            case.run_once()
        cases.append(case.result())
    windowed = []
    for name, rate in (("same schedule", 4.0), ("KV-bound", 8.0)):
        rows, summary = _windowed_pair(name, oss, cluster, wl.replace(rate_per_s=rate),
                                       args.repeats)
        cases += rows
        windowed.append(summary)
    print(f"total wall {time.perf_counter() - t0:.1f} s")
    print(json.dumps({"cases": cases, "windowed_kv": windowed}))


if __name__ == "__main__":
    main()
