"""Serving-simulator fixes from the session-59 review: vLLM's disaggregated decode runs every
output step, a ramped closed loop's throughput leaves the ramp out, and non-finite workload
inputs are one-line errors."""

from __future__ import annotations

import math

import pytest

from charon_search.errors import ConfigError, InfeasibleError
from charon_search.serving import (
    AffineIterationCostModel,
    LengthDistribution,
    RequestSpec,
    ServingConfig,
    WorkloadSpec,
    simulate_serving,
)
from charon_search.serving.simulator import run_simulation
from charon_search.testing import toy_cluster

CL = toy_cluster()
AFF = AffineIterationCostModel(base_s=5e-3, per_token_s=1e-5, per_kv_token_s=1e-7,
                               per_attention_pair_s=1e-9, kv_token_bytes=131072.0)
QUIET_FRONT = dict(disagg_handoff_s=0.0, frontend_latency_s=0.0, frontend_prompt_token_s=0.0,
                   frontend_output_token_s=0.0, frontend_output_stream_s=0.0,
                   prefill_iteration_overhead_s=0.0)


def _req(i: int, t: float, p: int, o: int) -> RequestSpec:
    return RequestSpec(request_id=i, arrived_at_s=t, prompt_tokens=p, output_tokens=o)


def _disagg(engine: str, osl: int):
    cfg = ServingConfig(num_kv_blocks=20000, iteration_overhead_s=1e-3, engine=engine,
                        disagg="prefill=1xTP1,decode=1xTP1", **QUIET_FRONT)
    sim, rep = run_simulation("debug-llama", CL, cfg, [_req(0, 0.0, 1000, osl)],
                              cost_model=AFF, record_iterations=True)
    steps = [x for e in sim.replicas if e.role == "decode" for x in e.records]
    return rep, steps


@pytest.mark.parametrize("osl", [2, 3, 10])
def test_vllm_disagg_decode_runs_every_output_step(osl):
    # vLLM's decode instance recomputes the last prompt token and samples the first token
    # itself (v1 Scheduler._update_waiting_for_remote_kv): osl decode steps, the first ends
    # the TTFT, so TPOT = (E2E - TTFT) / (osl - 1) is one decode step. It had run osl - 1
    # steps: TPOT (osl - 2) / (osl - 1) of a step, 0 at osl = 2.
    rep, steps = _disagg("vllm", osl)
    assert len(steps) == osl
    assert rep.tpot_s["mean"] == pytest.approx(steps[-1].duration_s, rel=2e-3)


def test_trtllm_disagg_generation_continues_from_the_prefill_token():
    # TensorRT-LLM's generation server continues from the context server's token: osl - 1
    # steps, the first chunk carrying two tokens (unchanged).
    _, steps = _disagg("trtllm", 10)
    assert len(steps) == 9


def _closed_loop(n: int, ramp: float | None):
    cfg = ServingConfig(num_kv_blocks=20000, iteration_overhead_s=1e-3)
    wl = WorkloadSpec(arrival="concurrency", concurrency=32, num_requests=n,
                      input_len=LengthDistribution(value=1000),
                      output_len=LengthDistribution(value=200), ramp_up_s=ramp)
    return simulate_serving("debug-llama", CL, cfg, wl, cost_model=AFF, keep_requests=True)


def test_ramped_closed_loop_throughput_is_measured_after_the_ramp():
    # The ramp (32 first requests spread over one lifetime) had counted in duration_s: the
    # reported rate fell 14.5 % under the steady state at 100 requests. From the ramp's end,
    # Little's law holds: requests/s x mean E2E ~ the 32 streams in flight, less the final
    # drain's 2.9 % (it was 30.2, -5.6 %, with the ramp in the window).
    rep = _closed_loop(400, None)
    little = rep.requests_per_s * rep.e2e_s["mean"]
    assert little == pytest.approx(32, rel=0.04)
    # Output tokens/s is 200 tokens a request at that rate.
    assert rep.output_tokens_per_s == pytest.approx(200 * rep.requests_per_s, rel=0.01)
    # Without a ramp the window is the whole run: every request counts once.
    flat = _closed_loop(400, 0.0)
    assert flat.requests_per_s == pytest.approx(400 / flat.duration_s, rel=1e-9)
    assert flat.output_tokens_per_s == pytest.approx(400 * 200 / flat.duration_s, rel=1e-9)
    # The ramped window starts at the last first-wave send, so it is shorter than the run.
    arrived = rep.per_request["arrived_at_s"]
    assert rep.duration_s < max(a + e for a, e in zip(arrived, rep.per_request["e2e_s"],
                                                      strict=True)) - min(arrived)


