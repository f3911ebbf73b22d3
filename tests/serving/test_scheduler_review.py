"""Scheduler fixes of the serving review (findings F3-F7, F9, F10), each against a closed form
of the affine iteration cost model (``conftest.affine``: 5 ms + 10 us/token + 0.1 us/key +
1 ns/pair) or an engine's own source rule."""

from __future__ import annotations

import math

import pytest

from charon_search.errors import ConfigError
from charon_search.serving import RequestSpec, ServingConfig, SpeculativeConfig, simulate_serving
from charon_search.serving.backends import (
    TRTLLM_DEFAULT_CUDA_GRAPH_SIZES,
    engine_memory,
    engine_profile,
    sglang_cuda_graph_sizes,
    sglang_default_mem_fraction,
)
from charon_search.serving.config import DEFAULT_CUDA_GRAPH_SIZES
from charon_search.serving.engine import (
    SGLANG_INIT_NEW_TOKEN_RATIO,
    SGLANG_MIN_NEW_TOKEN_RATIO,
    SGLANG_NEW_TOKEN_RATIO_DECAY,
    ReplicaEngine,
    Request,
)
from charon_search.serving.engine_defaults import engine_serving_config
from charon_search.serving.simulator import run_simulation

OH = 1e-3  # per-iteration CPU overhead


def req(i: int, t: float, prompt: int, out: int, **kw) -> RequestSpec:  # type: ignore[no-untyped-def]
    return RequestSpec(request_id=i, arrived_at_s=t, prompt_tokens=prompt, output_tokens=out,
                       **kw)


def _cfg(**kw) -> ServingConfig:  # type: ignore[no-untyped-def]
    base = {"num_kv_blocks": 20000, "iteration_overhead_s": OH}
    base.update(kw)
    return ServingConfig(**base)


def _trace(affine, cluster, cfg, reqs):  # type: ignore[no-untyped-def]
    sim, rep = run_simulation("debug-llama", cluster, cfg, reqs, cost_model=affine,
                              record_iterations=True, keep_requests=True)
    return sim, rep, [x for e in sim.replicas for x in e.records]


# ---------------------------------------------------------------- F4: SGLang's admission
def _sglang_like(**kw) -> ServingConfig:  # type: ignore[no-untyped-def]
    return _cfg(prefill_schedule="prefill_first", decode_in_budget=False,
                max_prefill_tokens=16384, **kw)


def test_ratio_admission_reserves_the_running_requests_output(affine, cluster) -> None:
    # 1000 blocks of 16 = 16000 tokens; 40 requests of 100 prompt + 1000 output at t = 0.
    reqs = [req(i, 0.0, 100, 1000) for i in range(40)]
    _, rep, recs = _trace(affine, cluster, _sglang_like(num_kv_blocks=1000,
                                                        kv_admission="ratio"), reqs)
    # PrefillAdder.add_one_req: a new request needs 100 + min(1000, 4096) = 1100 tokens and
    # is refused once 1100 >= 16000 - 1100 k: k = 14 admissions (15400 tokens reserved).
    assert recs[0].num_prefill == 14
    # Next step: 14 decodes hold 14 x 7 blocks (+ up to one partial block each, 101 charged)
    # and reserve 0.7 x 999 tokens each: room 899 x 16 - 0.7 x 14 x 999 = 4593.8 -> 4 more.
    room = 899 * 16 - SGLANG_INIT_NEW_TOKEN_RATIO * 14 * 999
    assert recs[1].num_prefill == 4 == max(k for k in range(40) if 1100 < room - 1100 * (k - 1))
    assert rep.num_completed == 40
    # vLLM's on-demand admission starts all 40 prompts (280 blocks) and thrashes later.
    _, od, od_recs = _trace(affine, cluster, _sglang_like(num_kv_blocks=1000), reqs)
    assert od_recs[0].num_prefill == 40
    assert od.num_preemptions > rep.num_preemptions


def test_new_token_ratio_decays_per_decode_step(affine, cluster) -> None:
    # One request: a prefill and 10 decode steps, none retracting.
    sim, _, recs = _trace(affine, cluster, _sglang_like(kv_admission="ratio"),
                          [req(0, 0.0, 100, 11)])
    assert sum(1 for x in recs if x.num_decode) == 10
    ratio = sim.replicas[0].new_token_ratio
    assert ratio == pytest.approx(0.7 - 10 * (0.7 - 0.7 * 0.14) / 600)
    assert SGLANG_NEW_TOKEN_RATIO_DECAY == pytest.approx((0.7 - 0.098) / 600)
    assert SGLANG_MIN_NEW_TOKEN_RATIO == pytest.approx(0.098)


