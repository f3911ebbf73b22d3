"""``trtllm-bench throughput`` limits (tuning heuristics), the profile built from them, and the
per-pool attention-DP / EP facts of disaggregated MoE deployments. Every expected number below is
worked out by hand in the comment beside it."""

from __future__ import annotations

import pytest

from charon_search.errors import ConfigError
from charon_search.serving.backends import TRTLLM_TOKENS_PER_BLOCK, engine_profile
from charon_search.serving.config import PoolConfig
from charon_search.serving.trtllm_bench import (
    PERF_OVERVIEW_CUDA_GRAPH_SIZES,
    bench_limits,
    captured_graph_sizes,
    perf_overview_num_requests,
)

#: Llama-3.1-8B / Llama-3.3-70B shapes (HF configs) and the catalog parameter counts.
L8B = dict(params=8.030261248e9, num_layers=32, num_kv_heads=8, head_dim=128)
L70B = dict(params=70.553706496e9, num_layers=80, num_kv_heads=8, head_dim=128)
FP8 = dict(weight_dtype="fp8", kv_dtype="fp8", kv_fraction=0.95)


def test_8b_h200_2048_2048_limits() -> None:
    # engine 8.0303e9 B = 7.479 GiB; cache (139.80 - 7.479) x 0.95 = 125.71 GiB; KV per token
    # 2 x 32 x 8 x 128 x 1 B = 64 KiB -> 125.71 GiB / (64 KiB x 4096) = 502.8 requests;
    # batch 128 x ceil(502.8 / 128) = 512; tokens 502.8 x 2 = 1006 -> 2048, raised to
    # isl + batch = 2560 (no chunked prefill).
    lim = bench_limits(**L8B, tp=1, pp=1, isl=2048, osl=2048, device_memory_gib=139.80, **FP8)
    assert lim.kv_max_requests == pytest.approx(502.8, abs=0.2)
    assert (lim.max_batch_size, lim.max_num_tokens) == (512, 2560)


def test_8b_h100_128_128_hits_the_caps() -> None:
    # (80 - 7.479) x 0.95 = 68.90 GiB / (64 KiB x 256) = 4409 requests -> capped at 4096;
    # tokens 4096 x (1 + 1) = 8192 (multiple of 1024); isl + batch = 4224 < 8192.
    lim = bench_limits(**L8B, tp=1, pp=1, isl=128, osl=128, device_memory_gib=80.0, **FP8)
    assert (lim.max_batch_size, lim.max_num_tokens) == (4096, 8192)


def test_70b_tp2_h100_2048_2048_limits_and_chunking() -> None:
    # engine 65.71 GiB; cache (2 x 80 - 65.71) x 0.95 = 89.58 GiB; KV per token
    # 2 x 80 x max(2, 8) x 128 B = 160 KiB -> 143.3 requests; batch max(64, 32 x 5) = 160;
    # tokens 286.6 -> 2048; without chunking isl + 160 = 2208.
    kw = dict(**L70B, tp=2, pp=1, isl=2048, osl=2048, device_memory_gib=80.0, **FP8)
    lim = bench_limits(**kw)
    assert lim.kv_max_requests == pytest.approx(143.3, abs=0.1)
    assert (lim.max_batch_size, lim.max_num_tokens) == (160, 2208)
    chunked = bench_limits(**kw, chunked_prefill=True)
    assert (chunked.max_batch_size, chunked.max_num_tokens) == (160, 2048)


def test_pipeline_stages_divide_the_batch() -> None:
    # 70B on 4 x 80 GiB at TP1 PP4: cache (320 - 65.71) x 0.95 = 241.6 GiB -> 386.4 requests;
    # / pp 4 = 96.6 -> 32 x ceil(3.02) = 128.
    lim = bench_limits(**L70B, tp=1, pp=4, isl=2048, osl=2048, device_memory_gib=80.0, **FP8)
    assert lim.max_batch_size == 128


