"""Per-engine scheduler policies (prefill-first, prefill-only budget, no-evict admission), the
engine's front-end latency, and the engine profiles that select them, against closed forms of
the affine cost model."""

from __future__ import annotations

import dataclasses

import pytest

from charon_search.errors import ConfigError
from charon_search.serving import (
    LengthDistribution,
    RequestSpec,
    ServingConfig,
    WorkloadSpec,
    simulate_serving,
)
from charon_search.serving.backends import engine_profile, release
from charon_search.testing import TOY_CALIBRATION, toy_cluster

OH = 1e-3


def _req(i: int, t: float, prompt: int, out: int) -> RequestSpec:
    return RequestSpec(request_id=i, arrived_at_s=t, prompt_tokens=prompt, output_tokens=out)


def _cfg(**kw):  # type: ignore[no-untyped-def]
    base = {"num_kv_blocks": 20000, "iteration_overhead_s": OH, "cuda_graph": False}
    base.update(kw)
    return ServingConfig(**base)


def _per(rep):  # type: ignore[no-untyped-def]
    p = rep.per_request
    return {i: (a, t, e) for i, a, t, e in zip(p["request_id"], p["arrived_at_s"], p["ttft_s"],
                                               p["e2e_s"], strict=True)}


def test_prefill_first_runs_prefill_batches_alone(affine, cluster) -> None:
    # Three 1000-token prompts at t = 0, one per prefill batch (max_prefill_tokens 1000):
    # request i gets its first token after i + 1 prefill iterations, and nobody decodes until
    # all three are prefilled, so all finish together (SGLang without mixed chunk).
    reqs = [_req(i, 0.0, 1000, 5) for i in range(3)]
    cfg = _cfg(prefill_schedule="prefill_first", max_prefill_tokens=1000)
    rep = simulate_serving("debug-llama", cluster, cfg, reqs, cost_model=affine,
                           keep_requests=True)
    prefill = affine.iteration_s([(1000, 1000)], 0, 0.0) + OH
    per = _per(rep)
    for i in range(3):
        assert per[i][1] == pytest.approx((i + 1) * prefill, rel=1e-12)
    assert per[0][2] == pytest.approx(per[2][2], rel=1e-12)
    assert rep.num_iterations == 3 + 4  # three prefill batches, four decode steps
    # Mixed (vLLM): the three prompts share one iteration and one first-token time.
    mixed = simulate_serving("debug-llama", cluster, _cfg(), reqs, cost_model=affine,
                             keep_requests=True)
    ttfts = {round(v[1], 12) for v in _per(mixed).values()}
    assert len(ttfts) == 1 and mixed.num_iterations == 1 + 4


def test_prefill_first_keeps_closed_loop_waves_in_lock_step(affine, cluster) -> None:
    wl = WorkloadSpec(arrival="concurrency", concurrency=4, num_requests=12, ramp_up_s=0.0,
                      input_len=LengthDistribution(value=800),
                      output_len=LengthDistribution(value=20))
    cfg = _cfg(prefill_schedule="prefill_first", max_prefill_tokens=800)
    rep = simulate_serving("debug-llama", cluster, cfg, wl, cost_model=affine,
                           keep_requests=True)
    per = _per(rep)
    # Every wave finishes together, so the next one starts together and repeats the first.
    for i in range(4, 12):
        assert per[i][1] == pytest.approx(per[i - 4][1], rel=1e-9)
    assert per[3][1] == pytest.approx(4 * per[0][1], rel=1e-9)


def test_prefill_budget_without_decode_tokens(affine, cluster) -> None:
    # Two requests decode when a 1000-token prompt arrives; budget 1000. vLLM counts the two
    # decode tokens against the budget (chunk 998 + 2 tokens next iteration); SGLang's
    # chunked-prefill size is for prompt tokens only (the whole prompt in one iteration).
    reqs = [_req(0, 0.0, 10, 200), _req(1, 0.0, 10, 200), _req(2, 0.05, 1000, 5)]
    out = {}
    for flag in (True, False):
        rep = simulate_serving("debug-llama", cluster,
                               _cfg(max_num_batched_tokens=1000, decode_in_budget=flag), reqs,
                               cost_model=affine, keep_requests=True)
        out[flag] = _per(rep)[2][1]
    second = affine.iteration_s([(2, 1000)], 2, 2 * 60.0) + OH  # the extra iteration
    assert out[True] - out[False] == pytest.approx(second, rel=0.05)


def test_reserve_max_admission_never_preempts(affine, cluster) -> None:
    # 64 blocks of 16 tokens; each request needs ceil((300 + 300) / 16) = 38 blocks at the end,
    # so only one fits under GUARANTEED_NO_EVICT, while on-demand admits more and preempts.
    wl = WorkloadSpec(arrival="concurrency", concurrency=3, num_requests=6, ramp_up_s=0.0,
                      input_len=LengthDistribution(value=300),
                      output_len=LengthDistribution(value=300))
    demand = simulate_serving("debug-llama", cluster, _cfg(num_kv_blocks=64), wl,
                              cost_model=affine)
    reserve = simulate_serving("debug-llama", cluster,
                               _cfg(num_kv_blocks=64, kv_admission="reserve_max"), wl,
                               cost_model=affine)
    assert demand.num_preemptions > 0
    assert reserve.num_preemptions == 0 and reserve.num_completed == 6
    # One request at a time: six back-to-back lifetimes, each longer than one request alone.
    alone = simulate_serving("debug-llama", cluster, _cfg(num_kv_blocks=64),
                             [_req(0, 0.0, 300, 300)], cost_model=affine)
    assert reserve.duration_s == pytest.approx(6 * alone.e2e_s["mean"], rel=1e-9)


