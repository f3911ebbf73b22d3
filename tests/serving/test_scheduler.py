"""Scheduler and engine behaviour against closed forms of an affine iteration cost model."""

from __future__ import annotations

import math

import pytest

from charon_search.errors import ConfigError
from charon_search.serving import (
    LengthDistribution,
    RequestSpec,
    ServingConfig,
    SpeculativeConfig,
    WorkloadSpec,
    simulate_serving,
)
from charon_search.serving.iteration_cost import collective_s

OH = 1e-3  # per-iteration CPU overhead used throughout


def req(i: int, t: float, prompt: int, out: int, *, prefix_id: int = -1,
        prefix_tokens: int = 0) -> RequestSpec:
    return RequestSpec(request_id=i, arrived_at_s=t, prompt_tokens=prompt, output_tokens=out,
                       prefix_id=prefix_id, prefix_tokens=prefix_tokens)


def _cfg(**kw):  # type: ignore[no-untyped-def]
    base = {"num_kv_blocks": 20000, "iteration_overhead_s": OH}
    base.update(kw)
    return ServingConfig(**base)


def test_single_request_ttft_and_tpot_closed_form(affine, cluster) -> None:
    rep = simulate_serving("debug-llama", cluster, _cfg(), [req(0, 0.0, 1000, 10)],
                           cost_model=affine)
    ttft = affine.iteration_s([(1000, 1000)], 0, 0.0) + OH
    assert rep.ttft_s["mean"] == pytest.approx(ttft, rel=1e-12)
    # Decode step j (j = 1..9) reads the prompt plus j tokens, at CUDA-graph batch 1.
    steps = [affine.iteration_s((), 1, 1000 + j, padded_decode=1) + OH for j in range(1, 10)]
    assert rep.tpot_s["mean"] == pytest.approx(sum(steps) / 9, rel=1e-12)
    # Hand check: 5 ms + 10 us + 0.1 us * 1000 + 1 ns * 500500 + 1 ms = 6.6105 ms.
    assert ttft == pytest.approx(5e-3 + 1e-2 + 1e-4 + 500500e-9 + 1e-3)
    assert rep.num_completed == 1 and rep.num_iterations == 10
    # One request alone: every inter-token gap is one decode iteration.
    assert rep.itl_s["mean"] == pytest.approx(rep.tpot_s["mean"], rel=1e-12)
    assert rep.itl_s["p50"] == pytest.approx(steps[4], rel=2e-3)


def test_littles_law_on_steady_run(affine, cluster) -> None:
    wl = WorkloadSpec(arrival="poisson", rate_per_s=20.0, num_requests=3000, seed=1,
                      input_len=LengthDistribution(kind="uniform", low=200, high=800),
                      output_len=LengthDistribution(kind="uniform", low=50, high=150))
    rep = simulate_serving("debug-llama", cluster, _cfg(), wl, cost_model=affine)
    assert rep.num_completed == 3000
    little = rep.arrival_rate * rep.e2e_s["mean"]
    assert rep.mean_requests_in_system == pytest.approx(little, rel=0.05)
    assert rep.arrival_rate == pytest.approx(20.0, rel=0.05)


def test_prefix_cache_hit_saves_the_prefill(affine, cluster) -> None:
    shared = {"prefix_id": 7, "prefix_tokens": 1024}
    reqs = [req(0, 0.0, 1024, 2, **shared), req(1, 10.0, 1024, 2, **shared)]
    rep = simulate_serving("debug-llama", cluster, _cfg(prefix_caching=True), reqs,
                           cost_model=affine, keep_requests=True)
    t0, t1 = rep.per_request["ttft_s"]
    # 63 full blocks (1008 tokens) hit; vLLM recomputes the last block of a full hit.
    assert t0 == pytest.approx(affine.iteration_s([(1024, 1024)], 0, 0.0) + OH)
    assert t1 == pytest.approx(affine.iteration_s([(16, 1024)], 0, 0.0) + OH)
    saved = affine.iteration_s([(1024, 1024)], 0, 0) - affine.iteration_s([(16, 1024)], 0, 0)
    assert t0 - t1 == pytest.approx(saved)
    assert rep.prefix_hit_rate == pytest.approx(1008 / 2048)
    off = simulate_serving("debug-llama", cluster, _cfg(prefix_caching=False), reqs,
                           cost_model=affine)
    assert off.prefix_hit_rate == 0.0 and off.ttft_s["mean"] > rep.ttft_s["mean"]