def test_new_token_ratio_after_a_retraction(affine) -> None:
    # ScheduleBatch.retract_decode: (decoded + 20 x n) / sum(max_new) over the requests left.
    eng = ReplicaEngine("m", "mixed", affine, _sglang_like(kv_admission="ratio"),
                        num_kv_blocks=1000, overhead_s=OH)
    for i in range(2):
        eng.enqueue(Request(req(i, 0.0, 100, 100), 0.0))
    t = 0.0
    for _ in range(4):  # one prefill batch, then 3 decode steps
        t += eng.start_iteration(t)
        eng.finish_iteration(t)
    eng._update_ratio(retracted=True)
    # Each has 1 (prefill) + 3 tokens: (8 + 20 x 2) / 200.
    assert eng.new_token_ratio == pytest.approx((8 + 40) / 200)


def test_sglang_engine_defaults_admit_by_ratio(affine, cluster) -> None:
    cfg, _ = engine_serving_config({"engine": "sglang", "num_kv_blocks": 1000,
                                    "iteration_overhead_s": OH},
                                   gpu="h100-sxm-80gb", prompt_tokens=[100])
    assert cfg.kv_admission == "ratio"
    _, _, recs = _trace(affine, cluster, cfg, [req(i, 0.0, 100, 1000) for i in range(40)])
    assert recs[0].num_prefill == 14  # as above: 1100 < 16000 - 1100 k


# ---------------------------------------------------------------- F3: vLLM preemption
def test_preemption_takes_the_newest_running_request_even_a_prefill(affine, cluster) -> None:
    # 30 blocks (480 tokens), 64-token budget. A (100 + 300) decodes; B (400-token prompt,
    # admitted after A) chunks 63 tokens beside A's decode.
    cfg = _cfg(num_kv_blocks=30, max_num_batched_tokens=64)
    _, rep, recs = _trace(affine, cluster, cfg, [req(0, 0.0, 100, 300), req(1, 0.001, 400, 5)])
    assert [x.prefill_tokens for x in recs[:7]] == [64, 64, 63, 63, 63, 63, 63]
    # B holds 28 + 5 x 63 = 343 tokens; its last 57 would need 25 blocks beside A's 7 (> 30):
    # vLLM pops the tail of `running`, B itself, and schedules no waiting request that step,
    # so iteration 8 is A's decode alone.
    assert math.ceil(400 / 16) + math.ceil((100 + 7) / 16) > 30
    assert (recs[7].num_prefill, recs[7].num_decode) == (0, 1)
    preempted = dict(zip(rep.per_request["request_id"], rep.per_request["num_preemptions"],
                         strict=True))
    assert preempted[0] == 0 and preempted[1] >= 1
    assert rep.num_completed == 2


def test_preempting_everything_running_lets_the_queue_start(affine, cluster) -> None:
    # Two partial prefills that cannot both finish in 20 blocks: the newer is recomputed,
    # the older finishes, and nothing stalls.
    cfg = _cfg(num_kv_blocks=20, max_num_batched_tokens=64)
    rep = simulate_serving("debug-llama", cluster, cfg,
                           [req(0, 0.0, 250, 2), req(1, 0.0, 250, 2)], cost_model=affine,
                           keep_requests=True)
    assert rep.num_completed == 2
    assert rep.per_request["num_preemptions"][0] == 0


# ---------------------------------------------------------------- F7: vLLM caches at schedule
@pytest.mark.parametrize(("engine", "hits", "tokens"), [("", [0, 1008], 1024 + 16),
                                                        ("sglang", [0, 0], 2048)])
def test_identical_prefixes_in_one_step(affine, cluster, engine, hits, tokens) -> None:
    shared = {"prefix_id": 7, "prefix_tokens": 1024}
    reqs = [req(0, 0.0, 1024, 2, **shared), req(1, 0.0, 1024, 2, **shared)]
    _, rep, recs = _trace(affine, cluster, _cfg(prefix_caching=True, engine=engine), reqs)
    # vLLM caches A's 64 full blocks when it schedules them (allocate_slots ->
    # cache_blocks): B hits 63 of them (its last block is recomputed) in the same step.
    # SGLang inserts into its radix tree after the prefill: no hit.
    assert rep.per_request["prefix_hit_tokens"] == hits
    assert recs[0].prefill_tokens == tokens
    if not engine:
        ttft = affine.iteration_s([(1024, 1024), (16, 1024)], 0, 0.0) + OH
        assert rep.ttft_s["mean"] == pytest.approx(ttft)


# ---------------------------------------------------------------- F6: graphs keyed by tokens
def _first_verify(affine, cluster, n, engine=""):  # type: ignore[no-untyped-def]
    spec = SpeculativeConfig(num_draft_tokens=3, acceptance_rate=1.0)
    cfg = _cfg(speculative=spec, engine=engine)
    _, _, recs = _trace(affine, cluster, cfg, [req(i, 0.0, 40, 9) for i in range(n)])
    assert recs[0].num_prefill == n  # all prompts in one prefill batch
    return recs[1]