def test_engine_profiles_carry_the_launch_facts() -> None:
    v = engine_profile("vllm", isl=2000, max_batch_size=64)
    # aiconfigurator's launches disable prefix caching unless the model config states a prefix;
    # vLLM's own default caches.
    assert (v.prefill_schedule, v.max_num_batched_tokens, v.prefix_caching) == (
        "mixed", 8192, False)
    assert engine_profile("vllm", isl=2000, max_batch_size=64,
                          launcher="engine_defaults").prefix_caching
    s_old = engine_profile("sglang", isl=2000, max_batch_size=64, version="0.5.1.post1")
    s_new = engine_profile("sglang", isl=2000, max_batch_size=64, version="0.5.6.post2")
    assert s_old.prefill_schedule == "prefill_first" and s_new.prefill_schedule == "mixed"
    assert s_old.max_prefill_tokens == 3500 and not s_old.decode_in_budget
    t = engine_profile("trtllm", isl=2000, max_batch_size=64)
    assert t.max_num_batched_tokens == 64 + 2000 + 1500 and not t.chunked_prefill
    assert t.kv_admission == "reserve_max"
    assert all(p.sources for p in (v, s_old, t))
    ServingConfig(**t.config_kwargs())  # valid config fields
    with pytest.raises(ConfigError, match="backend"):
        engine_profile("tgi", isl=1, max_batch_size=1)


def test_policy_fields_are_validated() -> None:
    with pytest.raises(ConfigError, match="prefill_schedule"):
        ServingConfig(prefill_schedule="fifo")
    with pytest.raises(ConfigError, match="kv_admission"):
        ServingConfig(kv_admission="lazy")
    with pytest.raises(ConfigError, match="max_prefill_tokens"):
        ServingConfig(max_prefill_tokens=-1)


def test_batch_waiting_holds_prompts_for_the_timeout(affine, cluster) -> None:
    # Request 0 decodes alone; request 1 arrives during request 0's prefill. TensorRT-LLM batch
    # waiting (timeout 3 iterations, a token threshold the batch never reaches) holds request 1
    # for exactly three decode-only iterations before it is let in; a threshold the prompt
    # alone reaches lets it in at once.
    reqs = [_req(0, 0.0, 100, 50), _req(1, 1e-6, 100, 5)]
    base = simulate_serving("debug-llama", cluster, _cfg(), reqs, cost_model=affine,
                            keep_requests=True)
    held = simulate_serving("debug-llama", cluster,
                            _cfg(batch_wait_iters=3, batch_wait_tokens=10_000), reqs,
                            cost_model=affine, keep_requests=True)
    reached = simulate_serving("debug-llama", cluster,
                               _cfg(batch_wait_iters=3, batch_wait_tokens=101), reqs,
                               cost_model=affine, keep_requests=True)
    step = affine.iteration_s([], 1, 101.0) + OH  # one decode of request 0 (~101 tokens of KV)
    delay = _per(held)[1][1] - _per(base)[1][1]
    assert delay == pytest.approx(3 * step, rel=0.02)
    assert _per(reached)[1][1] == pytest.approx(_per(base)[1][1], rel=1e-12)
    with pytest.raises(ConfigError, match="batch_wait_iters"):
        ServingConfig(batch_wait_iters=-1)


def test_overlap_scheduler_forms_each_batch_one_iteration_ahead(affine, cluster) -> None:
    # The overlap scheduler forms batch n + 1 when batch n starts. Request 0 decodes alone.
    # (a) A prompt arriving in the middle of a decode iteration misses the next batch (already
    # formed) and joins the one after: its TTFT grows by exactly one decode iteration.
    # (b) In a closed loop the next prompt arrives at the instant a request finishes, when the
    # following batch is formed (and its response is sent): it misses two batches, +2 steps.
    # (c) A prompt reaching an idle engine is not delayed (nothing overlaps).
    from charon_search.serving.simulator import ServingSimulation, _resolve

    off_cfg = _cfg(iteration_overhead_s=0.0)
    on_cfg = _cfg(iteration_overhead_s=0.0, overlap_scheduler=True)
    alone = simulate_serving("debug-llama", cluster, off_cfg, [_req(0, 0.0, 100, 200)],
                             cost_model=affine, keep_requests=True)
    prefill = _per(alone)[0][1]
    step = affine.iteration_s([], 1, 110.0)  # one decode of request 0 (~110 tokens of KV)
    reqs = [_req(0, 0.0, 100, 200), _req(1, prefill + 10.5 * step, 100, 5)]
    off, on = (simulate_serving("debug-llama", cluster, c, reqs, cost_model=affine,
                                keep_requests=True) for c in (off_cfg, on_cfg))
    assert _per(on)[1][1] - _per(off)[1][1] == pytest.approx(step, rel=0.05)
    assert _per(on)[0][1] == pytest.approx(prefill, rel=1e-12)

    loop = [_req(0, 0.0, 100, 200), _req(1, 0.0, 100, 5), _req(2, 0.0, 100, 5)]
    ttft = {}
    for name, c in (("off", off_cfg), ("on", on_cfg)):
        sim = ServingSimulation(*_resolve("debug-llama", cluster), c, cost_model=affine)
        done = sim.run(loop, closed_loop_concurrency=2, ramp_up_s=0.0)
        third = next(r for r in done if r.spec.request_id == 2)
        ttft[name] = third.first_token_s - third.arrived_s
    assert ttft["on"] - ttft["off"] == pytest.approx(2 * step, rel=0.05)
    assert engine_profile("trtllm", isl=1024, max_batch_size=8).overlap_scheduler
    assert engine_profile("sglang", isl=1024, max_batch_size=8).overlap_scheduler
    assert not engine_profile("vllm", isl=1024, max_batch_size=8).overlap_scheduler


def test_custom_allreduce_uses_the_engine_measurement() -> None:
    from charon_search.serving.custom_allreduce import custom_allreduce_s

    # aiconfigurator-core h200_sxm/comm/trtllm/1.2.0rc5: 65536 bf16 elements (131072 B) over
    # 8 GPUs take 6.765 us (the table row); NCCL's model charges about 18 us for the same.
    assert custom_allreduce_s("trtllm", "h200-sxm-141gb", 8, 131072) == pytest.approx(
        6.765e-6, rel=1e-9)
    small = custom_allreduce_s("trtllm", "h200-sxm-141gb", 8, 4096)
    big = custom_allreduce_s("trtllm", "h200-sxm-141gb", 8, 1 << 24)
    assert small is not None and big is not None and small < 6.765e-6 < big
    assert custom_allreduce_s("trtllm", "h200-sxm-141gb", 16, 131072) is None  # leaves the node
    assert custom_allreduce_s("vllm", "a40-48gb", 2, 131072) is None  # not measured
    with pytest.raises(ConfigError, match="tp_allreduce"):
        ServingConfig(tp_allreduce="mpi")


