"""What ``trtllm-bench throughput`` runs when nobody passes engine limits.

The TensorRT-LLM performance overview (``docs/source/performance/perf-overview.md``, the
PyTorch-backend tables of v0.19-v1.0) is measured with ``trtllm-bench --tp T --pp P --model M
throughput --dataset D --backend pytorch --extra_llm_api_options llm_options.yml`` and no
``--max_batch_size`` / ``--max_num_tokens``. The benchmark then sizes both itself from the
dataset's mean lengths and the KV memory it expects (``trtllm-bench`` tuning heuristics), and the
executor sizes its KV cache from the memory left after a profiling run. Each fact below carries
its source; none is fitted.

Sources (read, not copied):

* ``tensorrt_llm/bench/benchmark/utils/general.py`` ``get_settings``: heuristics when either
  limit is missing; ``max_num_tokens`` raised to ``max_isl + max_batch_size`` when chunked
  prefill is off (its default); CUDA graphs on with padding.
* ``tensorrt_llm/bench/build/tuning.py`` ``calc_engine_setting`` / ``finetune_setting``: the
  arithmetic of :func:`bench_limits`.
* ``tensorrt_llm/bench/build/utils.py`` ``get_device_memory``: NVML total memory in GiB.
* ``tensorrt_llm/_torch/pyexecutor/_util.py`` ``KvCacheCreator._cal_max_tokens``: KV cache =
  ``free_gpu_memory_fraction x (total - peak of the profiling run)``.
* ``tensorrt_llm/_torch/pyexecutor/model_engine.py`` ``_filter_cuda_graph_batch_sizes``: the
  captured sizes above the largest decode batch are replaced by that batch (padding on).
* perf-overview.md: ``llm_options.yml`` (``cuda_graph_config: enable_padding: true,
  batch_sizes: [1, 2, 4, ..., 8192]``), ``--kv_cache_free_gpu_mem_fraction 0.95`` "in many
  cases" (default 0.90), dataset ``prepare_dataset.py token-norm-dist --input-stdev 0
  --output-stdev 0`` (every request exactly ISL / OSL), ``$num_requests`` per length pair, all
  requests queued at once ("offline maximum throughput scenario").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from charon_search.errors import ConfigError

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec
    from charon_search.hardware.spec import ClusterSpec

__all__ = ["PERF_OVERVIEW_CUDA_GRAPH_SIZES", "PERF_OVERVIEW_KV_FRACTION", "BenchLimits",
           "bench_limits", "captured_graph_sizes", "kv_blocks", "perf_overview_engine",
           "perf_overview_num_requests"]

#: ``llm_options.yml`` of the perf overview: ``cuda_graph_config.batch_sizes``.
PERF_OVERVIEW_CUDA_GRAPH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512,
                                                   1024, 2048, 4096, 8192)
#: ``--kv_cache_free_gpu_mem_fraction 0.95``: "In many cases, we also use a higher KV cache
#: percentage ... We fall back to 0.90 or lower if out-of-memory errors are encountered."
PERF_OVERVIEW_KV_FRACTION = 0.95
#: perf-overview.md "$num_requests" table: (ISL, OSL) -> requests in the dataset.
_PERF_OVERVIEW_REQUESTS: dict[tuple[int, int], int] = {
    (128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (1000, 2000): 1500,
    (2048, 128): 3000, (2048, 2048): 1500, (5000, 500): 1500, (1000, 1000): 3000,
    (500, 2000): 3000, (20000, 2000): 1000,
}
#: tuning.py ``BYTES_PER_ELEM``: bytes per weight / KV element by quantization algorithm
#: (NO_QUANT 2, FP8 and FP8 block scales 1, NVFP4 0.5).
_BYTES_PER_ELEM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
#: finetune_setting caps: decoder buffers (batch 4096) and activation buffers (32768 tokens).
_MAX_BATCH_CAP = 4096
_MAX_TOKENS_CAP = 32768


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchLimits:
    """Engine limits ``trtllm-bench throughput`` picks, and the inputs it derived them from."""

    max_batch_size: int
    max_num_tokens: int
    kv_max_requests: float
    """Requests of ISL + OSL tokens the heuristic expects to fit in the KV memory."""


def _round_up_tiered(x: float, minimum: int,
                     tiers: tuple[tuple[float, int], ...]) -> int:
    """``x`` rounded up to the step of the first ``(limit, step)`` tier with ``x < limit``,
    and at least ``minimum`` (the batch-size and token ladders of trtllm-bench's heuristic)."""
    step = next(step for limit, step in tiers if x < limit)
    return max(minimum, step * math.ceil(x / step))


def bench_limits(*, params: float, num_layers: int, num_kv_heads: int, head_dim: int,
                 tp: int, pp: int, isl: int, osl: int, device_memory_gib: float,
                 weight_dtype: str, kv_dtype: str, kv_fraction: float,
                 chunked_prefill: bool = False) -> BenchLimits:
    """``(max_batch_size, max_num_tokens)`` of ``trtllm-bench throughput`` for a dataset of
    mean lengths ``isl`` / ``osl`` (every request the same here: ``max_isl == isl``).

    The heuristic estimates the KV memory as ``kv_fraction x (tp x pp x device memory -
    params x bytes per weight)``, the KV bytes per token as ``2 x layers x max(tp, kv heads) x
    head_dim x bytes per KV element``, and from them the requests of ``isl + osl`` tokens that
    fit (``kv_max_requests``). Then it rounds "slightly optimistic": the batch (capped at 4096,
    divided by ``pp``) up to a multiple of 32 (at least 64) below 256, of 128 below 1024, else
    of 256; the tokens ``min(batch x (1 + isl/osl), 32768)`` up to a multiple of 256 (at least
    2048) below 4096, of 512 below 8192, else of 1024. Without chunked prefill the token limit
    is raised to ``isl + max_batch_size`` so a whole prompt always fits beside a full batch.

    Raises:
        ConfigError: a dtype without a heuristic entry, a non-positive size, or a model that
            leaves no KV memory (trtllm-bench refuses such a run).
    """
    for name, dtype in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype)):
        if dtype not in _BYTES_PER_ELEM:
            raise ConfigError(
                f"`{name}` must be one of {sorted(_BYTES_PER_ELEM)}, but got {dtype!r}")
    for name, v in (("tp", tp), ("pp", pp), ("isl", isl), ("osl", osl),
                    ("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                    ("head_dim", head_dim)):
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"`{name}` must be a positive integer, but got {v!r}")
    if not 0.0 < kv_fraction <= 1.0:
        raise ConfigError(f"`kv_fraction` must be in (0, 1], but got {kv_fraction}")
    gib = float(2**30)
    kv_gib_per_token = (2 * num_layers * max(tp, num_kv_heads) * head_dim
                        * _BYTES_PER_ELEM[kv_dtype] / gib)
    engine_gib = params * _BYTES_PER_ELEM[weight_dtype] / gib
    cache_gib = (device_memory_gib * tp * pp - engine_gib) * kv_fraction
    requests = cache_gib / (kv_gib_per_token * (isl + osl))
    if requests < 1:
        raise ConfigError(f"trtllm-bench: KV memory {cache_gib:.1f} GiB holds no request of "
                          f"{isl + osl} tokens (the benchmark refuses this mapping)")
    raw_bs = min(requests, _MAX_BATCH_CAP) / pp
    raw_tokens = min(raw_bs * (1 + isl / osl), _MAX_TOKENS_CAP)
    bs = _round_up_tiered(raw_bs, 64, ((256, 32), (1024, 128), (math.inf, 256)))
    tokens = _round_up_tiered(raw_tokens, 2048, ((4096, 256), (8192, 512), (math.inf, 1024)))
    if not chunked_prefill:
        tokens = max(tokens, isl + bs)
    return BenchLimits(max_batch_size=int(bs), max_num_tokens=int(tokens),
                       kv_max_requests=float(requests))


def captured_graph_sizes(sizes: tuple[int, ...], *, max_batch_size: int,
                         max_num_tokens: int) -> tuple[int, ...]:
    """CUDA-graph batch sizes the executor captures: the requested ``sizes`` up to the largest
    pure-decode batch ``min(max_batch_size, max_num_tokens)``, plus that batch itself when a
    larger size was requested (padding on)."""
    top = min(max_batch_size, max_num_tokens)
    kept = [s for s in sorted(sizes) if s <= top]
    if any(s > top for s in sizes) and (not kept or kept[-1] != top):
        kept.append(top)
    return tuple(kept)


def perf_overview_num_requests(isl: int, osl: int) -> int | None:
    """``$num_requests`` of the perf overview's dataset for ``isl``/``osl`` (None: no row)."""
    return _PERF_OVERVIEW_REQUESTS.get((int(isl), int(osl)))


def kv_blocks(model: ModelSpec, cluster: ClusterSpec, *, tp: int, pp: int, max_num_tokens: int,
              block_size: int, kv_dtype: str, weight_dtype: str, kv_fraction: float) -> int:
    """KV blocks per replica as the PyTorch executor sizes them: ``kv_fraction`` of the memory
    a forward pass of ``max_num_tokens`` leaves free (device minus weights, activations, the
    CUDA-graph pool and non-torch buffers: ``memory.serving.kv_cache_capacity``'s ``free``
    rule; the checkpoint's bf16 modules, such as the embedding and LM head, at 2 bytes a
    weight)."""
    from charon_search.memory.serving import kv_cache_capacity
    from charon_search.serving._graphs import weight_storage

    cap = kv_cache_capacity(model, cluster, tp=tp, pp=pp, gpu_memory_utilization=kv_fraction,
                            memory_rule="free", max_batched_tokens=max_num_tokens,
                            block_size=block_size, kv_dtype=kv_dtype,
                            **weight_storage(model, weight_dtype))
    return cap.num_blocks


def perf_overview_engine(model: ModelSpec, cluster: ClusterSpec, *, tp: int, pp: int, isl: int,
                         osl: int, precision: str, kv_dtype: str,
                         kv_fraction: float = PERF_OVERVIEW_KV_FRACTION,
                         ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``ServingConfig`` fields and their sources for a perf-overview row: the limits
    ``trtllm-bench`` picks for this model, mapping and dataset, the TensorRT-LLM engine profile
    (``serving.backends``) and the KV capacity the executor allocates."""
    from charon_search.serving.backends import TRTLLM_TOKENS_PER_BLOCK, engine_profile

    limits = bench_limits(
        params=float(model.num_params), num_layers=int(model.num_layers),
        num_kv_heads=int(model.num_key_value_heads), head_dim=int(model.head_dim),
        tp=tp, pp=pp, isl=isl, osl=osl,
        device_memory_gib=cluster.gpu.hbm_capacity_bytes / float(2**30),
        weight_dtype=precision, kv_dtype=kv_dtype, kv_fraction=kv_fraction)
    prof = engine_profile("trtllm", isl=isl, osl=osl, tp=tp, launcher="trtllm_bench",
                          max_batch_size=limits.max_batch_size,
                          max_num_tokens=limits.max_num_tokens)
    kw = prof.config_kwargs()
    blocks = kv_blocks(model, cluster, tp=tp, pp=pp, max_num_tokens=limits.max_num_tokens,
                       block_size=TRTLLM_TOKENS_PER_BLOCK, kv_dtype=kv_dtype,
                       weight_dtype=precision, kv_fraction=kv_fraction)
    kw["num_kv_blocks"] = blocks
    notes = (*prof.sources,
             f"heuristic KV estimate {limits.kv_max_requests:.0f} requests of {isl + osl} "
             f"tokens (kv_cache_free_gpu_mem_fraction {kv_fraction}: the perf overview's "
             "'in many cases' value)",
             f"KV cache {blocks * TRTLLM_TOKENS_PER_BLOCK} tokens per replica = {kv_fraction} x "
             "memory free after the profiling forward (KvCacheCreator._cal_max_tokens)")
    return kw, notes