def test_kv_exhaustion_preempts_and_loses_nothing(affine, cluster) -> None:
    wl = WorkloadSpec(arrival="burst", num_requests=40, seed=0,
                      input_len=LengthDistribution(value=200),
                      output_len=LengthDistribution(value=200))
    rep = simulate_serving("debug-llama", cluster, _cfg(num_kv_blocks=200), wl,
                           cost_model=affine, keep_requests=True)
    assert rep.num_preemptions > 0
    assert rep.num_completed == rep.num_requests == 40
    assert sum(rep.per_request["num_preemptions"]) == rep.num_preemptions
    assert all(math.isfinite(x) for x in rep.per_request["e2e_s"])
    roomy = simulate_serving("debug-llama", cluster, _cfg(), wl, cost_model=affine)
    assert roomy.num_preemptions == 0


def test_request_larger_than_cache_is_infeasible(affine, cluster) -> None:
    from charon_search.errors import InfeasibleError

    with pytest.raises(InfeasibleError, match="KV"):
        simulate_serving("debug-llama", cluster, _cfg(num_kv_blocks=4),
                         [req(0, 0.0, 1000, 5)], cost_model=affine)


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_full_acceptance_commits_k_plus_1(affine, cluster, k) -> None:
    steps = 5
    out = 1 + steps * (k + 1)
    cfg = _cfg(speculative=SpeculativeConfig(num_draft_tokens=k, acceptance_rate=1.0))
    rep = simulate_serving("debug-llama", cluster, cfg, [req(0, 0.0, 100, out)],
                           cost_model=affine)
    assert rep.mean_tokens_per_step == k + 1
    assert rep.num_iterations == 1 + steps  # one prefill + `steps` verify steps
    plain = simulate_serving("debug-llama", cluster, _cfg(), [req(0, 0.0, 100, out)],
                             cost_model=affine)
    assert plain.num_iterations == out
    assert rep.e2e_s["mean"] < plain.e2e_s["mean"]


def test_expected_tokens_per_step_formula() -> None:
    spec = SpeculativeConfig(num_draft_tokens=3, acceptance_rate=0.5)
    assert spec.expected_tokens_per_step == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    per_pos = SpeculativeConfig(num_draft_tokens=2, acceptance_rate=(0.8, 0.5))
    assert per_pos.expected_tokens_per_step == pytest.approx(1 + 0.8 + 0.4)


def test_deterministic_with_seed(affine, cluster) -> None:
    def run(seed: int) -> dict:
        wl = WorkloadSpec(arrival="gamma", cv=3.0, rate_per_s=30, num_requests=300, seed=seed,
                          input_len=LengthDistribution(kind="lognormal", mean=400, sigma=0.8),
                          output_len=LengthDistribution(kind="uniform", low=10, high=100))
        return simulate_serving("debug-llama", cluster, _cfg(), wl, cost_model=affine).to_dict()

    assert run(3) == run(3)
    assert run(3)["e2e_s"] != run(4)["e2e_s"]


def test_chunked_prefill_splits_long_prompt(affine, cluster) -> None:
    cfg = _cfg(max_num_batched_tokens=2048)
    rep = simulate_serving("debug-llama", cluster, cfg, [req(0, 0.0, 10000, 2)],
                           cost_model=affine)
    chunks = [(2048, 2048 * (i + 1)) for i in range(4)] + [(1808, 10000)]
    expected = sum(affine.iteration_s([c], 0, 0.0) + OH for c in chunks)
    assert rep.ttft_s["mean"] == pytest.approx(expected)
    # Without chunking the prompt runs whole, so it must fit the budget (vLLM refuses to
    # start otherwise); within it, one iteration prefills all 10,000 tokens.
    with pytest.raises(ConfigError, match="exceeds `max_num_batched_tokens` 2,048"):
        simulate_serving("debug-llama", cluster, _cfg(chunked_prefill=False,
                                                      max_num_batched_tokens=2048),
                         [req(0, 0.0, 10000, 2)], cost_model=affine)
    no_chunk = simulate_serving("debug-llama", cluster, _cfg(chunked_prefill=False,
                                                             max_num_batched_tokens=10000),
                                [req(0, 0.0, 10000, 2)], cost_model=affine)
    assert no_chunk.ttft_s["mean"] == pytest.approx(
        affine.iteration_s([(10000, 10000)], 0, 0.0) + OH)