def test_custom_allreduce_covers_blackwell() -> None:
    from charon_search.catalog import load_model
    from charon_search.hardware.loader import load_cluster
    from charon_search.serving._graphs import serving_graphs
    from charon_search.serving.custom_allreduce import custom_allreduce_s, table_gpus
    from charon_search.serving.iteration_cost import collective_s, graph_cost_fn

    cluster = load_cluster("b200-8gpu")
    gpu = cluster.gpu.name
    assert {gpu, "b300-sxm-288gb", "gb200", "gb300"} <= table_gpus()
    # aiconfigurator-core b200_sxm/comm/trtllm/1.2.0rc5: 65536 bf16 elements (131072 B) over
    # 8 GPUs take 0.006579 ms (the table row); NCCL's model charges about 27 us for the same.
    assert custom_allreduce_s("trtllm", gpu, 8, 131072) == pytest.approx(6.579e-6, rel=1e-9)
    assert collective_s("all_reduce", 131072, 8, cluster) > 3 * 6.579e-6
    # b200_sxm/comm/vllm/0.19.0: 4096 elements (8192 B) over 4 GPUs, vLLM_custom_graph
    # 0.007387 ms (vLLM_custom_eager 0.020921 ms; the graph kernel is kept). A TP-4 decode
    # step's all-reduces on the B200 cluster cost exactly that.
    _, decode = serving_graphs(load_model("debug-llama"), tp=4, pp=1, ep=1, dp_attention=False,
                               precision="bf16", engine="vllm")
    graph = decode["dense"]
    cost = graph_cost_fn(cluster, tp_allreduce="vllm")(graph, 64, 1, 300)
    reduces = [i for i, n in enumerate(graph.nodes) if n.kind.value == "all_reduce"]
    assert reduces and all(graph.nodes[i].param("bytes")(64, 1, 300) == 8192 for i in reduces)
    assert cost[reduces] == pytest.approx(7.387e-6, rel=1e-9)


def test_trtllm_allreduce_across_nvl72_trays() -> None:
    """A TP-8 group on GB200 NVL72 spans two 4-GPU trays of one NVLink domain: TensorRT-LLM
    runs its NVLink all-reduce there, priced from the HGX B200 8-GPU table (same GPU and NVLink
    generation, whose 2- and 4-GPU rows match GB200's own); vLLM falls back to NCCL."""
    from charon_search.catalog import load_model
    from charon_search.hardware.loader import load_cluster
    from charon_search.serving._graphs import serving_graphs
    from charon_search.serving.custom_allreduce import (
        MNNVL_PROXY,
        custom_allreduce_s,
        mnnvl_allreduce_s,
    )
    from charon_search.serving.iteration_cost import collective_s, graph_cost_fn

    for gpu, proxy in MNNVL_PROXY.items():
        for n in (2, 4):
            for nbytes in (256, 8192, 131072, 1 << 20):
                own = custom_allreduce_s("trtllm", gpu, n, nbytes)
                assert own == pytest.approx(custom_allreduce_s("trtllm", proxy, n, nbytes),
                                            rel=0.15), (gpu, n, nbytes)
    # aiconfigurator-core b200_sxm/comm/trtllm: 65536 bf16 elements over 8 GPUs, 0.006579 ms.
    assert mnnvl_allreduce_s("trtllm", "gb200", 8, 131072) == pytest.approx(6.579e-6, rel=1e-9)
    assert mnnvl_allreduce_s("vllm", "gb200", 8, 131072) is None
    assert mnnvl_allreduce_s("trtllm", "h200-sxm-141gb", 8, 131072) is None

    cluster = load_cluster("gb200-nvl72")
    assert cluster.gpus_per_node == 4 and cluster.tiers[0].num_devices == 72
    _, decode = serving_graphs(load_model("llama-3.1-8b"), tp=8, pp=1, ep=1, dp_attention=False,
                               precision="bf16", engine="trtllm")
    graph = decode["dense"]
    reduces = [i for i, n in enumerate(graph.nodes) if n.kind.value == "all_reduce"]
    nbytes = graph.nodes[reduces[0]].param("bytes")(64, 1, 300)
    trt = graph_cost_fn(cluster, tp_allreduce="trtllm")(graph, 64, 1, 300)
    vllm = graph_cost_fn(cluster, tp_allreduce="vllm")(graph, 64, 1, 300)
    assert trt[reduces] == pytest.approx(mnnvl_allreduce_s("trtllm", "gb200", 8, nbytes))
    assert vllm[reduces] == pytest.approx(collective_s("all_reduce", nbytes, 8, cluster))
    assert (trt[reduces] < vllm[reduces] / 2).all()


def test_inferencex_recipes_set_launch_facts() -> None:
    # 70b_fp8_h200_trt_slurm.sh: --max_num_tokens 16384; batch waiting 0.9 x 16384 / 20
    # iterations only at 1k/1k below TP 8.
    w = engine_profile("trtllm", isl=1024, max_batch_size=8, launcher="inferencex", osl=1024,
                       tp=2, model="meta-llama/Llama-3.1-70B")
    assert (w.max_num_batched_tokens, w.batch_wait_iters, w.batch_wait_tokens) == (
        16384, 20, 14745)
    n = engine_profile("trtllm", isl=1024, max_batch_size=8, launcher="inferencex", osl=1024,
                       tp=8, model="meta-llama/Llama-3.1-70B")
    assert n.batch_wait_iters == 0
    g = engine_profile("trtllm", isl=8192, max_batch_size=8, launcher="inferencex", osl=1024,
                       tp=4, model="openai/gpt-oss-120b")
    assert g.max_num_batched_tokens == 20000
    v = engine_profile("vllm", isl=1024, max_batch_size=8, launcher="inferencex",
                       model="openai/gpt-oss-120b")
    assert v.iteration_overhead_s == 0.0 and not v.prefix_caching  # async scheduling
    other = engine_profile("vllm", isl=1024, max_batch_size=8, launcher="inferencex",
                           model="moonshotai/Kimi-K2.5")
    assert other.iteration_overhead_s is None  # no recipe, no version: engine defaults
    assert any("no InferenceX vLLM recipe" in s for s in other.sources)
    # MiniMax-M2.5: some recipe facts are taken, the rest differ between stored versions.
    mm = engine_profile("vllm", isl=1024, max_batch_size=8, launcher="inferencex",
                        model="MiniMaxAI/MiniMax-M2.5")
    assert mm.iteration_overhead_s is None
    assert not any("no InferenceX vLLM recipe" in s for s in mm.sources)
    assert any("only the facts named above are taken" in s for s in mm.sources)
    for p in (w, n, g, v):
        ServingConfig(**p.config_kwargs())
    # Piecewise CUDA graphs: gpt-oss and MiniMax recipes capture up to 2048 tokens; the B200
    # Llama recipe runs FULL_DECODE_ONLY (none), the H200 one vLLM's default 2 x max-num-seqs;
    # aiconfigurator lists sizes 1..max_batch_size.
    llama = {gpu: engine_profile("vllm", isl=1024, max_batch_size=8, launcher="inferencex",
                                 model="meta-llama/Llama-3.1-70B", gpu=gpu)
             for gpu in ("b200-sxm-180gb", "h200-sxm-141gb")}
    aic = engine_profile("vllm", isl=1024, max_batch_size=24, launcher="aiconfigurator")
    assert [p.piecewise_graph_tokens for p in (v, mm, llama["b200-sxm-180gb"],
                                               llama["h200-sxm-141gb"], aic)] == [
        2048, 2048, 0, 16, 24]
    assert ServingConfig(**v.config_kwargs()).piecewise_graph_tokens == 2048


