"""The graph-based iteration cost model (traced debug model, fused cost model) in the engine."""

from __future__ import annotations

import dataclasses

import pytest

from charon_search.catalog import load_model
from charon_search.serving import ServingConfig, simulate_serving
from charon_search.serving.simulator import build_cost_model
from charon_search.serving.workload import RequestSpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup():  # type: ignore[no-untyped-def]
    from charon_search.testing import toy_cluster

    model = load_model("debug-llama")
    cluster = toy_cluster()
    cfg = ServingConfig(tp=2, iteration_overhead_s=2e-3)
    return model, cluster, cfg, build_cost_model(model, cluster, cfg)


def test_single_request_matches_iteration_cost(setup) -> None:
    model, cluster, cfg, cost = setup
    rep = simulate_serving(model, cluster, cfg, [RequestSpec(
        request_id=0, arrived_at_s=0.0, prompt_tokens=512, output_tokens=5)], cost_model=cost)
    # Prefill is eager (not graph-captured): at least the host launch time of its kernels.
    launch = cost.num_kernels * cfg.kernel_launch_overhead_s
    ttft = max(cost.iteration_s([(512, 512)], 0, 0.0), launch) + 2e-3
    assert rep.ttft_s["mean"] == pytest.approx(ttft, rel=1e-9)
    steps = [cost.iteration_s((), 1, 512 + j, 1, padded_decode=1) + 2e-3 for j in range(1, 5)]
    assert rep.tpot_s["mean"] == pytest.approx(sum(steps) / 4, rel=1e-9)


def test_iteration_cost_grows_with_tokens_and_context(setup) -> None:
    _, _, _, cost = setup
    assert cost.iteration_s([(4096, 4096)], 0, 0) > cost.iteration_s([(512, 512)], 0, 0) > 0
    assert cost.decode_attention_s(64, 64 * 8192) > cost.decode_attention_s(64, 64 * 512) > 0
    assert cost.kv_bytes_per_token() == 2 * 2 * 1 * 16 * 2  # K+V, 2 layers, 2/2 heads, dim 16


def test_tp_shards_the_work() -> None:
    from charon_search.hardware import load_cluster

    model = load_model("llama-3.1-8b")
    cluster = load_cluster("h100-sxm-8gpu")
    one = build_cost_model(model, cluster, ServingConfig(tp=1))
    four = build_cost_model(model, cluster, ServingConfig(tp=4))
    # A large prefill is compute bound: TP4 must be well under TP1 (and over a quarter of it,
    # since it adds all-reduces).
    t1 = one.iteration_s([(8192, 8192)], 0, 0)
    t4 = four.iteration_s([(8192, 8192)], 0, 0)
    assert t1 / 4 < t4 < t1 / 2


def test_moe_ep_mtp_and_pp_run_end_to_end() -> None:
    from charon_search.serving import LengthDistribution, SpeculativeConfig, WorkloadSpec
    from charon_search.testing import toy_cluster

    cluster = toy_cluster()
    wl = WorkloadSpec(arrival="poisson", rate_per_s=20, num_requests=30, seed=2,
                      input_len=LengthDistribution(value=128),
                      output_len=LengthDistribution(value=16))
    spec = SpeculativeConfig(num_draft_tokens=2, acceptance_rate=0.8)
    rep = simulate_serving("debug-moe", cluster,
                           ServingConfig(tp=2, ep=2, speculative=spec), wl)
    assert rep.num_completed == 30
    assert rep.mean_tokens_per_step == pytest.approx(1 + 0.8 + 0.64)
    model = load_model("debug-llama")
    flat = build_cost_model(model, cluster, ServingConfig(tp=1))
    piped = build_cost_model(model, cluster, ServingConfig(tp=1, pp=2))
    # Pipeline stages hold the same layers in total; PP adds the stage hand-off.
    assert piped.iteration_s([(256, 256)], 0, 0) > flat.iteration_s([(256, 256)], 0, 0)