def test_cuda_graph_pads_decode_batch(affine, cluster) -> None:
    reqs = [req(i, 0.0, 100, 3) for i in range(3)]
    on = simulate_serving("debug-llama", cluster, _cfg(), reqs, cost_model=affine)
    off = simulate_serving("debug-llama", cluster, _cfg(cuda_graph=False), reqs,
                           cost_model=affine)
    # Three decodes run as the captured batch of 4: one padded token more per step.
    assert on.tpot_s["mean"] - off.tpot_s["mean"] == pytest.approx(affine.per_token_s)


def test_static_batching_finishes_batch_together(affine, cluster) -> None:
    reqs = [req(i, 0.0, 100, out) for i, out in enumerate((2, 10, 5, 3))]
    rep = simulate_serving("debug-llama", cluster, _cfg(scheduler="static"), reqs,
                           cost_model=affine, keep_requests=True)
    e2e = rep.per_request["e2e_s"]
    assert max(e2e) == pytest.approx(min(e2e))
    cont = simulate_serving("debug-llama", cluster, _cfg(), reqs, cost_model=affine)
    assert cont.e2e_s["mean"] < rep.e2e_s["mean"]


def test_closed_loop_keeps_concurrency_in_flight(affine, cluster) -> None:
    wl = WorkloadSpec(arrival="concurrency", concurrency=8, num_requests=400,
                      input_len=LengthDistribution(value=300),
                      output_len=LengthDistribution(value=50))
    rep = simulate_serving("debug-llama", cluster, _cfg(), wl, cost_model=affine)
    assert rep.num_completed == 400
    assert 7.5 < rep.mean_requests_in_system <= 8.0 + 1e-9


def test_disaggregated_adds_kv_transfer(affine, cluster) -> None:
    from dataclasses import replace

    cm = replace(affine, kv_token_bytes=1e5)
    agg = simulate_serving("debug-llama", cluster, _cfg(), [req(0, 0.0, 1000, 10)],
                           cost_model=cm)
    cfg = _cfg(disagg={"prefill": "1xTP1", "decode": "1xTP1", "kv_transfer": "rdma"})
    dis = simulate_serving("debug-llama", cluster, cfg, [req(0, 0.0, 1000, 10)],
                           cost_model=cm)
    # The toy cluster has a network tier: the KV crosses it one node apart.
    xfer = collective_s("send_recv", 1000 * 1e5, 2, cluster, stride=cluster.gpus_per_node)
    # The decode replica streams the first token with its first step (vLLM, TensorRT-LLM),
    # which reads the prompt's 1000 tokens plus one.
    step1 = cm.iteration_s((), 1, 1001, padded_decode=1) + OH
    assert dis.ttft_s["mean"] == pytest.approx(agg.ttft_s["mean"] + xfer + step1)
    # vLLM's decode instance samples that first token again (the prefill's is dropped), so
    # it runs all 10 steps: one more than the aggregated run's 9, each within 10 KV tokens
    # (1e-6 s) of step1.
    assert dis.e2e_s["mean"] == pytest.approx(agg.e2e_s["mean"] + xfer + step1, abs=2e-6)
    assert dis.num_gpus == 2
    # SGLang's decode server streams the prefill's token as the request joins.
    sgl = simulate_serving("debug-llama", cluster, _cfg(disagg=cfg.disagg, engine="sglang"),
                           [req(0, 0.0, 1000, 10)], cost_model=cm)
    assert sgl.ttft_s["mean"] == pytest.approx(agg.ttft_s["mean"] + xfer)
    # ... and then runs the 9 remaining steps, as the aggregated run does.
    assert sgl.e2e_s["mean"] == pytest.approx(agg.e2e_s["mean"] + xfer)