def test_stream_interval_moves_the_first_chunk_to_the_kth_token(affine, cluster) -> None:
    """SGLang ``--stream-interval k`` sends output when its length is a multiple of k: the
    client's TTFT is the k-th token's arrival (placed at the request's mean token interval
    after the first) and its TPOT = (E2E - TTFT) / (n - 1) shrinks by (n - k) / (n - 1)."""
    reqs = [_req(0, 0.0, 500, 50), _req(1, 0.0, 300, 5)]
    plain = simulate_serving("debug-llama", cluster, _cfg(), reqs, cost_model=affine,
                             keep_requests=True).per_request
    k10 = simulate_serving("debug-llama", cluster, _cfg(stream_interval=10), reqs,
                           cost_model=affine, keep_requests=True).per_request
    assert plain is not None and k10 is not None
    for i, n in enumerate((50, 5)):
        gap = plain["tpot_s"][i]  # (E2E - TTFT) / (n - 1) of the first token
        k = min(10, n)  # a 5-token answer is sent whole when it finishes
        assert k10["ttft_s"][i] == pytest.approx(plain["ttft_s"][i] + (k - 1) * gap, rel=1e-9)
        assert k10["e2e_s"][i] == pytest.approx(plain["e2e_s"][i], rel=1e-12)
        assert k10["tpot_s"][i] == pytest.approx(gap * (n - k) / (n - 1), rel=1e-9, abs=1e-15)
    with pytest.raises(ConfigError, match="`stream_interval` must be a positive integer"):
        _cfg(stream_interval=0)


# ------------------------------------------------------------------ front-end latency
def test_one_request_pays_the_latency_once_in_ttft_and_e2e(affine, cluster) -> None:
    one = [_req(0, 0.0, 1000, 10)]
    base = simulate_serving("debug-llama", cluster, _cfg(), one, cost_model=affine)
    slow = simulate_serving("debug-llama", cluster, _cfg(frontend_latency_s=0.05), one,
                            cost_model=affine)
    assert slow.ttft_s["mean"] - base.ttft_s["mean"] == pytest.approx(0.05, rel=1e-9)
    assert slow.e2e_s["mean"] - base.e2e_s["mean"] == pytest.approx(0.05, rel=1e-9)
    assert slow.tpot_s["mean"] == pytest.approx(base.tpot_s["mean"], rel=1e-12)


def test_prompt_token_time_grows_with_the_prompt(affine, cluster) -> None:
    """5 us per prompt token: a lone 1000-token prompt reaches the engine 5 ms later and a
    4000-token one 20 ms later (TTFT and E2E, not TPOT); with a 10 ms fixed latency on top
    both add up."""
    for prompt, extra in ((1000, 0.005), (4000, 0.020)):
        one = [_req(0, 0.0, prompt, 10)]
        base = simulate_serving("debug-llama", cluster, _cfg(), one, cost_model=affine)
        slow = simulate_serving("debug-llama", cluster, _cfg(frontend_prompt_token_s=5e-6),
                                one, cost_model=affine)
        both = simulate_serving("debug-llama", cluster,
                                _cfg(frontend_prompt_token_s=5e-6, frontend_latency_s=0.01),
                                one, cost_model=affine)
        assert slow.ttft_s["mean"] - base.ttft_s["mean"] == pytest.approx(extra, rel=1e-9)
        assert slow.e2e_s["mean"] - base.e2e_s["mean"] == pytest.approx(extra, rel=1e-9)
        assert slow.tpot_s["mean"] == pytest.approx(base.tpot_s["mean"], rel=1e-12)
        assert both.ttft_s["mean"] - base.ttft_s["mean"] == pytest.approx(extra + 0.01,
                                                                          rel=1e-9)


@pytest.mark.parametrize("field", ["frontend_output_token_s", "frontend_output_stream_s"])
def test_output_tokens_reach_clients_through_the_front_end_queue(affine, cluster,
                                                                 field) -> None:
    """A lone request: every iteration emits one token and ends more than 1 ms after the last
    (5 ms base cost), so the front end is idle when each token comes and delays it by exactly
    its 1 ms per token, or per stream in a cycle of one stream: TTFT and E2E +1 ms, TPOT
    unchanged."""
    one = [_req(0, 0.0, 100, 10)]
    base = simulate_serving("debug-llama", cluster, _cfg(), one, cost_model=affine)
    slow = simulate_serving("debug-llama", cluster, _cfg(**{field: 1e-3}), one,
                            cost_model=affine)
    assert slow.ttft_s["mean"] - base.ttft_s["mean"] == pytest.approx(1e-3, rel=1e-9)
    assert slow.e2e_s["mean"] - base.e2e_s["mean"] == pytest.approx(1e-3, rel=1e-9)
    assert slow.tpot_s["mean"] == pytest.approx(base.tpot_s["mean"], rel=1e-9)
    with pytest.raises(ConfigError, match=field):
        ServingConfig(**{field: -1e-6})