def test_vllm_matches_verify_batches_on_tokens(affine, cluster) -> None:
    # 100 requests x q = 4 = 400 tokens: a captured size (256 + 9 x 16), so no padding.
    rec = _first_verify(affine, cluster, 100)
    assert rec.cuda_graph and 400 in DEFAULT_CUDA_GRAPH_SIZES
    kv = 100 * 40 + 100 * 4  # prompts plus the verified tokens
    target = affine.iteration_s((), 100, kv, 4, padded_decode=100)
    assert target == pytest.approx(5e-3 + 1e-5 * 400 + 1e-7 * kv)
    draft = 3 * affine.iteration_s((), 100, kv, 1)  # MTP: k one-token steps
    assert rec.duration_s == pytest.approx(target + draft + OH)
    # SGLang keys by requests: 100 pads to its next captured batch of 104 (416 tokens).
    sg = _first_verify(affine, cluster, 100, engine="sglang")
    assert sg.duration_s - rec.duration_s == pytest.approx(16 * 1e-5)
    # 200 x 4 = 800 tokens is above vLLM's largest capture (512): no graph.
    assert not _first_verify(affine, cluster, 200).cuda_graph


# ---------------------------------------------------------------- F5: engines' graph sets
def test_engine_default_cuda_graph_sets() -> None:
    trt = engine_profile("trtllm", isl=1024, max_batch_size=256, launcher="engine_defaults")
    assert trt.cuda_graph_sizes == (*range(1, 32), 32, 64, 128) == TRTLLM_DEFAULT_CUDA_GRAPH_SIZES
    assert not trt.config_kwargs()["cuda_graph_padding"]
    # SGLang at TP 1 on an 80 GiB H100: cuda_graph_max_bs 256, sizes 1, 2, 4, 8, 12, 16..256.
    cfg, _ = engine_serving_config({"engine": "sglang"}, gpu="h100-sxm-80gb",
                                   prompt_tokens=[1024])
    assert cfg.cuda_graph_sizes == (1, 2, 4, 8, 12, *range(16, 257, 8))
    assert len(cfg.cuda_graph_sizes) == 36 and cfg.cuda_graph_padding
    # ... the batch its default memory fraction reserves graph memory for.
    from charon_search.hardware import load_gpu

    h100 = load_gpu("h100-sxm-80gb")
    assert engine_memory(cfg, h100, tp=1, pp=1, dp_attention=False)[1] == (
        sglang_default_mem_fraction(h100, tp=1, prefill_tokens=8192))
    tp4, _ = engine_serving_config({"engine": "sglang", "tp": 4}, gpu="h100-sxm-80gb",
                                   prompt_tokens=[1024])
    assert tp4.cuda_graph_sizes[-1] == 512 and 496 in tp4.cuda_graph_sizes
    assert sglang_cuda_graph_sizes(640)[-3:] == (512, 544, 576, 608, 640)[-3:]
    # vLLM >= 0.11: 8-step sizes below 256, 16-step from 256 to 512.
    assert len(DEFAULT_CUDA_GRAPH_SIZES) == 3 + 31 + 17
    assert 264 not in DEFAULT_CUDA_GRAPH_SIZES and 272 in DEFAULT_CUDA_GRAPH_SIZES


def test_without_padding_an_uncaptured_batch_runs_eagerly(affine, cluster) -> None:
    reqs = [req(i, 0.0, 100, 2) for i in range(3)]
    sizes = {"cuda_graph_sizes": (1, 2, 4)}
    _, _, pad = _trace(affine, cluster, _cfg(**sizes), reqs)
    _, _, exact = _trace(affine, cluster, _cfg(cuda_graph_padding=False, **sizes), reqs)
    assert pad[1].cuda_graph and not exact[1].cuda_graph
    # Padded: the token-linear ops run the captured 4 requests, one token more.
    assert pad[1].duration_s - exact[1].duration_s == pytest.approx(1e-5)


# ---------------------------------------------------------------- F9: config validation
@pytest.mark.parametrize(("field", "value"), [
    ("iteration_overhead_s", -1e-3), ("iteration_overhead_s", math.nan),
    ("kernel_launch_overhead_s", -1.0), ("slo_ttft_s", 0.0), ("slo_tpot_s", -1.0),
    ("slo_ttft_s", math.nan), ("cuda_graph_padding", "no")])
def test_negative_times_and_slos_are_rejected(field, value) -> None:
    with pytest.raises(ConfigError, match=f"`{field}`"):
        ServingConfig(**{field: value})


# ---------------------------------------------------------------- F10: ITL per chunk
def test_itl_per_token_and_per_chunk(affine, cluster) -> None:
    # One request, k = 3 at full acceptance: 4 tokens per verify step, 5 steps.
    spec = SpeculativeConfig(num_draft_tokens=3, acceptance_rate=1.0)
    _, rep, recs = _trace(affine, cluster, _cfg(speculative=spec), [req(0, 0.0, 100, 21)])
    steps = [x.duration_s for x in recs if x.num_decode]
    assert len(steps) == 5
    assert rep.itl_per_chunk_s["mean"] == pytest.approx(sum(steps) / 5)
    assert rep.itl_s["mean"] == pytest.approx(sum(steps) / 5 / 4)
    assert rep.to_dict()["itl_per_chunk_s"] == rep.itl_per_chunk_s