def test_disaggregated_hand_over_time(affine, cluster) -> None:
    """The hand-over time H delays the decode replica's view of a request by exactly H: TTFT
    and E2E grow by H, TPOT does not. The cluster's per-engine value applies to its engine
    only, an explicit value wins, and an aggregated deployment never pays it."""
    import dataclasses

    from charon_search.errors import ConfigError

    h = 0.12
    one = [req(0, 0.0, 1000, 10)]
    dis = {"prefill": "1xTP1", "decode": "1xTP1", "kv_transfer": "rdma"}
    base = simulate_serving("debug-llama", cluster, _cfg(disagg=dis, engine="sglang"), one,
                            cost_model=affine)
    cal = dataclasses.replace(cluster.calibration, disagg_handoff_s={"sglang": h})
    slow_cluster = dataclasses.replace(cluster, calibration=cal)
    slow = simulate_serving("debug-llama", slow_cluster, _cfg(disagg=dis, engine="sglang"),
                            one, cost_model=affine)
    assert slow.ttft_s["mean"] - base.ttft_s["mean"] == pytest.approx(h, rel=1e-9)
    assert slow.e2e_s["mean"] - base.e2e_s["mean"] == pytest.approx(h, rel=1e-9)
    assert slow.tpot_s["mean"] == pytest.approx(base.tpot_s["mean"], rel=1e-12)
    other = simulate_serving("debug-llama", slow_cluster, _cfg(disagg=dis, engine="vllm"),
                             one, cost_model=affine)
    vllm = simulate_serving("debug-llama", cluster, _cfg(disagg=dis, engine="vllm"), one,
                            cost_model=affine)
    assert other.ttft_s["mean"] == vllm.ttft_s["mean"]  # no value for vllm: none
    explicit = simulate_serving("debug-llama", slow_cluster,
                                _cfg(disagg=dis, engine="sglang", disagg_handoff_s=0.0), one,
                                cost_model=affine)
    assert explicit.ttft_s["mean"] == base.ttft_s["mean"]
    agg = [simulate_serving("debug-llama", c, _cfg(engine="sglang"), one, cost_model=affine)
           for c in (cluster, slow_cluster)]
    assert agg[0].ttft_s["mean"] == agg[1].ttft_s["mean"]
    with pytest.raises(ConfigError, match="disagg_handoff_s"):
        ServingConfig(disagg_handoff_s=-0.1)


def test_dynamic_sp_beats_fixed_sp_on_mixed_lengths(affine, cluster) -> None:
    from dataclasses import replace

    cm = replace(affine, kv_token_bytes=2e5)
    # One long prompt and several short ones arrive together: fixed SP splits (and
    # all-gathers) every short request too; dynamic SP keeps them on single GPUs.
    reqs = [req(0, 0.0, 6000, 2)] + [req(i, 0.0, 300, 2) for i in range(1, 8)]
    fixed = simulate_serving("debug-llama", cluster, _cfg(sp=2), reqs, cost_model=cm)
    dyn = simulate_serving("debug-llama", cluster, _cfg(sp=2, dynamic_sp=True), reqs,
                           cost_model=cm)
    assert dyn.ttft_s["mean"] < fixed.ttft_s["mean"]
    assert dyn.dynamic_sp_saved_s > 0 and fixed.dynamic_sp_saved_s == 0
    assert dyn.num_gpus == fixed.num_gpus == 2


def test_goodput_slo_and_per_request_parquet(affine, cluster, tmp_path) -> None:
    import pyarrow.parquet as pq

    reqs = [req(i, 0.0, 1000, 10) for i in range(4)]
    # All four prefill in one iteration (4000 tokens), so every TTFT is the same.
    ttft = affine.iteration_s([(1000, 1000)] * 4, 0, 0.0) + OH
    ok = simulate_serving("debug-llama", cluster, _cfg(slo_ttft_s=ttft * 1.01), reqs,
                          cost_model=affine, keep_requests=True)
    bad = simulate_serving("debug-llama", cluster, _cfg(slo_ttft_s=ttft * 0.99), reqs,
                           cost_model=affine)
    assert ok.slo_attainment == 1.0 and ok.goodput_requests_per_s == ok.requests_per_s
    assert bad.slo_attainment == 0.0 and bad.goodput_requests_per_s == 0.0
    path = tmp_path / "req.parquet"
    ok.write_requests_parquet(path)
    table = pq.read_table(path).to_pydict()
    assert table["ttft_s"] == pytest.approx([ttft] * 4)
    assert table["request_id"] == [0, 1, 2, 3]