def test_a_saturated_front_end_caps_the_output_rate_a_cycling_one_lags(affine,
                                                                      cluster) -> None:
    """32 closed-loop streams of 64-token outputs; the engine alone emits ~4,000 tokens/s, but
    a front end taking 1 ms per token delivers 1,000/s, so by Little's law each request lasts
    32 x 64 x 1 ms ~ 2 s from its client's view (the engine runs ahead; its tokens wait in
    the front end's queue, mostly before the first one reaches the client)."""
    wl = WorkloadSpec(arrival="concurrency", concurrency=32, num_requests=320, seed=3,
                      input_len=LengthDistribution(value=128),
                      output_len=LengthDistribution(value=64))
    base = simulate_serving("debug-llama", cluster, _cfg(), wl, cost_model=affine)
    slow = simulate_serving("debug-llama", cluster, _cfg(frontend_output_token_s=1e-3), wl,
                            cost_model=affine)
    assert base.output_tokens_per_s > 3500
    assert base.e2e_s["mean"] < 0.5
    assert slow.output_tokens_per_s == pytest.approx(1000, rel=0.03)
    assert slow.e2e_s["mean"] == pytest.approx(32 * 64 * 1e-3, rel=0.07)
    assert slow.ttft_s["mean"] > 0.5 * slow.e2e_s["mean"]
    # The report says who bounds the rate: 1,000 tokens/s x 1 ms = a front end busy throughout.
    assert slow.frontend_busy == pytest.approx(1.0, rel=0.03)
    assert f"front end busy {slow.frontend_busy:.0%}" in slow.summary()
    assert base.frontend_busy == 0.0 and "front end" not in base.summary()
    # A front end cycling at 1 ms per *stream* (``frontend_output_stream_s``) instead: a cycle
    # serves all 32 (32 ms, longer than an engine step), so tokens wait for the running cycle
    # (16 ms on average) and reach the client in the middle of the next (16.5 ms): ~32.5 ms
    # more in TTFT and E2E, while TPOT stays the engine's and the rate is not capped (the
    # tokens a request got meanwhile merge into one chunk).
    cyc = simulate_serving("debug-llama", cluster, _cfg(frontend_output_stream_s=1e-3), wl,
                           cost_model=affine)
    lag = 32 / 2 * 1e-3 + (32 + 1) / 2 * 1e-3
    assert cyc.ttft_s["mean"] - base.ttft_s["mean"] == pytest.approx(lag, rel=0.1)
    assert cyc.e2e_s["mean"] - base.e2e_s["mean"] == pytest.approx(lag, rel=0.1)
    assert cyc.tpot_s["mean"] == pytest.approx(base.tpot_s["mean"], rel=0.05)
    assert cyc.output_tokens_per_s > 3 * slow.output_tokens_per_s
    assert cyc.frontend_busy == pytest.approx(1.0, rel=0.05)  # cycles back to back


def test_dynamo_streams_through_one_worker_per_replica(affine, cluster) -> None:
    """Two replicas, 32 closed-loop streams each, 1 ms per token: the engine's own server has
    one front end for both (1,000 tokens/s in all), Dynamo a worker per replica (2,000/s,
    each busy throughout). The cluster keys Dynamo's time by its name, for every engine."""
    wl = WorkloadSpec(arrival="concurrency", concurrency=64, num_requests=640, seed=3,
                      input_len=LengthDistribution(value=128),
                      output_len=LengthDistribution(value=64))
    own = simulate_serving("debug-llama", cluster, _cfg(dp=2, frontend_output_token_s=1e-3),
                           wl, cost_model=affine)
    dyn = simulate_serving("debug-llama", cluster,
                           _cfg(dp=2, frontend="dynamo", frontend_output_token_s=1e-3), wl,
                           cost_model=affine)
    assert own.output_tokens_per_s == pytest.approx(1000, rel=0.03)
    assert dyn.output_tokens_per_s == pytest.approx(2000, rel=0.05)  # two replicas' tails
    assert own.frontend_busy == pytest.approx(1.0, rel=0.03)
    assert dyn.frontend_busy == pytest.approx(1.0, rel=0.05)
    cal = dataclasses.replace(TOY_CALIBRATION, frontend_output_token_s={"dynamo": 1e-3})
    keyed = toy_cluster(calibration=cal)
    one = [_req(0, 0.0, 256, 4)]
    ttft = {fe: simulate_serving("debug-llama", keyed, _cfg(engine="trtllm", frontend=fe), one,
                                 cost_model=affine).ttft_s["mean"] for fe in ("", "dynamo")}
    assert ttft["dynamo"] - ttft[""] == pytest.approx(1e-3, rel=1e-9)
    with pytest.raises(ConfigError, match=r"frontend.*dynamo"):
        ServingConfig(frontend="nginx")


def test_prompt_token_time_is_the_tokenizing_process(affine) -> None:
    """The prompt's per-token time belongs to whichever process turns it into token ids: the
    engine's own server (``vllm`` here, 10 us per token) or Dynamo's front end (``dynamo``,
    2 us) when Dynamo serves the engine. One 1000-token prompt: +10 ms own server, +2 ms
    through Dynamo, not the vLLM server's 10 ms."""
    cal = dataclasses.replace(TOY_CALIBRATION,
                              frontend_prompt_token_s={"vllm": 1e-5, "dynamo": 2e-6})
    keyed = toy_cluster(calibration=cal)
    one = [_req(0, 0.0, 1000, 4)]

    def ttft(**kw):  # type: ignore[no-untyped-def]
        return simulate_serving("debug-llama", keyed, _cfg(**kw), one,
                                cost_model=affine).ttft_s["mean"]

    base = ttft(engine="vllm", frontend_prompt_token_s=0.0)
    assert ttft(engine="vllm") - base == pytest.approx(0.010, rel=1e-9)
    assert ttft(engine="vllm", frontend="dynamo") - base == pytest.approx(0.002, rel=1e-9)