@pytest.mark.parametrize("field,kwargs,match", [
    ("rate", dict(arrival="poisson", rate_per_s=math.nan), "rate_per_s"),
    ("rate", dict(arrival="poisson", rate_per_s=math.inf), "rate_per_s"),
    ("cv", dict(arrival="gamma", rate_per_s=1.0, cv=math.nan), "cv"),
])
def test_non_finite_arrival_parameters_are_rejected(field, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        WorkloadSpec(num_requests=3, **kwargs)


@pytest.mark.parametrize("mean,sigma", [(math.nan, 0.5), (100.0, math.nan), (math.inf, 0.5)])
def test_non_finite_lognormal_lengths_are_rejected(mean, sigma):
    # A NaN mean had turned every prompt into 1 token, silently.
    with pytest.raises(ConfigError, match="lognormal"):
        LengthDistribution(kind="lognormal", mean=mean, sigma=sigma)


@pytest.mark.parametrize("t", [math.nan, math.inf])
def test_request_list_needs_finite_arrival_times(t):
    cfg = ServingConfig(num_kv_blocks=20000)
    with pytest.raises(ConfigError, match="arrived_at_s"):
        simulate_serving("debug-llama", CL, cfg, [_req(0, t, 100, 10)], cost_model=AFF)


def test_an_iteration_of_no_time_is_reported_as_such():
    # A batch costed at <= 0 s never ends; it had been reported as "a request needs more KV
    # blocks than the cache has".
    free = AffineIterationCostModel(base_s=0.0, per_token_s=0.0, per_kv_token_s=0.0,
                                    per_attention_pair_s=0.0)
    cfg = ServingConfig(num_kv_blocks=20000, iteration_overhead_s=0.0,
                        kernel_launch_overhead_s=0.0, cuda_graph=False)
    with pytest.raises(InfeasibleError, match="costed at"):
        simulate_serving("debug-llama", CL, cfg, [_req(0, 0.0, 100, 10)], cost_model=free)


def test_sglang_ignore_eos_admission_never_runs_out():
    # SGLang with its radix cache off and clients ignoring EOS (PrefillAdder
    # .add_one_req_ignore_eos): with every remaining output known, the k-th of k identical
    # requests (100 + 1000 tokens, prompts paged to 112) starts only if
    # 16,000 - 100 (k - 1) - 112 - 1000 k > 1 x k, i.e. k <= 14; nothing is ever retracted.
    # SGLang's new_token_ratio rule admits 14 too but retracts 10 times; on-demand 40 and 39.
    from charon_search.serving.simulator import run_simulation

    def run(adm: str):
        cfg = ServingConfig(num_kv_blocks=1000, iteration_overhead_s=1e-3, kv_admission=adm,
                            engine="sglang", prefill_schedule="prefill_first",
                            decode_in_budget=False, prefix_caching=False)
        sim, rep = run_simulation("debug-llama", CL, cfg,
                                  [_req(i, 0.0, 100, 1000) for i in range(40)],
                                  cost_model=AFF, record_iterations=True)
        first = next(x for e in sim.replicas for x in e.records)
        return first.num_prefill, rep.num_preemptions, rep.num_completed

    assert run("ignore_eos") == (14, 0, 40)
    assert run("on_demand") == (40, 39, 40)


def test_sglang_benchmark_launches_admit_as_ignore_eos():
    # aiconfigurator's and InferenceX's SGLang launches turn the radix cache off and their
    # clients ignore EOS; SGLang launched with its defaults keeps the ratio rule.
    from charon_search.serving.backends import engine_profile

    aic = engine_profile("sglang", isl=1024, max_batch_size=64, version="0.5.6",
                         launcher="aiconfigurator", gpu="h200-sxm-141gb")
    ix = engine_profile("sglang", isl=1024, osl=1024, max_batch_size=64,
                        launcher="inferencex", model="deepseek-ai/DeepSeek-R1",
                        gpu="h200-sxm-141gb", precision="fp8", tp=8)
    own = engine_profile("sglang", isl=1024, max_batch_size=64, launcher="engine_defaults",
                         gpu="h200-sxm-141gb")
    assert (aic.kv_admission, ix.kv_admission, own.kv_admission) == (
        "ignore_eos", "ignore_eos", "ratio")


def test_sglang_ignore_eos_admission_on_a_sliding_window_pool():
    # SGLang skips the finish-order check for sliding-window (SWA) pools and keeps only the
    # early exit (the prompt's pages within both rooms). gpt-oss-120b, 64 requests of
    # 1,000 + 200 tokens, 1,000 blocks of 16. Every layer holding every token: the k-th
    # starts if 16,000 - 1,000 (k - 1) - 1,008 - 200 k > k, so 13 start, none retracted.
    # Paged (18 windowed layers: 2,000 pages, 72 a prompt): 1,152 <= 32,000 - 1,200 (k - 1)
    # lets 26 start, and 3 are retracted later.
    from charon_search.serving.simulator import run_simulation

    def run(windowed: bool):
        reqs = [_req(i, 0.0, 1000, 200) for i in range(64)]
        cfg = ServingConfig(num_kv_blocks=1000, max_num_seqs=64, windowed_kv=windowed,
                            kv_admission="ignore_eos", engine="sglang",
                            prefill_schedule="prefill_first", decode_in_budget=False,
                            prefix_caching=False, max_num_batched_tokens=65536,
                            iteration_overhead_s=1e-3)
        sim, rep = run_simulation("gpt-oss-120b", "h100-sxm-8gpu", cfg, reqs,
                                  record_iterations=True)
        first = next(x for e in sim.replicas for x in e.records)
        return first.num_prefill, rep.num_preemptions, rep.num_completed

    assert run(False) == (13, 0, 64)
    assert run(True) == (26, 3, 64)