def test_closed_loop_ramp_and_think_time(affine, cluster) -> None:
    base = {"arrival": "concurrency", "concurrency": 4, "num_requests": 8,
            "input_len": 100, "output_len": 5}
    rep = simulate_serving("debug-llama", cluster, _cfg(), WorkloadSpec.from_dict(
        {**base, "ramp_up_s": 1.0}), cost_model=affine, keep_requests=True)
    pr = rep.per_request
    arrived = dict(zip(pr["request_id"], pr["arrived_at_s"]))
    assert [arrived[i] for i in range(4)] == pytest.approx([0.0, 0.25, 0.5, 0.75])
    lazy = simulate_serving("debug-llama", cluster, _cfg(), WorkloadSpec.from_dict(
        {**base, "think_time_s": 0.5}), cost_model=affine)
    eager = simulate_serving("debug-llama", cluster, _cfg(), WorkloadSpec.from_dict(base),
                             cost_model=affine)
    assert lazy.duration_s > eager.duration_s + 0.2


@pytest.mark.parametrize("chunked", [True, False])
def test_stress_prefix_cache_with_preemption_releases_everything(affine, cluster,
                                                                 chunked) -> None:
    from charon_search.catalog import load_model
    from charon_search.serving.simulator import ServingSimulation

    wl = WorkloadSpec(arrival="gamma", cv=4.0, rate_per_s=200, num_requests=400, seed=9,
                      input_len=LengthDistribution(kind="uniform", low=50, high=900),
                      output_len=LengthDistribution(kind="uniform", low=1, high=300),
                      shared_prefix_tokens=320, num_prefixes=3)
    cfg = _cfg(num_kv_blocks=300, prefix_caching=True, chunked_prefill=chunked,
               max_num_batched_tokens=1024, max_num_seqs=32)
    sim = ServingSimulation(load_model("debug-llama"), cluster, cfg, cost_model=affine)
    reqs = sim.run(wl.generate())
    rep = sim.report(reqs, num_requests=400, closed_loop=False)
    assert rep.num_completed == 400 and rep.num_preemptions > 0
    assert 0 < rep.prefix_hit_rate < 1
    for eng in sim.replicas:
        assert eng.pool.owned_pages == 0
        assert eng.pool.tree.num_pinned == 0
        assert eng.pool.tree.num_blocks <= eng.pool.num_blocks


@pytest.mark.parametrize(("offset", "cached", "misses"), [(0, 0, 8), (0, 8, 0), (3, 3, 5)])
def test_prompt_pool_client_reuses_cached_prompts(affine, cluster, offset, cached,
                                                  misses) -> None:
    """A client drawing 40 requests from a pool of 8 prompts (aiperf's dataset entries): the
    first draw of a prompt that is not cached misses, every later one is a whole-prompt hit
    (63 of 64 blocks: the last block is recomputed). ``cached_prefixes`` stands for a warm-up
    that drew the ``cached`` prompts just before (pool indices ``offset - cached ..
    offset - 1``): with offset 3 and 3 cached, requests 0..4 draw prompts 3..7 (misses) and
    request 5 onwards draws cached ones."""
    wl = WorkloadSpec(arrival="concurrency", concurrency=4, num_requests=40, ramp_up_s=0.0,
                      input_len=LengthDistribution(value=1024),
                      output_len=LengthDistribution(value=2), shared_prefix_tokens=1024,
                      num_prefixes=8, prefix_offset=offset, cached_prefixes=cached)
    assert [pid for pid, _ in wl.warm_prefixes()] == [(offset - cached + j) % 8
                                                      for j in range(cached)]
    rep = simulate_serving("debug-llama", cluster, _cfg(prefix_caching=True), wl,
                           cost_model=affine)
    assert rep.num_completed == 40
    assert rep.prefix_hit_rate == pytest.approx((40 - misses) * 1008 / (40 * 1024))
    off = simulate_serving("debug-llama", cluster, _cfg(prefix_caching=False), wl,
                           cost_model=affine)
    assert off.prefix_hit_rate == 0.0