def test_bad_inputs_raise() -> None:
    with pytest.raises(ConfigError, match="weight_dtype"):
        bench_limits(**L8B, tp=1, pp=1, isl=128, osl=128, device_memory_gib=80.0,
                     weight_dtype="int3", kv_dtype="fp8", kv_fraction=0.9)
    with pytest.raises(ConfigError, match="holds no request"):  # 405B fp8 on one 80 GiB GPU
        bench_limits(params=405e9, num_layers=126, num_kv_heads=8, head_dim=128, tp=1, pp=1,
                     isl=128, osl=128, device_memory_gib=80.0, **FP8)


def test_captured_graph_sizes_pad_to_the_largest_decode_batch() -> None:
    assert captured_graph_sizes(PERF_OVERVIEW_CUDA_GRAPH_SIZES, max_batch_size=160,
                                max_num_tokens=2208) == (1, 2, 4, 8, 16, 32, 64, 128, 160)
    assert captured_graph_sizes(PERF_OVERVIEW_CUDA_GRAPH_SIZES, max_batch_size=512,
                                max_num_tokens=2560)[-2:] == (384, 512)
    assert captured_graph_sizes((1, 2, 4), max_batch_size=512, max_num_tokens=8192) == (1, 2, 4)


def test_perf_overview_request_counts() -> None:
    assert perf_overview_num_requests(128, 128) == 30000
    assert perf_overview_num_requests(2048, 2048) == 1500
    assert perf_overview_num_requests(1000, 1000) == 3000
    assert perf_overview_num_requests(3, 7) is None


def test_trtllm_bench_profile_fields() -> None:
    prof = engine_profile("trtllm", isl=2048, max_batch_size=512, launcher="trtllm_bench",
                          max_num_tokens=2560)
    kw = prof.config_kwargs()
    assert kw["max_num_seqs"] == 512 and kw["max_num_batched_tokens"] == 2560
    assert kw["block_size"] == TRTLLM_TOKENS_PER_BLOCK == 32
    assert kw["kv_admission"] == "reserve_max" and not kw["chunked_prefill"]
    assert kw["iteration_overhead_s"] == 0.0 and kw["tp_allreduce"] == "trtllm"
    assert kw["cuda_graph_sizes"][-1] == 512
    with pytest.raises(ConfigError, match="needs backend 'trtllm'"):
        engine_profile("vllm", isl=1, max_batch_size=1, launcher="trtllm_bench",
                       max_num_tokens=1)
    # The engine's own defaults leave max_num_seqs to the caller and set TensorRT-LLM's
    # 32-token KV blocks and its default CUDA graphs (CudaGraphConfig: 1..31, 32, 64, 128,
    # no padding); aiconfigurator's benchmark rules capture a CUDA graph for every batch size
    # up to max_batch_size.
    other = engine_profile("trtllm", isl=1024, max_batch_size=8,
                           launcher="engine_defaults").config_kwargs()
    assert "max_num_seqs" not in other
    assert other["cuda_graph_sizes"] == (*range(1, 32), 32, 64, 128)
    assert other["cuda_graph_padding"] is False
    assert other["block_size"] == TRTLLM_TOKENS_PER_BLOCK
    aic = engine_profile("trtllm", isl=1024, max_batch_size=8,
                         launcher="aiconfigurator").config_kwargs()
    assert aic["cuda_graph_sizes"] == (1, 2, 3, 4, 5, 6, 7, 8)


def test_pool_dp_attention_validates() -> None:
    assert PoolConfig(tp=8, dp_attention=True).dp_attention is True
    assert PoolConfig(tp=8).dp_attention is None
    with pytest.raises(ConfigError, match=r"pool\.dp_attention"):
        PoolConfig(tp=8, dp_attention="yes")  # type: ignore[arg-type]


def test_pool_limits_validate() -> None:
    assert PoolConfig(tp=8, max_num_batched_tokens=65536).max_num_batched_tokens == 65536
    with pytest.raises(ConfigError, match=r"pool\.max_num_seqs"):
        PoolConfig(tp=8, max_num_seqs=-1)