def test_decode_attention_over_an_fp8_cache_without_engine_rows_reads_half_the_bytes() -> None:
    """No engine named (or a GPU without fp8-cache rows, A100): the bf16 rows at the same KV
    bytes price an fp8 cache."""
    from charon_search.catalog import load_model
    from charon_search.serving.iteration_cost import GraphIterationCostModel
    from charon_search.testing import toy_cluster

    model = load_model("debug-llama")
    for gpu, engines in (("h100-sxm-80gb", ("nccl",)), ("a100-sxm-80gb", ("vllm", "trtllm"))):
        cluster = toy_cluster(gpu=gpu)

        def cm(kv_dtype: str, engine: str, cluster=cluster) -> GraphIterationCostModel:
            return GraphIterationCostModel(model, cluster, kv_dtype=kv_dtype,
                                           tp_allreduce=engine)

        for engine in engines:
            fp8, bf16 = cm("fp8", engine), cm("bf16", engine)
            # Same KV bytes: 8 requests at 1024 fp8 tokens = 8 at 512 bf16 tokens.
            assert fp8.decode_attention_s(8, 8 * 1024) == pytest.approx(
                bf16.decode_attention_s(8, 8 * 512)), (gpu, engine)
            assert fp8.decode_attention_s(8, 8 * 1024) < bf16.decode_attention_s(8, 8 * 1024)
        # A 16-bit cache is priced at its context.
        assert cm("fp16", "vllm").decode_attention_s(8, 8 * 1024) == pytest.approx(
            cm("bf16", "vllm").decode_attention_s(8, 8 * 1024))


def test_sliding_window_layers_attend_over_the_window_only() -> None:
    """gpt-oss alternates full and 128-key sliding-window attention layers: a sliding layer's
    kernels read and score at most the window, whatever the context."""
    from charon_search.serving.iteration_cost import GraphIterationCostModel
    from charon_search.testing import toy_cluster

    plain_model = load_model("debug-llama")  # 2 layers
    windowed_model = dataclasses.replace(plain_model, extra={
        **plain_model.extra, "sliding_window": 128,
        "attention_layer_types": ("sliding_attention", "full_attention")})
    cluster = toy_cluster()
    plain = GraphIterationCostModel(plain_model, cluster)
    sw = GraphIterationCostModel(windowed_model, cluster)
    # Decode at 1024 keys: one layer at 1024, one at the 128-key window (grid points).
    assert sw.decode_attention_s(8, 8 * 1024) == pytest.approx(
        0.5 * (plain.decode_attention_s(8, 8 * 1024) + plain.decode_attention_s(8, 8 * 128)))
    # Inside the window both layer kinds see the whole context.
    assert sw.decode_attention_s(8, 8 * 64) == pytest.approx(plain.decode_attention_s(8, 8 * 64))
    assert sw.prefill_attention_s(64, 64) == pytest.approx(plain.prefill_attention_s(64, 64))
    # A 1024-token prompt: the sliding layer scores 1024 x 128 query-key pairs, unmasked.
    part = sw._prefill_parts[0]
    assert (part.count, part.sliding) == (2, 1)
    windowed = sw._sum(part.attention_windowed, 1, 1024, 128)
    assert sw.prefill_attention_s(1024, 1024) == pytest.approx(
        0.5 * plain.prefill_attention_s(1024, 1024) + windowed)
    assert windowed < 0.5 * plain.prefill_attention_s(1024, 1024)


def test_gpt_oss_has_half_of_its_layers_sliding() -> None:
    from charon_search.hardware import load_cluster
    from charon_search.serving.iteration_cost import GraphIterationCostModel

    model = load_model("gpt-oss-120b")  # HF config: layer_types alternate, sliding_window 128
    cost = GraphIterationCostModel(model, load_cluster("h200-sxm-8gpu"))
    assert [(p.count, p.sliding, p.window) for p in cost._decode_parts] == [(36, 18, 128)]


@pytest.mark.slow
def test_llama4_chunked_layers_are_priced_as_the_chunk_window() -> None:
    """Llama 4 Scout: 36 of its 48 layers attend within 8192-token chunks (HF layer_types
    `chunked_attention`, every fourth layer `full_attention`), priced as an 8192-key window."""
    from charon_search.hardware import load_cluster
    from charon_search.serving.iteration_cost import GraphIterationCostModel

    model = load_model("llama-4-scout-17b-16e")
    cost = GraphIterationCostModel(model, load_cluster("h200-sxm-8gpu"), tp=8)
    assert [(p.count, p.sliding, p.window) for p in cost._decode_parts] == [(48, 36, 8192)]
    # Within one chunk every layer sees the whole context; beyond it the chunked layers stop at
    # the chunk, so a 64k context costs far less than 48 layers of full attention would.
    full = GraphIterationCostModel(dataclasses.replace(model, extra={
        k: v for k, v in model.extra.items() if k != "attention_chunk_size"}),
        load_cluster("h200-sxm-8gpu"), tp=8)
    assert cost.decode_attention_s(8, 8 * 4096) == pytest.approx(
        full.decode_attention_s(8, 8 * 4096))
    long_c = 8 * 65_536
    assert cost.decode_attention_s(8, long_c) == pytest.approx(
        0.25 * full.decode_attention_s(8, long_c) + 0.75 * full.decode_attention_s(8, 8 * 8192))