def test_warm_prefixes_respect_the_kv_capacity(affine, cluster) -> None:
    """A warm-up leaves no more than the KV pool holds, evicting least recently used leaf
    blocks first: three 64-block prompts into 100 blocks keep the newest whole, the leading
    100 - 64 = 36 blocks of the one before, and nothing of the first."""
    from charon_search.catalog import load_model
    from charon_search.serving.simulator import ServingSimulation

    sim = ServingSimulation(load_model("debug-llama"), cluster,
                            _cfg(prefix_caching=True, num_kv_blocks=100), cost_model=affine)
    assert sim.warm_prefix_caches([(0, 1024), (1, 1024), (2, 1024)]) == 3
    tree = sim.replicas[0].pool.tree
    assert tree.num_blocks == 100 and tree.num_pinned == 0
    assert [tree.match([(p, i) for i in range(64)]) for p in (0, 1, 2)] == [0, 36, 64]


# ------------------------------------------------------------------ review checks (session 56)
def test_static_batching_refuses_a_request_larger_than_the_cache(affine, cluster) -> None:
    """10 blocks of 16 tokens hold 160 tokens: a 100 + 100 request never fits (it had run with
    kv_utilization ~1.0, memory beyond capacity)."""
    from charon_search.errors import InfeasibleError

    with pytest.raises(InfeasibleError, match="needs more KV blocks than the cache has"):
        simulate_serving("debug-llama", cluster, _cfg(num_kv_blocks=10, scheduler="static"),
                         [req(0, 0.0, 100, 100)], cost_model=affine)


def test_prefix_hit_rate_counts_each_prompt_once_under_preemption(affine, cluster) -> None:
    """Every prompt is one of 2 shared 512-token prefixes; preemptions re-admit requests that
    re-hit their own blocks. The rate stays a share of prompt tokens (it had reached 1.63)."""
    wl = WorkloadSpec(arrival="burst", num_requests=20, seed=0,
                      input_len=LengthDistribution(value=512),
                      output_len=LengthDistribution(value=300),
                      shared_prefix_tokens=512, num_prefixes=2)
    rep = simulate_serving("debug-llama", cluster, _cfg(num_kv_blocks=200, prefix_caching=True),
                           wl, cost_model=affine, keep_requests=True)
    assert rep.num_preemptions > 0
    assert 0 < rep.prefix_hit_rate <= 1
    assert all(h <= 512 for h in rep.per_request["prefix_hit_tokens"])


def test_speculation_needs_what_it_drafts_with(cluster) -> None:
    from charon_search.serving.config import DisaggConfig, PoolConfig

    wl = WorkloadSpec(num_requests=2, input_len=LengthDistribution(value=64),
                      output_len=LengthDistribution(value=8))
    mtp = SpeculativeConfig(num_draft_tokens=2, acceptance_rate=0.7)
    with pytest.raises(ConfigError, match=r"'mtp' needs a checkpoint with MTP layers .* but "
                                          r"llama-3\.1-8b has none"):
        simulate_serving("llama-3.1-8b", "h100-sxm-8gpu", ServingConfig(speculative=mtp), wl)
    other_vocab = SpeculativeConfig(num_draft_tokens=2, acceptance_rate=0.7, method="draft",
                                    draft_model="mpt-1b")
    with pytest.raises(ConfigError, match="must share the target's vocabulary, but has 50,368"):
        simulate_serving("llama-3.1-8b", "h100-sxm-8gpu",
                         ServingConfig(speculative=other_vocab), wl)
    bigger = SpeculativeConfig(num_draft_tokens=2, acceptance_rate=0.7, method="draft",
                               draft_model="llama-3.1-70b")
    with pytest.raises(ConfigError, match="must be smaller than the target"):
        simulate_serving("llama-3.1-8b", "h100-sxm-8gpu", ServingConfig(speculative=bigger), wl)
    with pytest.raises(ConfigError, match="`speculative` needs a continuous-batching scheduler"):
        ServingConfig(scheduler="static", speculative=mtp)
    pools = DisaggConfig(prefill=PoolConfig(tp=2), decode=PoolConfig(tp=2))
    with pytest.raises(ConfigError, match=r"`sp` .* applies to a colocated replica"):
        ServingConfig(disagg=pools, sp=4)