def test_closed_loop_keeps_littles_law_with_the_latency_in_e2e(affine, cluster) -> None:
    """C streams, each request's E2E from its client's send: throughput x E2E = C."""
    wl = WorkloadSpec(arrival="concurrency", concurrency=8, num_requests=800, seed=3,
                      input_len=LengthDistribution(value=512),
                      output_len=LengthDistribution(value=64))
    base = simulate_serving("debug-llama", cluster, _cfg(), wl, cost_model=affine)
    slow = simulate_serving("debug-llama", cluster, _cfg(frontend_latency_s=0.04), wl,
                            cost_model=affine)
    for rep in (base, slow):
        assert rep.requests_per_s * rep.e2e_s["mean"] == pytest.approx(8, rel=0.02)
    # 40 ms outside the engine per request: fewer requests inside it, fewer per second.
    assert slow.ttft_s["mean"] >= base.ttft_s["mean"] + 0.04 * 0.9
    assert slow.requests_per_s < base.requests_per_s


@pytest.mark.parametrize(("field", "value"), [("frontend_latency_s", 0.03),
                                            ("frontend_prompt_token_s", 0.03 / 256),
                                            ("frontend_output_token_s", 0.03),
                                            ("frontend_output_stream_s", 0.03),
                                            ("prefill_iteration_overhead_s", 0.03)])
def test_cluster_calibration_supplies_the_engines_time(affine, field, value) -> None:
    """The cluster's per-engine value applies to that engine's configurations only (one
    256-token prompt: one prompt iteration, so each time adds 30 ms to TTFT once); an
    explicit value in the configuration wins."""
    cal = dataclasses.replace(TOY_CALIBRATION, **{field: {"trtllm": value}})
    cluster = toy_cluster(calibration=cal)
    one = [_req(0, 0.0, 256, 4)]
    ttft = {eng: simulate_serving("debug-llama", cluster, _cfg(engine=eng), one,
                                  cost_model=affine).ttft_s["mean"]
            for eng in ("", "vllm", "trtllm")}
    assert ttft["vllm"] == ttft[""]  # no calibrated value for vllm: none
    assert ttft["trtllm"] - ttft[""] == pytest.approx(0.03, rel=1e-9)
    explicit = simulate_serving("debug-llama", cluster, _cfg(engine="trtllm", **{field: 0.0}),
                                one, cost_model=affine)
    assert explicit.ttft_s["mean"] == ttft[""]  # an explicit value wins over the cluster's
    with pytest.raises(ConfigError, match=field):
        ServingConfig(**{field: -0.01})


def test_bad_values_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"engine.*trtllm"):
        ServingConfig(engine="tgi")


# ------------------------------------------------------------------ prompt-iteration overhead
def test_prompt_iterations_pay_the_overhead_once_per_chunk(affine, cluster) -> None:
    """A 1000-token prompt in 256-token chunks takes four prompt iterations: TTFT grows by
    4 X; the decode-only steps after it do not pay X, so TPOT is unchanged."""
    one = [_req(0, 0.0, 1000, 10)]
    kw = dict(max_num_batched_tokens=256)
    base = simulate_serving("debug-llama", cluster, _cfg(**kw), one, cost_model=affine)
    slow = simulate_serving("debug-llama", cluster,
                            _cfg(prefill_iteration_overhead_s=0.02, **kw), one,
                            cost_model=affine)
    assert slow.ttft_s["mean"] - base.ttft_s["mean"] == pytest.approx(4 * 0.02, rel=1e-9)
    assert slow.tpot_s["mean"] == pytest.approx(base.tpot_s["mean"], rel=1e-12)
    assert slow.num_iterations == base.num_iterations


def test_decodes_sharing_a_prompt_iteration_pay_it_too(affine, cluster) -> None:
    """Request 0 (100 + 50 tokens) decodes while request 1's 1000-token prompt runs in one
    mixed iteration: 0's E2E grows by exactly 2 X (its own prompt iteration and 1's); 1's TTFT
    by X plus at most one of 0's decode steps (where its arrival falls in them moves)."""
    reqs = [_req(0, 0.0, 100, 50), _req(1, 0.06, 1000, 2)]
    x = 0.015
    per = [_per(simulate_serving("debug-llama", cluster,
                                 _cfg(prefill_iteration_overhead_s=v), reqs,
                                 cost_model=affine, keep_requests=True))
           for v in (0.0, x)]
    assert per[1][0][2] - per[0][0][2] == pytest.approx(2 * x, rel=1e-9)
    step = affine.iteration_s([], 1, 150.0) + OH
    assert x - 1e-12 <= per[1][1][1] - per[0][1][1] <= x + step


# ------------------------------------------------------------------ eager host time per kernel
def test_eager_iterations_last_at_least_kernels_times_the_host_time(affine) -> None:
    """The cluster's ``eager_kernel_host_s[vllm]`` of 50 us and 1000 operators: vLLM's prompt
    iteration (no CUDA graph) lasts max(GPU, 50 ms) = 50 ms, so TTFT grows by exactly 50 ms
    minus the GPU time; decode steps replaying a captured graph do not pay it (TPOT unchanged),
    uncaptured ones do; other engines keep the 4 us launch floor; a larger configured launch
    cost wins."""
    kernels, host = 1000, 50e-6
    model = dataclasses.replace(affine, num_kernels=kernels)
    cal = dataclasses.replace(TOY_CALIBRATION, eager_kernel_host_s={"vllm": host})
    cluster = toy_cluster(calibration=cal)
    one = [_req(0, 0.0, 256, 4)]

    def run(engine: str, **kw):  # type: ignore[no-untyped-def]
        return simulate_serving("debug-llama", cluster, _cfg(engine=engine, **kw), one,
                                cost_model=model)

    graphs = dict(cuda_graph=True, cuda_graph_sizes=(1, 2, 4))
    gpu_prefill = model.iteration_s([(256, 256)], 0, 0.0)
    assert gpu_prefill < kernels * host  # the host bound is the binding one here
    base, vllm, trt = run("", **graphs), run("vllm", **graphs), run("trtllm", **graphs)
    assert vllm.ttft_s["mean"] - base.ttft_s["mean"] == pytest.approx(
        kernels * host - gpu_prefill, rel=1e-9)
    assert vllm.tpot_s["mean"] == pytest.approx(base.tpot_s["mean"], rel=1e-12)
    assert trt.ttft_s["mean"] == base.ttft_s["mean"]
    eager = run("vllm")  # no captured graphs: every decode step is host-bound too
    assert eager.tpot_s["mean"] == pytest.approx(kernels * host + OH, rel=1e-9)
    slower = run("vllm", kernel_launch_overhead_s=2 * host, **graphs)
    assert slower.ttft_s["mean"] - base.ttft_s["mean"] == pytest.approx(
        2 * kernels * host - gpu_prefill, rel=1e-9)