def test_a_draft_model_holds_memory_and_prefills_the_prompt() -> None:
    """Llama-3.1-8B drafting for Llama-3.1-70B at TP 4 on H100: per GPU the draft holds
    8,030,261,248 x 2 B / 4 = 4.0 GB of weights and 32 layers x 2 x (8/4 heads) x 128 x 2 B =
    32,768 B of KV beside the target's 80 x 2 x 2 x 128 x 2 = 81,920 B per token, so the cache
    holds (A - 4.0 GB) / 114,688 tokens where it held A / 81,920."""
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster
    from charon_search.serving.simulator import kv_capacity_blocks

    model, h100 = load_model("llama-3.1-70b"), load_cluster("h100-sxm-8gpu")
    base = ServingConfig(tp=4)
    spec = base.replace(speculative=SpeculativeConfig(
        num_draft_tokens=3, acceptance_rate=0.0, method="draft", draft_model="llama-3.1-8b"))
    plain = kv_capacity_blocks(model, h100, base, tp=4, pp=1, ep=1) * base.block_size
    drafted = kv_capacity_blocks(model, h100, spec, tp=4, pp=1, ep=1) * base.block_size
    avail = plain * 81_920
    assert drafted == pytest.approx((avail - 8_030_261_248 * 2 / 4) / 114_688, abs=32)
    # The draft also runs the prompt: a lone request's first token comes later with it.
    one = [req(0, 0.0, 2048, 2)]
    t_plain = simulate_serving(model, h100, base, one).ttft_s["mean"]
    t_draft = simulate_serving(model, h100, spec, one).ttft_s["mean"]
    assert t_draft > t_plain * 1.05


def test_mtp_layers_hold_memory_and_run_over_the_prompt(cluster) -> None:
    """debug-moe's MTP layer is a copy of its last (MoE) layer: attention 64 x 64 (q) + 2 x
    64 x 32 (k, v) + 64 x 64 (o) = 12,288, q/k norms 32, layer norms 128, router 64 x 8 = 512,
    experts 8 x 3 x 64 x 32 = 49,152, so 62,112 parameters, plus the 2h x h = 8,192 input
    projection: (62,112 + 8,192) x 2 B = 140,608 B at bf16 on one GPU. Its KV is a third layer
    beside the model's two: 2 x 2 heads x 16 x 2 B = 128 B more per token (256 -> 384)."""
    from charon_search.catalog import load_model
    from charon_search.memory.serving import kv_cache_capacity
    from charon_search.serving.simulator import build_cost_model

    plain = kv_cache_capacity("debug-moe", cluster, tp=1)
    mtp = kv_cache_capacity("debug-moe", cluster, tp=1, mtp_layers=1)
    assert mtp.weights_bytes - plain.weights_bytes == 140_608
    assert (plain.kv_bytes_per_token, mtp.kv_bytes_per_token) == (256, 384)
    with pytest.raises(ConfigError, match="`mtp_layers` must be a non-negative integer"):
        kv_cache_capacity("debug-moe", cluster, tp=1, mtp_layers=-1)
    # The MTP layer also runs over the prompt: a lone request's first token comes exactly one
    # MTP prompt pass later (one chunk of 8,192 tokens, long enough that the GPU, not the
    # host's kernel launches, sets the prefill's time).
    base = _cfg(num_kv_blocks=1000)
    spec = base.replace(speculative=SpeculativeConfig(num_draft_tokens=2, acceptance_rate=0.0))
    one = [req(0, 0.0, 8192, 2)]
    t_plain = simulate_serving("debug-moe", cluster, base, one).ttft_s["mean"]
    t_mtp = simulate_serving("debug-moe", cluster, spec, one).ttft_s["mean"]
    cost = build_cost_model(load_model("debug-moe"), cluster, base)
    assert cost.mtp_prefill_s([(8192, 8192)]) > 0
    assert t_mtp - t_plain == pytest.approx(cost.mtp_prefill_s([(8192, 8192)]), rel=1e-6)


def test_sequence_parallel_replica_holds_sp_times_the_kv(cluster) -> None:
    from charon_search.catalog import load_model
    from charon_search.serving.simulator import kv_capacity_blocks

    model = load_model("debug-llama")
    one = kv_capacity_blocks(model, cluster, ServingConfig(), tp=1, pp=1, ep=1)
    assert kv_capacity_blocks(model, cluster, ServingConfig(sp=4), tp=1, pp=1, ep=1) == 4 * one