def test_piecewise_graphs_leave_the_host_only_the_attention_kernels(affine) -> None:
    """vLLM's piecewise CUDA graphs (``piecewise_graph_tokens``): a 256-token prompt within the
    captured sizes launches only its 100 attention kernels from the host (5 ms, below the GPU
    time: TTFT as without any host floor); above them, or with FULL_DECODE_ONLY graphs (0),
    all 1000 kernels x 50 us = 50 ms bound the prompt iteration."""
    kernels, attn, host = 1000, 100, 50e-6
    model = dataclasses.replace(affine, num_kernels=kernels, num_attention_kernels=attn)
    cal = dataclasses.replace(TOY_CALIBRATION, eager_kernel_host_s={"vllm": host})
    cluster = toy_cluster(calibration=cal)
    one = [_req(0, 0.0, 256, 4)]

    def ttft(engine: str, piecewise: int) -> float:
        rep = simulate_serving("debug-llama", cluster, _cfg(
            engine=engine, cuda_graph=True, cuda_graph_sizes=(1, 2, 4),
            piecewise_graph_tokens=piecewise), one, cost_model=model)
        return float(rep.ttft_s["mean"])

    gpu_prefill = model.iteration_s([(256, 256)], 0, 0.0)
    assert attn * host < gpu_prefill < kernels * host
    base = ttft("", 0)
    assert ttft("vllm", 512) == pytest.approx(base, rel=1e-12)
    for eager in (0, 255):
        assert ttft("vllm", eager) - base == pytest.approx(kernels * host - gpu_prefill,
                                                          rel=1e-9)
    with pytest.raises(ConfigError, match="piecewise_graph_tokens"):
        _cfg(piecewise_graph_tokens=-1)


def test_overlap_scheduler_launches_an_eager_batch_behind_the_graph_before_it(affine) -> None:
    """Behind an overlap scheduler the host launches batch n + 1 as soon as it has launched
    batch n; a decode step replays a graph, so a prompt iteration right after one lasts
    max(GPU, kernels x host - that decode step). Without the overlap the whole host time is
    exposed."""
    from charon_search.serving.simulator import run_simulation

    kernels, host = 1000, 50e-6
    model = dataclasses.replace(affine, num_kernels=kernels)
    cal = dataclasses.replace(TOY_CALIBRATION, eager_kernel_host_s={"vllm": host})
    cluster = toy_cluster(calibration=cal)
    reqs = [_req(0, 0.0, 100, 200), _req(1, 0.3, 256, 4)]  # 1 arrives while 0 decodes
    mixed = {}
    for overlap in (False, True):
        cfg = _cfg(engine="vllm", cuda_graph=True, cuda_graph_sizes=(1, 2, 4),
                   overlap_scheduler=overlap, iteration_overhead_s=0.0)
        sim, _ = run_simulation("debug-llama", cluster, cfg, reqs, cost_model=model,
                                record_iterations=True)
        recs = sim.replicas[0].records
        i = next(k for k, r in enumerate(recs) if r.num_prefill and r.start_s > 0.2)
        prev = recs[i - 1]
        assert prev.cuda_graph and prev.start_s + prev.duration_s == pytest.approx(recs[i].start_s)
        mixed[overlap] = (recs[i].duration_s, prev.duration_s)
    assert mixed[False][0] == pytest.approx(kernels * host, rel=1e-9)
    duration, decode_step = mixed[True]
    assert duration == pytest.approx(kernels * host - decode_step, rel=1e-9)


# ------------------------------------------------------------------ attention-DP balance
def _adp(timeout, reqs, affine, cluster):  # type: ignore[no-untyped-def]
    cfg = _cfg(tp=4, dp_attention=True, adp_balance_timeout_iters=timeout)
    return _per(simulate_serving("debug-llama", cluster, cfg, reqs, cost_model=affine,
                                 keep_requests=True))


def test_adp_balance_holds_a_lone_prompt_until_the_timeout_window(affine, cluster) -> None:
    """Four ranks all decoding, one new prompt: TensorRT-LLM holds it (not every rank has a
    prompt) until the balance count, restarted when the four prompts went together in step 1
    and counting every step since, reaches timeout_iters 5. Steps: a 9.4 ms prefill, then
    ~6.1 ms decodes, so the prompt arriving at 50 ms (during step 8) is first considered in
    step 9 (count 3) and goes in step 11 (count 5): its TTFT grows by exactly two decode steps."""
    reqs = [_req(i, 0.0, 100, 300) for i in range(4)] + [_req(4, 0.05, 100, 5)]
    off, on = (_adp(t, reqs, affine, cluster) for t in (0, 5))
    for i in range(4):  # admitted together (every rank had a prompt): never held
        assert on[i][1] == pytest.approx(off[i][1], rel=1e-12)
    # Each running request holds ~108 tokens of KV by then (+1 per step: < 0.01 %).
    step = affine.iteration_s([], 4, 4 * 108.0) + OH
    assert on[4][1] - off[4][1] == pytest.approx(2 * step, rel=1e-3)
    # timeout 7: the window opened in step 8 (count 7, restarted); step 9 counts 1 and the
    # prompt waits until step 15: six decode steps.
    late = _adp(7, reqs, affine, cluster)
    assert late[4][1] - off[4][1] == pytest.approx(6 * step, rel=1e-3)


def test_adp_balance_lets_prompts_go_when_every_rank_has_one_or_one_rank_idles(
        affine, cluster) -> None:
    four = [_req(i, 0.0, 100, 300) for i in range(4)] + [
        _req(4 + i, 0.05, 100, 5) for i in range(4)]
    off, on = (_adp(t, four, affine, cluster) for t in (0, 60))
    assert all(on[i][1] == pytest.approx(off[i][1], rel=1e-12) for i in range(8))
    two = [_req(i, 0.0, 100, 300) for i in range(2)] + [_req(2, 0.05, 100, 5)]
    off, on = (_adp(t, two, affine, cluster) for t in (0, 60))
    assert on[2][1] == pytest.approx(off[2][1], rel=1e-12)  # two ranks had nothing to decode
    with pytest.raises(ConfigError, match="adp_balance_timeout_iters"):
        _cfg(adp_balance_timeout_iters=-1)


def test_launch_profiles_name_their_engine() -> None:
    """A served engine gets its front end; trtllm-bench feeds the executor in process."""
    served = engine_profile("trtllm", isl=1024, max_batch_size=8, launcher="aiconfigurator")
    assert served.config_kwargs()["engine"] == "trtllm"
    bench = engine_profile("trtllm", isl=1024, max_batch_size=8, max_num_tokens=2048,
                           launcher="trtllm_bench")
    assert bench.config_kwargs()["engine"] == ""


def test_vllm_schedules_asynchronously_by_default_from_0_14() -> None:
    """vLLM 0.14+ resolves ``async_scheduling=None`` to on (vllm#27614); earlier releases, such
    as the 0.12 of aiconfigurator's rows, add the cluster's per-iteration host time."""
    assert release("0.16.0") == (0, 16, 0) and release("v0.14.0rc1") == (0, 14, 0)
    assert release("") == () and release("gpt-oss-dev") == ()
    for version, overlap in (("0.12.0", False), ("0.13.0", False), ("0.14.0", True),
                             ("0.18.0", True), ("", False)):
        p = engine_profile("vllm", isl=1024, max_batch_size=8, version=version,
                           launcher="inferencex", model="MiniMaxAI/MiniMax-M2.5")
        assert p.overlap_scheduler is overlap, version
        assert (p.config_kwargs().get("iteration_overhead_s") == 0.0) is overlap


def test_gpt_oss_on_blackwell_runs_mxfp8_activations() -> None:
    """TensorRT-LLM's GPT-OSS guide: on B200/GB200/B300/GB300 the TRTLLM MoE backend runs MXFP4
    weights with MXFP8 activations (InferenceX gptoss_fp4_b200_trt.sh sets that backend), on
    H200 the TRITON backend with BF16 activations; InferenceX's B200 vLLM recipe exports
    VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, its Hopper ones VLLM_MXFP4_USE_MARLIN=1."""
    def kernel(backend: str, gpu: str) -> str:
        return engine_profile(backend, isl=1024, max_batch_size=8, launcher="inferencex",
                              osl=1024, tp=1, model="openai/gpt-oss-120b", gpu=gpu).moe_kernel

    assert kernel("trtllm", "b200-sxm-180gb") == kernel("trtllm", "gb200") == "mxfp8"
    assert kernel("trtllm", "h200-sxm-141gb") == ""
    assert kernel("vllm", "b200-sxm-180gb") == "mxfp8"
    assert kernel("vllm", "h200-sxm-141gb") == "marlin"


def test_scheduler_recv_interval_delays_prompts_to_the_next_poll(affine, cluster) -> None:
    """SGLang ``--scheduler-recv-interval R``: the scheduler polls for new requests right after
    a batch with prompt tokens, then every R decode-only batches (``SchedulerRecvSkipper``).
    Request 0 decodes alone; request 1 arrives in the middle of decode step 11 (steps counted
    from the first after request 0's prefill). Polling before every batch it is prefilled at
    step 12; with R = 10 the polls fall before steps 1, 11, 21, so it waits 9 more decode
    steps; with R = 4 (polls before 1, 5, 9, 13) one more step."""
    alone = simulate_serving("debug-llama", cluster, _cfg(), [_req(0, 0.0, 100, 200)],
                             cost_model=affine, keep_requests=True)
    prefill = _per(alone)[0][1]
    step = affine.iteration_s([], 1, 110.0) + OH
    reqs = [_req(0, 0.0, 100, 200), _req(1, prefill + 10.5 * step, 100, 5)]
    ttft = {r: _per(simulate_serving("debug-llama", cluster, _cfg(scheduler_recv_interval=r),
                                     reqs, cost_model=affine, keep_requests=True))[1][1]
            for r in (1, 4, 10)}
    assert ttft[4] - ttft[1] == pytest.approx(1 * step, rel=0.05)
    assert ttft[10] - ttft[1] == pytest.approx(9 * step, rel=0.05)
    # A prompt reaching an idle engine is received at once, and so is request 0's.
    idle = simulate_serving("debug-llama", cluster, _cfg(scheduler_recv_interval=30),
                            [_req(0, 0.0, 100, 200)], cost_model=affine, keep_requests=True)
    assert _per(idle)[0][1] == pytest.approx(prefill, rel=1e-12)
    with pytest.raises(ConfigError, match="`scheduler_recv_interval` must be a positive"):
        _cfg(scheduler_recv_interval=0)


def test_inferencex_b200_sglang_recipes_relax_the_recv_interval_at_16_streams() -> None:
    """InferenceX dsr1_fp8_b200.sh (TP 8), dsr1_fp4_b200.sh and dsr1_fp4_b300.sh pass
    ``--scheduler-recv-interval`` 10, or 30 from concurrency 16 on; the H200 DeepSeek recipe
    passes none, and neither does the Qwen3.5 profile (its rows do not carry it,
    ``INFERENCEX_QWEN35_B200_STREAM_INTERVAL``)."""
    from charon_search.validation.names import resolve_gpu

    b200, b300, h200 = (resolve_gpu(g).name for g in ("b200_sxm", "b300_sxm", "h200_sxm"))

    def recv(model: str, gpu: str, c: int) -> int | None:
        return engine_profile("sglang", isl=1024, osl=1024, max_batch_size=c, tp=8,
                              launcher="inferencex", model=model, gpu=gpu,
                              linear_attention="Qwen3.5" in model
                              ).config_kwargs().get("scheduler_recv_interval")

    for model in ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3"):
        for gpu in (b200, b300):
            assert [recv(model, gpu, c) for c in (8, 15, 16, 64)] == [10, 10, 30, 30], model
        assert recv(model, h200, 64) is None
    assert recv("Qwen/Qwen3.5-397B-A17B", b200, 64) is None
