"""What each serving engine does by default, and how the silicon benchmark drives it.

A measured serving row names its engine (``vllm``, ``sglang``, ``trtllm``); the engine's
scheduler policy and limits are facts of that engine and of the launch flags the measurement
used, not fitted numbers. ``engine_profile`` turns them into ``ServingConfig`` fields, each with
its source. ``BenchmarkProtocol`` is the load generator's side: the closed-loop client, its
warm-up and its dataset.

Sources (read, not copied):

* aiconfigurator (Apache-2.0), ``generator/rule_plugin/{vllm,sglang,trtllm}.rule`` and
  ``generator/config/backend_templates``: the launch flags its deployments pass;
  ``generator/config/backend_templates/benchmark/bench_run.sh.j2``: the aiperf command its
  benchmarks run.
* vLLM v1 ``EngineArgs`` defaults and ``v1/core/sched/scheduler.py`` (decode-first unified
  token budget); SGLang ``server_args.py`` defaults and ``managers/scheduler.py``
  (``get_next_batch_to_run``: a new prefill batch runs before decoding, and is mixed with the
  running decodes only under ``--enable-mixed-chunk``); TensorRT-LLM ``LlmArgs`` defaults.
* SemiAnalysis InferenceX (Apache-2.0), ``benchmarks/*.sh`` (per-model launch recipes),
  ``benchmarks/benchmark_lib.sh`` and ``utils/bench_serving/benchmark_serving.py`` (its client),
  ``.github/workflows/benchmark-tmpl.yml`` (``RANDOM_RANGE_RATIO``): the dated-dump rows.
* TensorRT-LLM ``PyExecutor._waiting_requests`` (batch waiting) and ``_handle_responses``
  (the first token is returned at once whatever ``stream_interval`` is; the DeepSeek rows
  measure a delay all the same, ``INFERENCEX_DSR1_TRT_STREAM_INTERVAL``).
* The overlap schedulers (``ServingConfig.overlap_scheduler``): TensorRT-LLM
  ``PyExecutor._executor_loop_overlap``, SGLang ``Scheduler.event_loop_overlap`` and vLLM's
  ``--async-scheduling`` schedule and launch batch n + 1 before they process batch n's results
  and send its responses, so a prompt sent in answer to a response is seen two batches later.
* ``trtllm-bench throughput`` (the TensorRT-LLM performance overview): ``serving.trtllm_bench``.
* InferenceX ``benchmarks/dsr1_fp8_h200.sh`` / ``dsr1_fp8_h200_trt.sh``: the DeepSeek-R1 FP8
  H200 launches (SGLang prefill sizes and running-request cap; TensorRT-LLM max_num_tokens).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from charon_search.errors import ConfigError
from charon_search.hardware.spec import SERVING_ENGINES, GpuSpec
from charon_search.serving.config import DEFAULT_CUDA_GRAPH_SIZES

__all__ = ["AIPERF_AIC", "BACKENDS", "INFERENCEX", "BenchmarkProtocol", "EngineProfile",
           "engine_profile", "inferencex_prompt_inflation", "inferencex_spec_decoding_unknown",
           "sglang_default_chunked_prefill"]

BACKENDS = SERVING_ENGINES

#: vLLM v1 default ``max_num_batched_tokens`` of the OpenAI API server on GPUs with >= 70 GiB
#: (H100/H200): 8192 (``EngineArgs._set_default_args``, v0.10+). aiconfigurator's vLLM 0.12
#: launch template passes no ``--max-num-batched-tokens``, so the default applies.
VLLM_API_SERVER_BATCHED_TOKENS = 8192
#: SGLang default ``chunked_prefill_size`` on 35-160 GiB GPUs (H100, H200): 8192; on GPUs of
#: ``SGLANG_LARGE_GPU_MIB`` or more (B200, B300, GB200, GB300): 16384; below
#: ``SGLANG_SMALL_GPU_MIB`` (A10, L4, RTX 4090): 2048 (``ServerArgs`` GPU-memory-dependent
#: defaults, 0.5.x: ``gpu_mem < 35 * 1024`` MiB -> 2048, ``< 160 * 1024`` -> 8192 "H100, H200,
#: A100, H20", else 16384 "B200, MI300").
SGLANG_CHUNKED_PREFILL_SIZE = 8192
SGLANG_CHUNKED_PREFILL_SIZE_LARGE = 16384
SGLANG_CHUNKED_PREFILL_SIZE_SMALL = 2048
SGLANG_LARGE_GPU_MIB = 160 * 1024
SGLANG_SMALL_GPU_MIB = 35 * 1024
#: The rule above, as the engine profiles' source lines state it.
SGLANG_CHUNK_DEFAULT_RULE = (
    f"ServerArgs default by GPU memory: {SGLANG_CHUNKED_PREFILL_SIZE_SMALL} below "
    f"{SGLANG_SMALL_GPU_MIB // 1024} GiB, {SGLANG_CHUNKED_PREFILL_SIZE} below "
    f"{SGLANG_LARGE_GPU_MIB // 1024} GiB, {SGLANG_CHUNKED_PREFILL_SIZE_LARGE} from there")


def sglang_default_chunked_prefill(gpu: str | GpuSpec) -> int:
    """SGLang's default ``chunked_prefill_size`` on ``gpu`` (a ``GpuSpec``, or a GPU spec name
    or alias; "" = unknown: the 35-160 GiB value)."""
    if not gpu:
        return SGLANG_CHUNKED_PREFILL_SIZE
    from charon_search.hardware import load_gpu

    spec = load_gpu(gpu) if isinstance(gpu, str) else gpu
    mib = spec.hbm_capacity_bytes / 2**20
    if mib >= SGLANG_LARGE_GPU_MIB:
        return SGLANG_CHUNKED_PREFILL_SIZE_LARGE
    return SGLANG_CHUNKED_PREFILL_SIZE if mib >= SGLANG_SMALL_GPU_MIB else \
        SGLANG_CHUNKED_PREFILL_SIZE_SMALL


#: SGLang's default ``--mem-fraction-static`` (0.5.x ``ServerArgs._handle_gpu_memory_settings``):
#: ``round((gpu_mem - reserved) / gpu_mem, 3)`` with ``gpu_mem`` the device's MiB and
#: ``reserved`` (MiB) = 512 ("constant meta data, e.g. from attention backend") + 1.5 x
#: max(chunked_prefill_size, 2048) ("for activation during large prefill"; max_prefill_tokens
#: when chunking is off) + 2 x cuda_graph_max_bs ("for cuda graphs") + tp x pp / 8 x 1024
#: ("adjustments for large parallel size"); attention DP adds 3 x cuda_graph_max_bs x dp, and
#: 1.5 x cuda_graph_max_bs x dp more above 300; on GPUs above 60 GiB at least 10 GiB; EAGLE /
#: MTP drafts add 2 GiB on top. The rule of sgl-project/sglang#10975 ("General heuristics for
#: --mem-fraction-static"), which the 0.5.6-0.5.10 silicon rows' releases carry; releases before
#: it reserved a flat (9.5 + tp x pp / 2) GiB on 35-90 GiB GPUs and (12 + tp x pp / 2) GiB up to
#: 160 GiB. Its ``adjust_mem_fraction_for_vlm`` for multimodal checkpoints (x 0.95 x a ViT-size
#: factor) is not modelled: the catalog ships the language models' configs only.
SGLANG_RESERVED_BASE_MIB = 512
SGLANG_RESERVED_PER_PREFILL_TOKEN_MIB = 1.5
SGLANG_RESERVED_MIN_PREFILL_TOKENS = 2048
SGLANG_RESERVED_PER_GRAPH_BS_MIB = 2
SGLANG_RESERVED_PER_RANK_MIB = 1024 / 8
SGLANG_RESERVED_FLOOR_MIB = 10 * 1024
SGLANG_RESERVED_FLOOR_ABOVE_MIB = 60 * 1024
SGLANG_RESERVED_SPECULATIVE_MIB = 2 * 1024
#: SGLang's default ``cuda_graph_max_bs`` by GPU memory (the same ``ServerArgs`` method): 256
#: below tensor parallelism 4 and 512 from it on 60-160 GiB GPUs ("H100, H200, A100"), 512 from
#: 160 GiB ("B200"), and its fallback 160 elsewhere.
SGLANG_GRAPH_BS_LARGE_GPU = 512
SGLANG_GRAPH_BS_MIN_GPU_MIB = 60 * 1024
SGLANG_GRAPH_BS = (256, 512)
SGLANG_GRAPH_BS_FALLBACK = 160


def sglang_default_cuda_graph_max_bs(gpu: GpuSpec | None, *, tp: int) -> int:
    """SGLang's default ``cuda_graph_max_bs`` on ``gpu`` at tensor parallelism ``tp`` (rule
    above; None = a GPU of unknown memory, taken as 60-160 GiB like the chunk default)."""
    mib = gpu.hbm_capacity_bytes / 2**20 if gpu is not None else SGLANG_GRAPH_BS_MIN_GPU_MIB
    if mib >= SGLANG_LARGE_GPU_MIB:
        return SGLANG_GRAPH_BS_LARGE_GPU
    if mib >= SGLANG_GRAPH_BS_MIN_GPU_MIB:
        return SGLANG_GRAPH_BS[tp >= 4]
    return SGLANG_GRAPH_BS_FALLBACK


def sglang_cuda_graph_sizes(max_bs: int) -> tuple[int, ...]:
    """The decode batch sizes SGLang captures up to ``max_bs`` with padding and without
    speculative decoding (``ServerArgs._generate_cuda_graph_batch_sizes``, 0.5.x): 1, 2, 4, 8,
    12, every 8th size from 16 to 256, every 16th from 272 to 496, every 32nd from 512.
    Speculative decoding captures a denser list (not modelled: these sizes are kept)."""
    sizes = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
             *range(512, max_bs + 1, 32))
    return tuple(x for x in sizes if x <= max_bs)


#: TensorRT-LLM's default CUDA graphs (``CudaGraphConfig``, tensorrt_llm/llmapi/llm_args.py):
#: ``enable_padding`` False and, with no ``batch_sizes``, ``max_batch_size`` 128, so
#: ``_generate_cuda_graph_batch_sizes(128, False)`` = 1..31, 32, 64, 128. Without padding a
#: generation batch of another size runs eagerly.
TRTLLM_DEFAULT_CUDA_GRAPH_SIZES = (*range(1, 32), 32, 64, 128)


def sglang_default_mem_fraction(gpu: GpuSpec, *, tp: int, pp: int = 1, prefill_tokens: int,
                                cuda_graph_max_bs: int = 0, dp_attention: int = 0,
                                speculative: bool = False) -> float:
    """SGLang's ``mem_fraction_static`` when a launch passes none (rule above): on ``gpu``, a
    replica of ``tp`` x ``pp`` ranks chunking prefills at ``prefill_tokens``, capturing decode
    graphs up to ``cuda_graph_max_bs`` (0: SGLang's default for the GPU), ``dp_attention``
    attention-DP ranks (0: none) and a speculative draft model where ``speculative``."""
    mib = gpu.hbm_capacity_bytes / 2**20
    bs = cuda_graph_max_bs or sglang_default_cuda_graph_max_bs(gpu, tp=tp)
    reserved = (SGLANG_RESERVED_BASE_MIB
                + SGLANG_RESERVED_PER_PREFILL_TOKEN_MIB
                * max(prefill_tokens, SGLANG_RESERVED_MIN_PREFILL_TOKENS)
                + SGLANG_RESERVED_PER_GRAPH_BS_MIB * bs + SGLANG_RESERVED_PER_RANK_MIB * tp * pp)
    if dp_attention:
        reserved += 3 * bs * dp_attention + (1.5 * bs * dp_attention if bs > 300 else 0.0)
    if mib > SGLANG_RESERVED_FLOOR_ABOVE_MIB:
        reserved = max(reserved, SGLANG_RESERVED_FLOOR_MIB)
    if speculative:
        reserved += SGLANG_RESERVED_SPECULATIVE_MIB
    return round((mib - reserved) / mib, 3)


#: An engine's memory rule (``memory.serving.MEMORY_RULES``) and its fraction when a launch
#: sets none: vLLM ``gpu_memory_utilization`` 0.9 of the device (``CacheConfig`` default);
#: TensorRT-LLM ``free_gpu_memory_fraction`` 0.9 of the memory left free (``KvCacheConfig``
#: default); SGLang a static share computed per launch (``sglang_default_mem_fraction``).
ENGINE_MEMORY_RULES = {"vllm": ("total", 0.9), "trtllm": ("free", 0.9), "sglang": ("static", 0.0)}
#: A launch of no named engine: vLLM's accounting.
DEFAULT_MEMORY_RULE = ENGINE_MEMORY_RULES["vllm"]


def engine_memory(config: Any, gpu: GpuSpec, *, tp: int, pp: int,
                  dp_attention: bool) -> tuple[str, float]:
    """``(memory rule, fraction)`` a ``ServingConfig`` replica of ``tp`` x ``pp`` ranks sizes
    its KV cache by: ``config.gpu_memory_utilization`` read as its engine's knob, or that
    engine's default (``ENGINE_MEMORY_RULES``; SGLang's from its prefill chunk, largest
    captured decode batch, attention DP and draft model)."""
    rule, fraction = ENGINE_MEMORY_RULES.get(config.engine, DEFAULT_MEMORY_RULE)
    if config.gpu_memory_utilization is not None:
        return rule, float(config.gpu_memory_utilization)
    if rule != "static":
        return rule, fraction
    sizes = tuple(config.cuda_graph_sizes) if config.cuda_graph else ()
    return rule, sglang_default_mem_fraction(
        gpu, tp=tp, pp=pp,
        prefill_tokens=(config.max_num_batched_tokens if config.chunked_prefill
                        else config.max_prefill_tokens or config.max_num_batched_tokens),
        # A launch that lists its sizes captures up to the largest; else SGLang's own default.
        cuda_graph_max_bs=0 if sizes == DEFAULT_CUDA_GRAPH_SIZES else max(sizes, default=0),
        dp_attention=tp if dp_attention else 0,
        speculative=config.speculative is not None)


def memory_knob(config: Any, gpu: GpuSpec) -> str:
    """``"<knob> <fraction>"`` (e.g. ``mem_fraction_static 0.842``): the memory setting a
    ``ServingConfig`` replica sizes its KV cache by, named as its engine names it
    (``engine_memory`` at the configuration's own degrees)."""
    from charon_search.memory.serving import MEMORY_RULE_KNOBS

    rule, fraction = engine_memory(config, gpu, tp=config.tp, pp=config.pp,
                                   dp_attention=config.dp_attention)
    return f"{MEMORY_RULE_KNOBS[rule]} {fraction:g}"


#: aiconfigurator's rules size prefill limits as ``isl + 1500`` (sglang.rule
#: ``max_prefill_tokens``; the benchmark deployments' ``rule_plugin/benchmark/trtllm.rule``
#: ``agg max_num_tokens = max_batch_size + isl + 1500``; its non-benchmark trtllm.rule adds 500).
AIC_PREFILL_HEADROOM_TOKENS = 1500
#: Why SGLang runs hybrid linear-attention models without its overlap scheduler (unless the
#: launch passes ``--disable-radix-cache``: ``ServerArgs`` disables the overlap schedule for
#: ``mamba_scheduler_strategy == "no_buffer" and not disable_radix_cache``).
SGLANG_HYBRID_NO_OVERLAP = (
    "SGLang overlap scheduler off: hybrid linear-attention models (Qwen3-Next, Qwen3.5) keep "
    "their prefix cache in MambaRadixCache, whose default 'no_buffer' strategy 'will "
    "automatically close overlap schedule' (SGLang docs/basic_usage/qwen3.md, Mamba Radix "
    "Cache); the cluster's per-iteration host time applies")
#: SGLang's ``max_prefill_tokens`` when nobody sets it: 16384 (``ServerArgs``).
SGLANG_DEFAULT_MAX_PREFILL_TOKENS = 16384
LAUNCHERS = ("aiconfigurator", "inferencex", "engine_defaults", "trtllm_bench")
#: TensorRT-LLM ``KvCacheConfig.tokens_per_block`` default (llmapi/llm_args.py): 32.
TRTLLM_TOKENS_PER_BLOCK = 32
#: InferenceX ``benchmarks/70b_fp8_h200_trt_slurm.sh`` (the version at commit a267b4b):
#: ``trtllm-serve --max_num_tokens 16384``. Another stored version passes ``MAX_MODEL_LEN``
#: (2248 at 1k/1k) instead; the 1k/1k TP < 8 rows are consistent only with 16384 (with 2248 a
#: batch of waiting prompts could never reach 0.9 x max_num_tokens beside the decodes, and at
#: concurrency 128 the prompts would queue ~4x longer than measured).
INFERENCEX_70B_TRT_MAX_NUM_TOKENS = 16384
#: InferenceX ``benchmarks/dsr1_fp8_h200.sh`` (SGLang; commits 1fc5d73 and d1c47c8):
#: ``--chunked-prefill-size 32768 --max-prefill-tokens 32768``, and ``--max-running-requests`` =
#: ``--cuda-graph-max-bs`` = 512 at 1k/1k, else 256 (indexed by ``isl == osl == 1024``).
INFERENCEX_DSR1_SGLANG_PREFILL_TOKENS = 32768
INFERENCEX_DSR1_SGLANG_MAX_RUNNING = (256, 512)
#: Same recipe: ``--stream-interval 10``.
INFERENCEX_DSR1_SGLANG_STREAM_INTERVAL = 10
#: InferenceX ``benchmarks/dsr1_fp4_b200.sh`` (commit 1fc5d73, the version that streams every 10
#: tokens like the rows; ``dsr1_fp4_b300.sh`` reuses it): ``--chunked-prefill-size 16384``, no
#: ``--max-prefill-tokens`` (SGLang's default, 16384), ``--max-running-requests`` =
#: ``--cuda-graph-max-bs`` = 256.
INFERENCEX_DSR1_SGLANG_FP4_BLACKWELL = (16384, 256)
#: The stored FP8 Blackwell recipes (``dsr1_fp8_b200.sh``, ``single_node/dsr1_fp8_b300.sh``) are
#: not taken for the FP8 TP 8 rows: besides streaming every 30 tokens (see
#: ``INFERENCEX_DSR1_SGLANG_RECV_INTERVALS``) they cap TP 8 at 128 running requests, and the B200
#: FP8 TP 8 rows at concurrency 256 and 512 measure 2-3 s TTFT where that cap predicts 27-213 s
#: of queueing: those rows ran the H200 recipe's limits.
#: The TP 4 branch of the same B200 FP8 recipe (``dsr1_fp8_b200.sh``, commit 1fc5d73, and
#: ``single_node/dsr1_fp8_b200.sh``, alike) is the only stored SGLang DeepSeek-R1 launch at TP 4,
#: and it is taken for the B200 FP8 TP 4 rows: it runs 8k/1k only ("TP=4 not yet supported for
#: ISL=..."), the rows' only shape, at ``--max-running-requests`` = ``--cuda-graph-max-bs`` 32,
#: the rows' largest concurrency, with ``--mem-fraction-static 0.95`` (at the H200 recipe's 0.82
#: the 157.5 GiB of FP8 weights per GPU leave no KV cache), ``--chunked-prefill-size`` =
#: ``--max-prefill-tokens`` 8192, ``--scheduler-recv-interval 10`` at every concurrency. Its
#: ``--stream-interval 30`` is simulated as the DeepSeek rows' 10 (``ServingConfig.
#: stream_interval``'s first-chunk rule is empirical): on the day these SGLang 0.5.9 rows were
#: measured (2026-03-25) the same recipe's TP 8 FP8 1k/1k run at 8 streams without MTP measured
#: 226.6 ms TTFT / 10.8 ms TPOT, 211 ms simulated at 10 and 422 ms at 30 (the row itself is not
#: expressed: InferenceX ran that layout with and without MTP). Its 8k-prompt rows, TP 4 and
#: TP 8 alike, come out 24-29 % short at 10, so what they miss grows with the prompt, not the
#: stream interval. Its ``--attention-backend trtllm_mla`` and ``--moe-runner-backend
#: flashinfer_trtllm`` are not modelled as such (the kernels are priced from the shipped SGLang /
#: TensorRT-LLM tables). The branch is taken at TP 4 whatever the lengths, where the recipe
#: would exit for any but 8k/1k.
#: (chunk and prefill tokens, running requests, memory fraction, recv interval)
INFERENCEX_DSR1_SGLANG_FP8_B200_TP4 = (8192, 32, 0.95, 10)
#: InferenceX ``benchmarks/dsr1_fp8_h200_trt.sh`` (commit 1fc5d73): ``MAX_NUM_TOKENS`` is
#: ``CONC + ISL + 64`` rounded up to a multiple of 64, at least 8192.
INFERENCEX_DSR1_TRT_MIN_NUM_TOKENS = 8192
#: Same recipe (and ``dsr1_fp4_b200_trt.sh``, ``dsr1_fp8_b200_trt.sh``, the ``*_trt_mtp.sh``
#: siblings): ``stream_interval: 10`` and no ``num_postprocess_workers``. The client's first chunk
#: is taken to carry the 10th token (``ServingConfig.stream_interval``), the empirical rule of the
#: SGLang DeepSeek rows: before it, the TTFT of the InferenceX TensorRT-LLM DeepSeek rows at up to
#: 16 streams sat 7.6-8.9 decode steps (median per model and GPU, in measured TPOTs) above the
#: simulation, where the rule puts 9 (TTFT median |error| of the 144 rows 49.9 -> 26.5 %). As for
#: SGLang, the cause is not identified: ``PyExecutor._handle_responses`` returns a request's first
#: token at once whatever the interval. InferenceX's Llama-3.3-70B and gpt-oss TensorRT-LLM recipes
#: also stream every 10 / 20 tokens but run 2 / 4 post-processing workers, and their rows show no
#: such delay (-1.6 .. +0.2 and +1.3 .. +4.3 steps), so the rule is not applied to them.
INFERENCEX_DSR1_TRT_STREAM_INTERVAL = 10
#: Same recipe, with ``DP_ATTENTION=true``: ``attention_dp_config: {batching_wait_iters: 0,
#: enable_balance: true, timeout_iters: 60}``.
INFERENCEX_DSR1_TRT_ADP_TIMEOUT_ITERS = 60
#: InferenceX PR #392 ("Add MTP Benchmark Support for DeepSeek-R1 TRT", description dated
#: 2026-01-07) added ``dsr1-fp8-h200-trt-mtp``, ``dsr1-fp8-b200-trt-mtp`` and
#: ``dsr1-fp4-b200-trt-mtp`` to ``.github/configs/nvidia-master.yaml``: the layouts (TP8 EP8,
#: attention DP at the top concurrencies) and the image (``tensorrt-llm/release:1.1.0rc2.post2``
#: on H200) of the plain ``dsr1-*-trt`` configs, plus ``spec-decoding: mtp``
#: (``benchmarks/dsr1_fp8_h200_trt_mtp.sh``: MTP 3, or 1 under attention DP). InferenceX keys a
#: configuration by its speculative method (InferenceX-app ``configs.spec_method``); the silicon
#: rows do not carry it, so a single-node TensorRT-LLM DeepSeek row measured from this date on
#: may have run either (the dump holds two H200 TP8 EP8 C64 1k/8k rows of that image, measured
#: 2026-01-28 and 2026-01-14: 32.2 and 19.4 ms TPOT).
INFERENCEX_TRT_MTP_SINCE = "2026-01-07"
#: InferenceX ``benchmarks/gptoss_fp4_h200_trt.sh``: ``trtllm-serve --max_num_tokens 20000``.
INFERENCEX_GPTOSS_TRT_MAX_NUM_TOKENS = 20000
#: ``kv_cache_config.free_gpu_memory_fraction`` of InferenceX's TensorRT-LLM recipes: DeepSeek-R1
#: 0.75 on Hopper (``dsr1_fp8_h200_trt.sh``) and 0.8 on Blackwell (``dsr1_fp4_b200_trt.sh``, and
#: ``dsr1_fp8_b200_trt.sh`` but for 0.7 at 1k prompts from 256 streams and 0.75 at 8k prompts on
#: TP 4, not modelled); gpt-oss 0.85 (``gptoss_fp4_h200_trt.sh``, ``gptoss_fp4_b200_trt.sh``).
#: The Llama-3.3-70B recipe (``70b_fp8_h200_trt_slurm.sh``) sets none: TensorRT-LLM's 0.9.
INFERENCEX_DSR1_TRT_FREE_MEMORY = {"hopper": 0.75, "blackwell": 0.8}
INFERENCEX_GPTOSS_TRT_FREE_MEMORY = 0.85
#: InferenceX ``benchmarks/70b_fp8_h200_trt_slurm.sh``, 1k/1k at TP < 8:
#: ``batch_wait_max_tokens_ratio: 0.9``, ``batch_wait_timeout_iters: 20``.
INFERENCEX_70B_TRT_WAIT_RATIO = 0.9
INFERENCEX_70B_TRT_WAIT_ITERS = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class MtpSibling:
    """An InferenceX single-node configuration that ran a layout of a plain configuration with
    speculative decoding (``spec-decoding: mtp``, EAGLE / MTP heads): from ``since`` (the PR's
    description date) on, a row of that layout may come from either, and the rows do not say
    which. ``model`` is a substring of the row's model name; empty / 0 fields match anything."""

    since: str
    source: str
    backend: str
    model: str
    gpu: str = ""
    precision: str = ""
    tp: int = 0
    ep: int = 0

    def covers(self, *, backend: str, model: str, gpu: str, precision: str, tp: int,
               ep: int) -> bool:
        return (backend == self.backend and self.model in model.lower()
                and gpu.startswith(self.gpu)
                and (not self.precision or precision == self.precision)
                and (not self.tp or tp == self.tp) and (not self.ep or ep == self.ep))


def _sglang_mtp(since: str, key: str, pr: int, model: str, gpu: str, precision: str,
                *layouts: tuple[int, int]) -> tuple[MtpSibling, ...]:
    """One ``MtpSibling`` per ``(tp, ep)`` layout of an SGLang ``-mtp`` configuration."""
    return tuple(MtpSibling(since=since, source=f"{key} of InferenceX PR #{pr}", backend="sglang",
                            model=model, gpu=gpu, precision=precision, tp=tp, ep=ep)
                 for tp, ep in layouts)


#: InferenceX's speculative siblings of the single-node configurations the shipped rows come
#: from, with the layouts they ran (their ``perf-changelog.yaml`` entries and PR descriptions;
#: dates are the PRs' description dates). The dump shows what they do to a row: on 2026-03-25
#: the SGLang 0.5.9 DeepSeek-R1 FP8 TP 8 rows on B200 were measured twice (1k/1k at 8 streams:
#: 227 ms TTFT / 10.8 ms TPOT and 364 / 8.8), and TensorRT-LLM's H200 TP8 EP8 C64 1k/8k rows of
#: one image 32.2 and 19.4 ms TPOT. Later siblings (DeepSeek-R1 FP4 B200 and FP8 H200 SGLang,
#: 2026-05-20; GLM-5 FP8 H200, 2026-05-18) postdate every shipped row of their layouts.
#: MiniMax-M2.5, Kimi-K2.5, gpt-oss and Llama-3 had none in that period.
INFERENCEX_MTP_SIBLINGS: tuple[MtpSibling, ...] = (
    # PR #392: dsr1-fp8-h200-trt-mtp, dsr1-fp8-b200-trt-mtp, dsr1-fp4-b200-trt-mtp, the layouts
    # (TP8 EP8, attention DP at the top concurrencies) and image of the plain dsr1-*-trt configs.
    MtpSibling(since=INFERENCEX_TRT_MTP_SINCE, backend="trtllm", model="deepseek",
               source="the dsr1-*-trt-mtp configs of InferenceX PR #392, same layouts and "
                      "image"),
    *_sglang_mtp("2026-02-03", "dsr1-fp8-b200-sglang-mtp", 626, "deepseek", "b200", "fp8",
                 (8, 1)),
    *_sglang_mtp("2026-04-17", "dsr1-fp8-b300-sglang-mtp", 1059, "deepseek", "b300", "fp8",
                 (8, 1)),
    *_sglang_mtp("2026-03-09", "qwen3.5-fp8-b200-sglang-mtp", 898, "qwen3.5", "b200", "fp8",
                 (4, 1)),
    *_sglang_mtp("2026-04-03", "qwen3.5-fp8-h200-sglang-mtp", 1001, "qwen3.5", "h200", "fp8",
                 (8, 8)),
    # PR #1035's description falls between 2026-04-14 and 2026-04-16: the earliest is taken.
    *_sglang_mtp("2026-04-14", "qwen3.5-fp8-b300-sglang-mtp", 1035, "qwen3.5", "b300", "fp8",
                 (4, 0)),
    *_sglang_mtp("2026-04-18", "qwen3.5-bf16-b200-sglang-mtp", 1074, "qwen3.5", "b200", "bf16",
                 (8, 1)),
    *_sglang_mtp("2026-04-18", "qwen3.5-fp4-b200-sglang-mtp", 1075, "qwen3.5", "b200", "fp4",
                 (4, 1)),
    *_sglang_mtp("2026-04-18", "qwen3.5-bf16-b300-sglang-mtp", 1082, "qwen3.5", "b300", "bf16",
                 (8, 1), (4, 1)),
    *_sglang_mtp("2026-04-18", "qwen3.5-fp4-b300-sglang-mtp", 1083, "qwen3.5", "b300", "fp4",
                 (4, 1), (2, 2)),
    *_sglang_mtp("2026-04-18", "glm5-fp8-b300-sglang-mtp", 1084, "glm-5", "b300", "fp8", (8, 1)),
    *_sglang_mtp("2026-04-18", "glm5-fp8-b200-sglang-mtp", 1085, "glm-5", "b200", "fp8", (8, 1)),
    *_sglang_mtp("2026-04-18", "glm5-fp4-b200-sglang-mtp", 1087, "glm-5", "b200", "fp4",
                 (8, 1), (4, 1)),
    *_sglang_mtp("2026-04-18", "glm5-fp4-b300-sglang-mtp", 1088, "glm-5", "b300", "fp4",
                 (8, 1), (4, 1)),
)


def inferencex_spec_decoding_unknown(*, backend: str, model: str, mode: str, measured: str,
                                     gpu: str = "", precision: str = "", tp: int = 0,
                                     ep: int = 0) -> str | None:
    """Why an InferenceX row cannot be simulated because it may have run speculative decoding
    (``None``: it cannot have): a single-node row of a layout that an
    ``INFERENCEX_MTP_SIBLINGS`` configuration also ran by the row's measurement date
    (``measured``, ``YYYY-MM-DD...``; empty: unknown, taken as before any of them)."""
    if mode != "agg" or not measured:
        return None
    for sib in INFERENCEX_MTP_SIBLINGS:
        if measured[:10] >= sib.since and sib.covers(backend=backend, model=model, gpu=gpu,
                                                    precision=precision, tp=tp, ep=ep):
            return (f"speculative decoding unknown: measured {measured[:10]}, when InferenceX "
                    f"ran this layout both with and without it ({sib.source}, from "
                    f"{sib.since}), and the row does not say which")
    return None


#: InferenceX's benchmark client builds its random prompts by decoding random token ids with the
#: model's tokenizer as *it* loads it; the server re-tokenizes the text. Under transformers 5,
#: ``LlamaTokenizerFast`` rebuilds its pre-tokenizer and decoder, so a DeepSeek-V3-family
#: tokenizer (declared ``LlamaTokenizerFast`` over a ByteLevel ``tokenizer.json``) decodes to
#: text that the server's tokenizer (SGLang repairs it, ``_fix_v5_tokenizer_components``) reads
#: as about five times as many tokens: InferenceX PR #937 (2026-03-24) measured a 7140-token
#: client prompt at 35921 tokens on an SGLang server with transformers 5.3.0. Its fix went into
#: ``backend_request_func.get_tokenizer``, but ``benchmark_serving.py`` imported vLLM's
#: ``get_tokenizer`` first wherever vLLM is installed, as SGLang's images ship it (InferenceX PR
#: #1253 of 2026-05-01 reproduces the unfixed path inside an SGLang v0.5.10 image; PR #1428 then
#: preferred the fixed one). So rows of an SGLang release with transformers 5 (from 0.5.10; the
#: nightly images from 2026-03-14 on, #937's ``0313-2`` image being the last on 4.57.1) measured
#: before 2026-05-01 ran DeepSeek prompts about 35921 / 7140 times their nominal length. The
#: shipped rows bear it out: the 8k-prompt SGLang 0.5.10 DeepSeek rows on B300 decode 1.3-2.2x
#: slower than their nominal contexts allow, growing with concurrency as five-fold contexts do.
INFERENCEX_V5_PROMPT_INFLATION = 35921 / 7140
INFERENCEX_V5_TOKENIZER_SGLANG = (0, 5, 10)
INFERENCEX_V5_TOKENIZER_NIGHTLY_SINCE = "20260314"
INFERENCEX_V5_TOKENIZER_FIXED = "2026-05-01"


def inferencex_prompt_inflation(*, backend: str, version: str, model: str, mode: str,
                                measured: str) -> tuple[float, str] | None:
    """How much longer than nominal an InferenceX row's prompts were on the server, and why
    (``None``: as nominal). See ``INFERENCEX_V5_PROMPT_INFLATION``: SGLang single-node rows
    of a DeepSeek-V3-family checkpoint, on a release with transformers 5, measured (``measured``,
    ``YYYY-MM-DD...``; empty: unknown, taken as unaffected) before the client's fix."""
    name = model.lower()
    if (backend != "sglang" or mode != "agg" or "deepseek" not in name
            or not any(k in name for k in ("v3", "r1")) or not measured
            or measured[:10] >= INFERENCEX_V5_TOKENIZER_FIXED):
        return None
    nightly = "nightly" in version and re.search(r"(?<!\d)(20\d{6})(?!\d)", version)
    if not (release(version)[:3] >= INFERENCEX_V5_TOKENIZER_SGLANG
            or (nightly and nightly.group(1) >= INFERENCEX_V5_TOKENIZER_NIGHTLY_SINCE)):
        return None
    return (INFERENCEX_V5_PROMPT_INFLATION,
            f"prompts x{INFERENCEX_V5_PROMPT_INFLATION:.2f} their nominal length on the server: "
            f"SGLang {version} runs transformers 5, and InferenceX's client (measured "
            f"{measured[:10]}, before its fix of {INFERENCEX_V5_TOKENIZER_FIXED}) decoded its "
            "random DeepSeek prompts with the unrepaired LlamaTokenizerFast (InferenceX PR "
            "#937: 7140 client tokens = 35921 server tokens)")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineProfile:
    """Scheduler facts of one engine for one measured configuration."""

    backend: str
    prefill_schedule: str
    """``ServingConfig.prefill_schedule``."""
    chunked_prefill: bool
    max_num_batched_tokens: int
    max_prefill_tokens: int
    prefix_caching: bool
    decode_in_budget: bool = True
    kv_admission: str = "on_demand"
    overlap_scheduler: bool = False
    """``ServingConfig.overlap_scheduler``: batch n + 1 is formed while the GPU runs n, so the
    host time per iteration is hidden (``iteration_overhead_s``)."""
    batch_wait_iters: int = 0
    batch_wait_tokens: int = 0
    """``ServingConfig.batch_wait_iters`` / ``batch_wait_tokens`` (TensorRT-LLM batch waiting)."""
    adp_balance_timeout_iters: int = 0
    """``ServingConfig.adp_balance_timeout_iters`` (TensorRT-LLM attention-DP balancing)."""
    max_num_seqs: int = 0
    block_size: int = 0
    cuda_graph_sizes: tuple[int, ...] = ()
    cuda_graph_padding: bool = True
    """``ServingConfig.cuda_graph_padding`` (TensorRT-LLM's default: False)."""
    piecewise_graph_tokens: int = 0
    """``ServingConfig.piecewise_graph_tokens`` (vLLM's piecewise CUDA graphs; 0: none)."""
    moe_kernel: str = ""
    allreduce_norm_fusion: bool = False
    stream_interval: int = 0
    scheduler_recv_interval: int = 0
    gpu_memory_utilization: float = 0.0
    kv_dtype: str = ""
    """``ServingConfig`` fields a launcher fixes itself (0 / empty: left to the caller).
    ``kv_dtype="auto"``: the launch passes no KV-cache dtype, so the engine's ``auto`` applies,
    resolved from the checkpoint with the configuration (``serving.resolve_kv_dtype``)."""
    sources: tuple[str, ...]
    """One line per fact: what it is and where it comes from."""
    http_frontend: bool = True
    """Requests come through the engine's HTTP server (its calibrated front-end latency
    applies, ``ServingConfig.engine``); False for an offline benchmark that feeds the executor
    in process (``trtllm-bench``)."""
    frontend: str = ""
    """``ServingConfig.frontend``: ``dynamo`` when the launch streams through NVIDIA Dynamo."""

    def __post_init__(self) -> None:
        if self.backend == "trtllm" and not self.block_size:
            # TensorRT-LLM pages its KV cache in blocks of 32 tokens unless a launch says
            # otherwise; none of the recipes modelled here does.
            object.__setattr__(self, "block_size", TRTLLM_TOKENS_PER_BLOCK)
            object.__setattr__(self, "sources", (
                *self.sources, f"KV blocks of {TRTLLM_TOKENS_PER_BLOCK} tokens "
                "(KvCacheConfig.tokens_per_block default)"))

    @property
    def iteration_overhead_s(self) -> float | None:
        """Host time per iteration the GPU waits for: 0 under an overlap scheduler, else None
        (the cluster's calibrated value)."""
        return 0.0 if self.overlap_scheduler else None

    def config_kwargs(self) -> dict[str, Any]:
        """The ``ServingConfig`` fields this profile sets."""
        own: dict[str, Any] = {k: v for k, v in (
            ("max_num_seqs", self.max_num_seqs), ("block_size", self.block_size),
            ("cuda_graph_sizes", self.cuda_graph_sizes),
            ("piecewise_graph_tokens", self.piecewise_graph_tokens),
            ("moe_kernel", self.moe_kernel),
            ("allreduce_norm_fusion", self.allreduce_norm_fusion),
            ("stream_interval", self.stream_interval),
            ("scheduler_recv_interval", self.scheduler_recv_interval),
            ("gpu_memory_utilization", self.gpu_memory_utilization),
            ("kv_dtype", self.kv_dtype)) if v}
        return {**own, "prefill_schedule": self.prefill_schedule,
                "chunked_prefill": self.chunked_prefill,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_prefill_tokens": self.max_prefill_tokens,
                "prefix_caching": self.prefix_caching,
                "decode_in_budget": self.decode_in_budget,
                "kv_admission": self.kv_admission,
                "cuda_graph_padding": self.cuda_graph_padding,
                "iteration_overhead_s": self.iteration_overhead_s,
                "overlap_scheduler": self.overlap_scheduler,
                "batch_wait_iters": self.batch_wait_iters,
                "batch_wait_tokens": self.batch_wait_tokens,
                "adp_balance_timeout_iters": self.adp_balance_timeout_iters,
                "tp_allreduce": self.backend,
                "engine": self.backend if self.http_frontend else "",
                "frontend": self.frontend}


#: SGLang versions whose aiconfigurator launch template never passes ``--enable-mixed-chunk``
#: although the agg rule asks for it: ``cli_args.0.5.1.post1.j2`` tests the key
#: ``enable-mix-chunk`` while the parameter mapping emits ``enable-mixed-chunk``.
SGLANG_UNMIXED_VERSIONS = ("0.5.1", "0.5.1.post1")
#: First vLLM release that schedules asynchronously unless a launch turns it off
#: (``SchedulerConfig.async_scheduling = None`` resolved to on by ``VllmConfig``): the last item
#: of the async-scheduling plan (vllm-project/vllm#27679: #27614); vllm#31998 of 2026-01-08
#: already extends the default to speculative decoding. Earlier releases (the aiconfigurator
#: 0.12 rows) schedule synchronously unless ``--async-scheduling`` is passed.
VLLM_ASYNC_DEFAULT_VERSION = (0, 14)


def release(version: str) -> tuple[int, ...]:
    """``"0.16.0"`` -> ``(0, 16, 0)``: the leading numeric fields of a release string (``()``
    when it has none, e.g. an empty or a named build)."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


#: ``kv_cache_config.free_gpu_memory_fraction | default(0.80)`` in aiconfigurator's TensorRT-LLM
#: ``extra_engine_args.<version>.yaml.j2`` templates (its generator passes no value of its own).
AIC_TRTLLM_FREE_MEMORY_FRACTION = 0.8
#: aiconfigurator's generated launches (``generator/config/backend_templates/<engine>/run.sh.j2``,
#: ai-dynamo/aiconfigurator) start ``python3 -m dynamo.frontend`` and one ``python3 -m
#: dynamo.<engine>`` worker per replica: Dynamo, not the engine's own server, streams the tokens.
AIC_FRONTEND = "dynamo"


def engine_profile(backend: str, *, isl: int, max_batch_size: int, version: str = "",
                   launcher: str = "aiconfigurator", osl: int = 0, tp: int = 1,
                   model: str = "", max_num_tokens: int = 0, gpu: str = "",
                   attention_dp: int = 1, linear_attention: bool = False,
                   precision: str = "") -> EngineProfile:
    """Scheduler facts of ``backend`` (``version`` where it matters) serving prompts of ``isl``
    tokens with at most ``max_batch_size`` running requests, launched by aiconfigurator's
    generator (``launcher="aiconfigurator"``), by InferenceX's per-model recipe for ``model``
    (an HF id; ``osl``, ``tp``, ``gpu``, a GPU spec name, and ``attention_dp``, the attention-DP
    ranks of the launch, select the recipe's branches) or
    with the engine's own
    defaults (``"engine_defaults"``: measurements whose launch flags are not known), or by
    ``trtllm-bench throughput`` (``"trtllm_bench"``, TensorRT-LLM only: ``max_batch_size`` and
    ``max_num_tokens`` are the limits it picked, ``serving.trtllm_bench.bench_limits``).
    ``linear_attention``: the model has linear-attention (Gated DeltaNet) layers, whose state
    cache changes SGLang's scheduler (``SGLANG_HYBRID_NO_OVERLAP``). ``precision``: the
    checkpoint's (``fp8``, ``fp4``...), where a launcher keeps one recipe per precision.

    Raises:
        ConfigError: unknown backend or launcher, or a launcher the backend has no profile for.
    """
    profile = _engine_profile(backend, isl=isl, max_batch_size=max_batch_size, version=version,
                              launcher=launcher, osl=osl, tp=tp, model=model,
                              max_num_tokens=max_num_tokens, gpu=gpu, attention_dp=attention_dp,
                              linear_attention=linear_attention, precision=precision)
    if launcher != "aiconfigurator":
        return profile
    return dataclasses.replace(profile, frontend=AIC_FRONTEND, sources=(
        *profile.sources, "served through NVIDIA Dynamo (aiconfigurator backend_templates/"
        f"{backend}/run.sh.j2: dynamo.frontend and a dynamo.{backend} worker per replica, "
        "which streams its replica's tokens)"))


def _engine_profile(backend: str, *, isl: int, max_batch_size: int, version: str,
                    launcher: str, osl: int, tp: int, model: str, max_num_tokens: int,
                    gpu: str, attention_dp: int, linear_attention: bool,
                    precision: str = "") -> EngineProfile:
    if launcher not in LAUNCHERS:
        raise ConfigError(f"`launcher` must be one of {list(LAUNCHERS)}, but got {launcher!r}")
    if launcher == "trtllm_bench":
        if backend != "trtllm":
            raise ConfigError(f"launcher 'trtllm_bench' needs backend 'trtllm', but got "
                              f"{backend!r}")
        return _trtllm_bench(max_batch_size=max_batch_size, max_num_tokens=max_num_tokens)
    aic = launcher == "aiconfigurator"
    # aiconfigurator's benchmark rules (rule_plugin/benchmark/{vllm,sglang,trtllm}.rule
    # ``cuda_graph_batch_sizes = range(1, max_batch_size + 1)``) capture every decode batch size.
    graphs = tuple(range(1, max_batch_size + 1)) if aic and max_batch_size > 0 else ()
    graphs_src = (("CUDA graphs captured for every batch size 1..max_batch_size "
                   "(aiconfigurator benchmark rules cuda_graph_batch_sizes)",) if graphs else ())
    if backend == "vllm" and launcher == "inferencex":
        ix = _inferencex_vllm(model, gpu, max_num_seqs=max_batch_size)
        if ix is not None:
            return ix
    if backend == "vllm":
        asynchronous = release(version) >= VLLM_ASYNC_DEFAULT_VERSION
        # aiconfigurator lists its captured sizes (the largest is max_batch_size); other
        # launches keep vLLM's default largest size.
        minimax = launcher == "inferencex" and "minimax" in model.lower()
        triton = minimax and gpu in INFERENCEX_VLLM_MINIMAX_TRITON_GPUS
        # The MiniMax H100 recipe keeps vLLM's KV-cache dtype and capture sizes (see
        # INFERENCEX_VLLM_MINIMAX_AUTO_KV_GPUS); the others pass both.
        minimax_h100 = minimax and gpu in INFERENCEX_VLLM_MINIMAX_AUTO_KV_GPUS
        piecewise = (graphs[-1] if graphs else
                     vllm_piecewise_tokens(INFERENCEX_VLLM_MINIMAX_H100_MAX_NUM_SEQS)
                     if minimax_h100 else INFERENCEX_VLLM_MINIMAX_CAPTURE if minimax
                     else vllm_piecewise_tokens(max_batch_size if launcher == "inferencex"
                                                else 0))
        return EngineProfile(
            backend=backend, prefill_schedule="mixed", chunked_prefill=True,
            max_num_batched_tokens=VLLM_API_SERVER_BATCHED_TOKENS, max_prefill_tokens=0,
            prefix_caching=not aic, cuda_graph_sizes=graphs, overlap_scheduler=asynchronous,
            piecewise_graph_tokens=piecewise, moe_kernel="triton" if triton else "",
            kv_dtype="auto" if minimax_h100 else "",
            sources=(*graphs_src,
                *((INFERENCEX_VLLM_MINIMAX_TRITON_SOURCE,) if triton else ()),
                ("no --kv-cache-dtype, --max-num-seqs 256, cudagraph_mode PIECEWISE (InferenceX "
                 "minimaxm2.5_fp8_h100.sh, every version read): vLLM's auto KV-cache dtype "
                 f"and piecewise CUDA graphs up to min(2 x 256, 512) = {piecewise} tokens"
                 if minimax_h100 else
                 "--max-cudagraph-capture-size 2048 (InferenceX minimaxm2.5_*_b300.sh): "
                 "batches up to 2048 tokens replay piecewise CUDA graphs" if minimax else
                 f"vLLM piecewise CUDA graphs up to {piecewise} tokens (default cudagraph "
                 "mode; largest captured size min(2 x max_num_seqs, 512) unless the launch "
                 "lists its sizes): bigger batches launch every kernel from the host"),
                "vLLM v1: decodes first, then chunked prefills in one token budget "
                "(v1/core/sched/scheduler.py)",
                f"vLLM v1 API-server budget {VLLM_API_SERVER_BATCHED_TOKENS} tokens on >= 70 GiB "
                "GPUs (EngineArgs defaults). aiconfigurator 0.12's benchmark vllm.rule would "
                "pass max_batch_size + isl + 1500; the gap-analysis vLLM 0.12 rows are "
                "described by the default (Qwen3-32B TTFT median error -26 % vs -55 %), so "
                "their launches predate that rule",
                ("prefix caching off (aiconfigurator vllm.rule and sglang.rule turn "
                 "disable_prefix_cache off only when the model config asks for a shared prefix, "
                 "and its TensorRT-LLM template sets enable_block_reuse false; with aiperf's "
                 "100-prompt pool the Qwen3-32B and Qwen3-235B rows' TPOT and TTFT are those of "
                 "a full prefill per request, while the 11 Llama-3.1-8B-FP8 rows' TPOT needs "
                 "the reuse a cache gives)" if aic else
                 "vLLM v1 prefix caching on by default (enable_prefix_caching=True)"),
                (f"vLLM {version} schedules asynchronously by default (since "
                 f"{'.'.join(map(str, VLLM_ASYNC_DEFAULT_VERSION))}, vllm-project/vllm#27614): "
                 "step n + 1 is scheduled while step n runs, so no host time is added per "
                 "iteration") if asynchronous else
                (f"vLLM {version or '(version not stated)'} schedules synchronously (async "
                 "scheduling opt-in before 0.14): the cluster's per-iteration host time "
                 "applies"),
                *((INFERENCEX_VLLM_MINIMAX_PARTIAL if minimax else
                   "no InferenceX vLLM recipe of this model is modelled: the engine's defaults "
                   "above stand in for its launch flags",) if launcher == "inferencex" else ()),
            ))
    if backend == "sglang" and launcher == "inferencex" and "deepseek" in model.lower():
        return _inferencex_sglang_dsr1(
            isl=isl, osl=osl, max_batch_size=max_batch_size, gpu=gpu, precision=precision,
            tp=tp, recv=inferencex_dsr1_recv_interval(gpu, max_batch_size))
    if backend == "sglang" and launcher == "inferencex" and "glm-5" in model.lower():
        return _inferencex_sglang_glm5(gpu)
    if backend == "sglang" and launcher == "inferencex" and "qwen3.5" in model.lower():
        q35 = _inferencex_sglang_qwen35(gpu=gpu, precision=precision, tp=tp)
        if q35 is not None:
            return q35
    if backend == "sglang":
        overlap = not linear_attention
        mixed = aic and version not in SGLANG_UNMIXED_VERSIONS
        why = ("the aiconfigurator agg rule asks for it" if mixed else
               "the 0.5.1.post1 template misspells the flag" if aic else "SGLang default")
        chunk = sglang_default_chunked_prefill(gpu)
        if not aic:
            from charon_search.hardware import load_gpu

            max_bs = sglang_default_cuda_graph_max_bs(load_gpu(gpu) if gpu else None, tp=tp)
            graphs = sglang_cuda_graph_sizes(max_bs)
            graphs_src = (f"CUDA graphs up to cuda_graph_max_bs {max_bs} (ServerArgs default "
                          f"for the GPU at TP {tp}, the value sglang_default_mem_fraction "
                          "reserves memory for): sizes 1, 2, 4, 8, 12, 16..256 step 8, "
                          "272..496 step 16, 512.. step 32 (ServerArgs."
                          "_generate_cuda_graph_batch_sizes)",)
        return EngineProfile(
            backend=backend, prefill_schedule="mixed" if mixed else "prefill_first",
            chunked_prefill=True, max_num_batched_tokens=chunk,
            max_prefill_tokens=(isl + AIC_PREFILL_HEADROOM_TOKENS if aic
                                else SGLANG_DEFAULT_MAX_PREFILL_TOKENS),
            prefix_caching=not aic, decode_in_budget=False, overlap_scheduler=overlap,
            cuda_graph_sizes=graphs, kv_admission="ignore_eos" if aic else "ratio",
            sources=(*graphs_src,
                SGLANG_IGNORE_EOS_SOURCE if aic else
                "SGLang PrefillAdder admission: a request starts only if its prompt plus "
                "min(max_new_tokens, 4096) fits beside new_token_ratio (0.7, decaying per "
                "decode step, raised after a retraction) x the running requests' remaining "
                "output (managers/schedule_policy.py; kv_admission 'ratio')",
                *(() if aic else ("SGLang radix (prefix) cache on by default "
                                  "(ServerArgs.disable_radix_cache=False)",)),
                "SGLang overlap scheduler on by default (disable_overlap_schedule=False): "
                "host work hidden behind the GPU" if overlap else SGLANG_HYBRID_NO_OVERLAP,
                "SGLang: a new prefill batch runs before decoding; with --enable-mixed-chunk "
                "the running decodes ride along, else they wait (managers/scheduler.py); "
                f"mixed chunk {'on' if mixed else 'off'} ({why})",
                "SGLang: decode tokens do not count against the chunked-prefill size",
                f"SGLang chunked_prefill_size {chunk} ({SGLANG_CHUNK_DEFAULT_RULE})",
                "max_prefill_tokens = isl + 1500 (aiconfigurator sglang.rule)" if aic else
                f"max_prefill_tokens {SGLANG_DEFAULT_MAX_PREFILL_TOKENS} (ServerArgs default)",
                *(("no prefix reuse: the silicon rows' TTFT equals half of a whole "
                   "synchronized wave's prefill (TTFT ~ concurrency x isl / tp), which a "
                   "radix-cache hit would remove",) if aic else ()),
            ))
    if backend == "trtllm" and launcher == "inferencex":
        trt = _inferencex_trtllm(isl=isl, osl=osl, tp=tp, model=model, gpu=gpu,
                                 max_batch_size=max_batch_size, attention_dp=attention_dp)
        if trt is not None:
            return trt
    if backend == "trtllm":
        if not aic:
            graphs = TRTLLM_DEFAULT_CUDA_GRAPH_SIZES
            graphs_src = ("CUDA graphs of generation batches of 1..31, 32, 64, 128 requests, "
                          "no padding: a batch of another size runs eagerly (CudaGraphConfig "
                          "defaults: enable_padding False, max_batch_size 128; "
                          "_generate_cuda_graph_batch_sizes)",)
        return EngineProfile(
            backend=backend, prefill_schedule="mixed", chunked_prefill=False,
            max_num_batched_tokens=max_batch_size + isl + AIC_PREFILL_HEADROOM_TOKENS,
            max_prefill_tokens=0, prefix_caching=False, kv_admission="reserve_max",
            overlap_scheduler=True, cuda_graph_sizes=graphs, cuda_graph_padding=aic,
            gpu_memory_utilization=AIC_TRTLLM_FREE_MEMORY_FRACTION if aic else 0.0,
            sources=(*graphs_src,
                *((f"kv_cache_config.free_gpu_memory_fraction {AIC_TRTLLM_FREE_MEMORY_FRACTION} "
                   "of the memory left free (aiconfigurator extra_engine_args template "
                   "default)",) if aic else ()),
                "TensorRT-LLM overlap scheduler on (aiconfigurator trtllm.rule agg "
                "disable_overlap_scheduler = false; LlmArgs default): host work hidden",
                "TensorRT-LLM in-flight batching: context and generation requests in one "
                "iteration under max_num_tokens",
                "TensorRT-LLM capacity scheduler GUARANTEED_NO_EVICT (default): admit only "
                "when prompt + output KV fits",
                "max_num_tokens = max_batch_size + isl + 1500 (aiconfigurator trtllm.rule; "
                "other launches: at least a full decode batch plus one prompt, since without "
                "chunking a prompt waits until it fits beside the decodes)",
                "enable_chunked_prefill false, enable_block_reuse false (aiconfigurator "
                "extra_engine_args template defaults)",
            ))
    raise ConfigError(f"`backend` must be one of {list(BACKENDS)}, but got {backend!r}")


#: vLLM's largest captured CUDA-graph size when a launch sets none: ``max_num_seqs`` x 2, at most
#: 512 (``CompilationConfig`` / ``VllmConfig._set_cudagraph_sizes``: ``max_cudagraph_capture_size``
#: default ``min(max_num_seqs * 2, 512)``). The default cudagraph mode (``PIECEWISE``, and
#: ``FULL_AND_PIECEWISE`` from 0.11) replays piecewise graphs for every batch up to it, mixed
#: prompt batches included: only attention runs eagerly between the pieces.
VLLM_MAX_CAPTURE_DEFAULT = 512
#: ``--max-cudagraph-capture-size 2048`` in InferenceX's vLLM gpt-oss recipes
#: (``gptoss_fp4_b200.sh``, ``gptoss_fp4_h200.sh``, ``gptoss_fp4_h100.sh``).
INFERENCEX_VLLM_GPTOSS_CAPTURE = 2048
#: ``--max-cudagraph-capture-size 2048`` in InferenceX's vLLM MiniMax-M2.5 recipes
#: (``minimaxm2.5_fp8_b300.sh``, ``minimaxm2.5_fp4_b300.sh``, which say they reuse the B200
#: recipes as-is; one stored version of ``minimaxm2.5_fp8_b200.sh`` passes no capture size).
INFERENCEX_VLLM_MINIMAX_CAPTURE = 2048
#: GPUs whose InferenceX vLLM MiniMax-M2.5 FP8 recipe runs the routed experts on vLLM's Triton
#: fused MoE: ``minimaxm2.5_fp8_b200.sh`` exports ``VLLM_USE_FLASHINFER_MOE_FP8=0`` and
#: ``VLLM_MOE_USE_DEEP_GEMM=0``, ``minimaxm2.5_fp8_h200.sh`` passes ``--moe-backend triton``.
#: On B200 vLLM's default block-fp8 MoE rows are FlashInfer's TRT-LLM kernel, 1.3x faster at
#: 16 tokens and 1.8x at 4096 for MiniMax's experts (aiconfigurator B200 vLLM 0.22.0 vs 0.24.0
#: tables); on H200 the default rows already are the Triton kernel's. The stored B300 recipe
#: sets neither (vLLM's default), nor does the H100 one.
INFERENCEX_VLLM_MINIMAX_TRITON_GPUS = ("b200-sxm-180gb", "h200-sxm-141gb")
#: GPUs whose InferenceX vLLM MiniMax-M2.5 recipe passes no ``--kv-cache-dtype``, so vLLM's
#: ``auto`` applies (``serving._graphs.AUTO_KV_SOURCE``: bf16 for the block-fp8
#: ``MiniMaxAI/MiniMax-M2.5``, which declares no KV-cache quantization). Every stored version of
#: ``minimaxm2.5_fp8_h100.sh`` read (SemiAnalysisAI at 34bc7c4, two forks) passes none, with
#: ``--max-num-seqs 256`` and ``--compilation-config '{"cudagraph_mode":"PIECEWISE"}'`` (so
#: vLLM's default capture sizes, up to min(2 x 256, 512) tokens). The H200 recipe
#: (``minimaxm2.5_fp8_h200.sh`` at 0949de5) and the B200 one the B300 recipe "reuses as-is"
#: (``minimaxm2.5_fp8_b300.sh`` at 5632483) pass ``--kv-cache-dtype fp8``.
INFERENCEX_VLLM_MINIMAX_AUTO_KV_GPUS = ("h100-sxm-80gb",)
INFERENCEX_VLLM_MINIMAX_H100_MAX_NUM_SEQS = 256
INFERENCEX_VLLM_MINIMAX_TRITON_SOURCE = (
    "routed experts on vLLM's Triton fused MoE (InferenceX minimaxm2.5_fp8_b200.sh: "
    "VLLM_USE_FLASHINFER_MOE_FP8=0 VLLM_MOE_USE_DEEP_GEMM=0; minimaxm2.5_fp8_h200.sh: "
    "--moe-backend triton)")
#: What the MiniMax-M2.5 rows take from InferenceX's vLLM recipes: the facts the lines before
#: it name (the capture size; on H100 the KV-cache dtype and the capture size of its recipe; on
#: the Triton GPUs the MoE kernel). The stored versions differ in the rest and no row says which
#: it ran: e.g. ``minimaxm2.5_fp8_b200.sh`` at 07e171a passes memory fraction 0.95 and no
#: KV-cache dtype or capture size, ``minimaxm2.5_fp8_b300.sh`` at 5632483 ("the existing
#: MiniMax-M2.5 FP8 B200 vLLM recipe as-is") 0.90, ``--max-num-batched-tokens`` 2 x ISL and
#: ``--stream-interval 20``, ``minimaxm2.5_fp8_h200.sh`` at 0949de5 0.95, 16384-32768 batched
#: tokens and no capture size.
INFERENCEX_VLLM_MINIMAX_PARTIAL = (
    "InferenceX MiniMax-M2.5 vLLM recipes: only the facts named above are taken from them; "
    "their stored versions differ in the rest (memory fraction, batched-token budget, stream "
    "interval, capture size) and the row does not say which one ran, so the engine's defaults "
    "stand in for those")
#: GPUs whose InferenceX vLLM Llama-3-70B recipe compiles with ``"cudagraph_mode":
#: "FULL_DECODE_ONLY"`` and ``"splitting_ops": []`` (``70b_fp8_b200_docker.sh``,
#: ``70b_fp4_b200_docker.sh``): batches with prompt tokens replay no graph at all, so their
#: every kernel is launched from the host. The H100 and H200 recipes (``70b_fp8_h100_slurm.sh``,
#: ``70b_fp8_h200_slurm.sh``) keep vLLM's default piecewise graphs up to 2 x ``--max-num-seqs``.
INFERENCEX_VLLM_FULL_DECODE_ONLY_GPUS = ("b200-sxm-180gb",)


def vllm_piecewise_tokens(max_num_seqs: int) -> int:
    """vLLM's default largest piecewise-graph size for ``max_num_seqs`` (0: unknown -> 512)."""
    if max_num_seqs <= 0:
        return VLLM_MAX_CAPTURE_DEFAULT
    return min(2 * max_num_seqs, VLLM_MAX_CAPTURE_DEFAULT)


#: GPUs whose InferenceX vLLM gpt-oss recipes (``gptoss_fp4_h100.sh``, ``gptoss_fp4_h200.sh``)
#: export ``VLLM_MXFP4_USE_MARLIN=1``.
INFERENCEX_MARLIN_GPUS = ("h100-sxm-80gb", "h200-sxm-141gb")
#: GPUs whose InferenceX vLLM gpt-oss recipe (``gptoss_fp4_b200.sh``) exports
#: ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``: FlashInfer's TRT-LLM-Gen MoE with MXFP8
#: activations (W4A8) instead of vLLM's default bf16 activations.
INFERENCEX_VLLM_MXFP8_GPUS = ("b200-sxm-180gb",)
#: GPUs whose InferenceX vLLM gpt-oss recipe sets ``kv-cache-dtype: fp8`` (``gptoss_fp4_b200.sh``).
INFERENCEX_VLLM_FP8_KV_GPUS = ("b200-sxm-180gb",)


def _fp4_tensor_cores(gpu: str) -> bool:
    """Whether GPU spec ``gpu`` has FP4 tensor cores (Blackwell: block-scaled MXFP4/MXFP8 MMA)."""
    from charon_search.hardware import load_gpu

    try:
        return "fp4" in load_gpu(gpu).peak_flops_per_s
    except ConfigError:
        return False


def _inferencex_vllm(model: str, gpu: str = "", *,
                     max_num_seqs: int = 0) -> EngineProfile | None:
    """vLLM as InferenceX's Llama-3-70B and gpt-oss recipes launch it on ``gpu`` with
    ``--max-num-seqs max_num_seqs`` (the concurrency; None: other models)."""
    name = model.lower()
    if not (("llama" in name and "70b" in name) or "gpt-oss" in name):
        return None
    gptoss = "gpt-oss" in name
    decode_only = not gptoss and gpu in INFERENCEX_VLLM_FULL_DECODE_ONLY_GPUS
    piecewise = (INFERENCEX_VLLM_GPTOSS_CAPTURE if gptoss else 0 if decode_only
                 else vllm_piecewise_tokens(max_num_seqs))
    graphs_src = (
        "max-cudagraph-capture-size: 2048 (InferenceX gptoss_fp4_*.sh config.yaml): prompt "
        "batches up to 2048 tokens replay piecewise CUDA graphs" if gptoss else
        "compilation-config cudagraph_mode FULL_DECODE_ONLY, splitting_ops [] (InferenceX "
        "70b_fp8_b200_docker.sh): batches with prompt tokens replay no graph, the host "
        "launches all their kernels" if decode_only else
        f"no compilation config (InferenceX 70b_fp8_h100_slurm.sh / 70b_fp8_h200_slurm.sh): "
        f"vLLM's piecewise CUDA graphs up to min(2 x max-num-seqs, 512) = {piecewise} tokens")
    marlin = gptoss and gpu in INFERENCEX_MARLIN_GPUS
    mxfp8 = gptoss and gpu in INFERENCEX_VLLM_MXFP8_GPUS
    script = ("benchmarks/gptoss_fp4_h200.sh, gptoss_fp4_h100.sh, gptoss_fp4_b200.sh" if gptoss
              else "benchmarks/70b_fp8_h200_slurm.sh")
    # The B200 recipe's config.yaml sets kv-cache-dtype fp8; the H100 and H200 ones set none,
    # so vLLM's "auto" keeps the checkpoint's bf16 attention dtype (gpt-oss quantizes only
    # its experts, MXFP4, and declares no KV-cache scheme).
    kv = ("fp8" if gpu in INFERENCEX_VLLM_FP8_KV_GPUS else "bf16") if gptoss else ""
    return EngineProfile(
        backend="vllm", prefill_schedule="mixed", chunked_prefill=True,
        max_num_batched_tokens=VLLM_API_SERVER_BATCHED_TOKENS, max_prefill_tokens=0,
        prefix_caching=False, overlap_scheduler=True, piecewise_graph_tokens=piecewise,
        moe_kernel="marlin" if marlin else "mxfp8" if mxfp8 else "", kv_dtype=kv,
        sources=(
            graphs_src,
            *({"fp8": ("KV cache fp8: kv-cache-dtype: fp8 (InferenceX gptoss_fp4_b200.sh "
                       "config.yaml)",),
               "bf16": ("KV cache bf16: no kv-cache-dtype in InferenceX gptoss_fp4_h100.sh / "
                        "gptoss_fp4_h200.sh, so vLLM's auto = the checkpoint's bf16",),
               }.get(kv, ())),
            *(("export VLLM_MXFP4_USE_MARLIN=1 (InferenceX gptoss_fp4_h100.sh and "
               "gptoss_fp4_h200.sh, every stored version): the MXFP4 experts run the Marlin "
               "MoE kernel, not vLLM's default OpenAI Triton kernel",) if marlin else ()),
            *(("export VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 (InferenceX gptoss_fp4_b200.sh): "
               "the MXFP4 experts run FlashInfer's TRT-LLM-Gen MoE with MXFP8 activations "
               "(vLLM's w4a8_mxfp4_mxfp8 rows)",) if mxfp8 else ()),
            "vLLM v1: decodes first, then chunked prefills in one token budget "
            "(v1/core/sched/scheduler.py)",
            f"InferenceX {script} config.yaml: max-num-batched-tokens 8192, "
            "no-enable-prefix-caching, --max-num-seqs = concurrency",
            "async-scheduling: true (same recipe): the engine schedules step n + 1 while the "
            "GPU runs step n, so no host time is added per iteration",
        ))


def _inferencex_sglang_dsr1(*, isl: int, osl: int, max_batch_size: int, gpu: str = "",
                            precision: str = "", tp: int = 8, recv: int = 0) -> EngineProfile:
    """SGLang as InferenceX's DeepSeek-R1 recipes launch it: the FP4 Blackwell recipe for an
    FP4 row on ``gpu`` b200/b300, the B200 FP8 recipe's TP 4 branch for an FP8 B200 row at
    ``tp`` 4 (``INFERENCEX_DSR1_SGLANG_FP8_B200_TP4``, whose recv interval replaces ``recv``),
    else the FP8 H200 recipe (``recv``: the ``--scheduler-recv-interval`` the Blackwell recipes
    add; 0: not passed)."""
    tokens, cap = (INFERENCEX_DSR1_SGLANG_PREFILL_TOKENS,
                   INFERENCEX_DSR1_SGLANG_MAX_RUNNING[isl == 1024 and osl == 1024])
    recipe = "benchmarks/dsr1_fp8_h200.sh: 512 for 1k/1k, else 256"
    fp4_blackwell = precision == "fp4" and gpu.startswith(INFERENCEX_DSR1_SGLANG_RECV_GPUS)
    fp8_b200_tp4 = precision == "fp8" and gpu.startswith("b200") and tp == 4
    # The Blackwell recipes (dsr1_fp4_b200.sh, dsr1_fp8_b200.sh; GB200 / GB300 alike) pass
    # --kv-cache-dtype fp8_e4m3; the H200 one passes none.
    fp8_kv = _fp4_tensor_cores(gpu)
    mem = INFERENCEX_DSR1_SGLANG_MEM_FRACTION[fp4_blackwell]
    if fp4_blackwell:
        tokens, cap = INFERENCEX_DSR1_SGLANG_FP4_BLACKWELL
        recipe = "benchmarks/dsr1_fp4_b200.sh, reused on B300"
    elif fp8_b200_tp4:
        tokens, cap, mem, recv = INFERENCEX_DSR1_SGLANG_FP8_B200_TP4
        recipe = "benchmarks/dsr1_fp8_b200.sh, its TP 4 branch (8k/1k only)"
    fusion = fp4_blackwell or fp8_b200_tp4
    return EngineProfile(
        backend="sglang", prefill_schedule="prefill_first", chunked_prefill=True,
        max_num_batched_tokens=tokens, max_prefill_tokens=tokens, prefix_caching=False,
        decode_in_budget=False, overlap_scheduler=True,
        max_num_seqs=min(max_batch_size, cap),
        cuda_graph_sizes=sglang_cuda_graph_sizes(cap),
        stream_interval=INFERENCEX_DSR1_SGLANG_STREAM_INTERVAL, scheduler_recv_interval=recv,
        allreduce_norm_fusion=fusion, gpu_memory_utilization=mem,
        kv_admission="ignore_eos", kv_dtype="fp8" if fp8_kv else "auto",
        sources=(
            f"--mem-fraction-static {mem} ({recipe.split(':')[0]})", SGLANG_IGNORE_EOS_SOURCE,
            ("--kv-cache-dtype fp8_e4m3 (InferenceX dsr1_fp4_b200.sh, dsr1_fp8_b200.sh)"
             if fp8_kv else "no --kv-cache-dtype (InferenceX dsr1_fp8_h200.sh, every version "
             "read): SGLang's auto KV-cache dtype"),
            *((f"--enable-flashinfer-allreduce-fusion ({recipe.split(',')[0]}): the RMSNorm "
               "after each TP all-reduce runs in the all-reduce kernel",) if fusion else ()),
            *((f"--scheduler-recv-interval {recv} (InferenceX dsr1_fp4_b200.sh, "
               "dsr1_fp4_b300.sh, dsr1_fp8_b200.sh): new requests "
               f"are received every {recv} decode batches, at once after a prefill batch or "
               "when idle (SchedulerRecvSkipper)",) if recv else ()),
            f"--stream-interval {INFERENCEX_DSR1_SGLANG_STREAM_INTERVAL} ("
            + ("the DeepSeek rows' 10 for the recipe's 30: its TP 8 FP8 1k/1k run of the same "
               "day fits 10, not 30; INFERENCEX_DSR1_SGLANG_FP8_B200_TP4" if fp8_b200_tp4
               else "same recipe") + "): the client's first chunk taken to carry the "
            f"{INFERENCEX_DSR1_SGLANG_STREAM_INTERVAL}th token (an empirical rule: SGLang's "
            "stream_output_generation sends the first token at once; ServingConfig."
            "stream_interval)",
            "SGLang overlap scheduler on by default (disable_overlap_schedule=False): "
            "host work hidden behind the GPU",
            "SGLang: a new prefill batch runs before decoding (no --enable-mixed-chunk in the "
            "recipe; managers/scheduler.py); decode tokens outside the chunked-prefill size",
            f"--chunked-prefill-size {tokens} --max-prefill-tokens {tokens} "
            f"--disable-radix-cache, --max-running-requests / --cuda-graph-max-bs {cap} "
            f"(InferenceX {recipe})",
        ))


#: Where a launch turns SGLang's radix cache off and its clients ignore EOS (the InferenceX and
#: aiconfigurator benchmark clients do), ``PrefillAdder.add_one_req`` takes
#: ``add_one_req_ignore_eos`` (``kv_admission="ignore_eos"``).
SGLANG_IGNORE_EOS_SOURCE = (
    "SGLang admission of requests that ignore EOS with the radix cache off (PrefillAdder."
    "add_one_req_ignore_eos, managers/schedule_policy.py): a request starts only if, with every "
    "request's remaining output known, the KV cache never runs out as they finish "
    "(kv_admission 'ignore_eos')")


def _sglang_recipe(recipe: str, *, tokens: int, mem: float, stream: int = 0,
                   overlap: bool = True, allreduce_fusion: bool = False,
                   notes: tuple[str, ...] = (), gpu: str = "") -> EngineProfile:
    """SGLang as an InferenceX recipe (``benchmarks/single_node/<recipe>``) launches it:
    ``--chunked-prefill-size`` = ``--max-prefill-tokens`` = ``tokens`` (0: not passed, the
    defaults on ``gpu`` apply), ``--mem-fraction-static mem``, ``--stream-interval stream`` (0:
    not passed), ``--enable-flashinfer-allreduce-fusion`` where ``allreduce_fusion``, no
    radix-cache reuse (random prompts), no ``--enable-mixed-chunk``."""
    flags = ((f"--chunked-prefill-size {tokens} --max-prefill-tokens {tokens} " if tokens
              else "") + f"--mem-fraction-static {mem}"
             + (f" --stream-interval {stream}" if stream else "")
             + (" --enable-flashinfer-allreduce-fusion" if allreduce_fusion else ""))
    chunk, most = ((tokens, tokens) if tokens else
                   (sglang_default_chunked_prefill(gpu), SGLANG_DEFAULT_MAX_PREFILL_TOKENS))
    return EngineProfile(
        backend="sglang", prefill_schedule="prefill_first", chunked_prefill=True,
        max_num_batched_tokens=chunk, max_prefill_tokens=most, prefix_caching=False,
        decode_in_budget=False, overlap_scheduler=overlap, stream_interval=stream,
        gpu_memory_utilization=mem, allreduce_norm_fusion=allreduce_fusion,
        kv_admission="ignore_eos",
        sources=(
            f"{flags} (InferenceX benchmarks/single_node/{recipe})", SGLANG_IGNORE_EOS_SOURCE,
            *(("all-reduce fusion: the RMSNorm after each TP all-reduce runs in the all-reduce "
               "kernel",) if allreduce_fusion else ()),
            *((f"chunked_prefill_size {chunk} ({SGLANG_CHUNK_DEFAULT_RULE}), "
               f"max_prefill_tokens {most} (ServerArgs default)",) if not tokens else ()),
            *((f"--stream-interval {stream}: the client's first chunk taken to carry the "
               f"{stream}th token (empirical, ServingConfig.stream_interval)",)
              if stream else ()),
            "host work hidden behind the GPU (SGLang overlap scheduler, on by default)"
            if overlap else SGLANG_HYBRID_NO_OVERLAP,
            "SGLang: a new prefill batch runs before decoding (no --enable-mixed-chunk); "
            "decode tokens outside the chunked-prefill size",
            "no prefix reuse: random prompts",
            *notes,
        ))


#: InferenceX's SGLang DeepSeek-R1 Blackwell recipes (``dsr1_fp4_b200.sh``; ``dsr1_fp8_b200.sh``
#: at TP 8; ``dsr1_fp4_b300.sh``, which "reuses the existing DSR1 FP4 B200 SGLang recipe
#: as-is"): ``--scheduler-recv-interval`` 10, or 30 "if CONC >= 16" (the scripts' comment: "recv
#: every ~10 requests; if CONC >= 16, relax to ~30"). The recv interval explains what the
#: stream interval alone left: on the 2026-03-25 B200 rows measured TTFT exceeds the simulated
#: prefill plus 9 decode steps (``--stream-interval 10``) by ~4 decode steps below concurrency 16
#: and ~13 from 16 on, the mean wait for a poll every 10 or 30 decode batches (4.5 and 14.5).
#: The FP8 recipe's stored version streams every 30 tokens, but its rows are the FP4 recipe's
#: and the H200 recipe's 10 (the same measurements appear under DeepSeek-V3 and DeepSeek-R1
#: names; at 30 the FP8 rows below concurrency 16 come out +52 % instead of -12 %), so one
#: DeepSeek profile serves both names and precisions. On B300 the 21 DeepSeek rows move from
#: -72/-65 % (FP4 below/from concurrency 16) to -67/-35 % median TTFT error: something else,
#: not modelled, dominates there.
INFERENCEX_DSR1_SGLANG_RECV_INTERVALS = (10, 30)
INFERENCEX_DSR1_SGLANG_RECV_RELAX_CONC = 16
#: ``--mem-fraction-static`` of InferenceX's SGLang DeepSeek-R1 recipes: 0.82 in
#: ``dsr1_fp8_h200.sh`` (both branches), 0.85 in ``dsr1_fp4_b200.sh`` (indexed by "FP4 on
#: Blackwell").
INFERENCEX_DSR1_SGLANG_MEM_FRACTION = (0.82, 0.85)
#: GPUs whose InferenceX DeepSeek-R1 SGLang recipes pass ``--scheduler-recv-interval``.
INFERENCEX_DSR1_SGLANG_RECV_GPUS = ("b200", "b300")


def inferencex_dsr1_recv_interval(gpu: str, concurrency: int) -> int:
    """``--scheduler-recv-interval`` of InferenceX's SGLang DeepSeek-R1 recipe for ``gpu`` (a
    GPU spec name) at ``concurrency`` streams; 0 where the recipe passes none (H200)."""
    if not gpu.startswith(INFERENCEX_DSR1_SGLANG_RECV_GPUS):
        return 0
    low, high = INFERENCEX_DSR1_SGLANG_RECV_INTERVALS
    return high if concurrency >= INFERENCEX_DSR1_SGLANG_RECV_RELAX_CONC else low


#: InferenceX GLM-5 FP8 SGLang recipes (``benchmarks/single_node/glm5_fp8_{h200,b200,b300}.sh``):
#: ``--mem-fraction-static 0.85`` on every GPU. The stored Blackwell versions also raise the
#: chunked-prefill size to 32768 and stream every 30 tokens; neither fits the rows (the stream
#: interval puts TTFT +100-450 %, the larger chunks move B200 TTFT toward and B300 TTFT away from
#: the measurements), so those versions postdate the rows and only the memory fraction, common
#: to all, is taken (SGLang's default chunks otherwise: ``sglang_default_chunked_prefill``).
INFERENCEX_GLM5_SGLANG_MEM_FRACTION = 0.85


def _inferencex_sglang_glm5(gpu: str) -> EngineProfile:
    """SGLang as InferenceX's GLM-5 recipes launch it (see the constant above)."""
    return _sglang_recipe("glm5_fp8_*.sh", tokens=0, gpu=gpu,
                          mem=INFERENCEX_GLM5_SGLANG_MEM_FRACTION)


#: InferenceX Qwen3.5-397B-A17B SGLang recipe on B200 (``benchmarks/single_node/
#: qwen3.5_{fp8,bf16}_b200.sh``): ``--stream-interval 30``, ``--chunked-prefill-size`` and
#: ``--max-prefill-tokens`` 32768, ``--mem-fraction-static 0.82``, ``--disable-radix-cache``
#: (so the overlap scheduler stays on: on the 144 B200 Qwen3.5 rows TPOT p90 |error| 38.8 ->
#: 33.1 % on InferenceX's and 44.2 -> 27.5 % on the gap analysis', median bias +8 -> -9 %).
#: Its ``--max-running-requests 128`` is not taken: the concurrency-256 rows measure no queue
#: (``qwen3.5_fp4_b200.sh`` raises the cap to the concurrency). The B200 rows measure TTFT
#: 25-35 x TPOT above the simulated prefill (TP 8), as a first chunk carrying the 30th token
#: does. The stored H200 recipes stream every 50 tokens, but their rows measure 13-22 x TPOT:
#: those versions postdate the measurements, and no recipe is assumed there (B300: the recipe
#: without its stream interval, ``INFERENCEX_QWEN35_B300_RECIPES``).
#: The stored B200 recipes also pass ``--scheduler-recv-interval`` 10/30 (30 for FP4), which
#: the rows do not carry on top of the stream interval: with both, Qwen3.5 B200 TTFT moves from
#: a -0.4 % to a +21.6 % median bias (105 rows; bf16 +32 -> +51 % below concurrency 16), so it
#: is not applied here.
INFERENCEX_QWEN35_B200_STREAM_INTERVAL = 30
INFERENCEX_QWEN35_B200_PREFILL_TOKENS = 32768
INFERENCEX_QWEN35_B200_MEM_FRACTION = 0.82


#: InferenceX's Qwen3.5-397B-A17B SGLang recipes on B300 (``benchmarks/single_node/
#: qwen3.5_{bf16,fp4,fp8}_b300.sh``), per checkpoint precision: (``--chunked-prefill-size`` =
#: ``--max-prefill-tokens``, ``--mem-fraction-static``, the lowest TP at which the recipe passes
#: ``--enable-flashinfer-allreduce-fusion``, 0: never). Every stored version (bf16 in three
#: forks, fp4, fp8) passes ``--disable-radix-cache``, so SGLang keeps its overlap scheduler for
#: the hybrid model; the fp4 recipe "follows the SGLang cookbook recipe ... as of 2026-04-17",
#: the days (2026-04-17/18) the 36 SGLang 0.5.10.post1 B300 rows were measured. On the 49 B300
#: Qwen3.5 rows TPOT median (p90) |error| 19.8 (42.9) -> 12.0 (22.0) %, bias +21.5 -> +4.5 %
#: (chunks, memory fraction and the radix-cache flag alone).
#: Their ``--stream-interval`` 30 (fp8: 50) and ``--scheduler-recv-interval`` 10/30 are not
#: taken: the rows' TTFT sits 13-22 x TPOT above the simulated prefill, between the first-chunk
#: rule the B200 rows follow (+33 % median bias with it, +68 % with the recv interval too) and
#: none (-62 %), so neither is modelled here (``docs/calibration/README.md``, session 38).
#: The bf16 recipe (and the fp4 one at TP 8) also passes ``--enable-flashinfer-allreduce-fusion``
#: (taken: TPOT 12.0 (22.0) -> 11.3 (20.9) %).
INFERENCEX_QWEN35_B300_RECIPES = {"bf16": (32768, 0.82, 1), "fp4": (32768, 0.8, 8),
                                  "fp8": (16384, 0.8, 0)}


def _inferencex_sglang_qwen35(*, gpu: str, precision: str = "",
                              tp: int = 1) -> EngineProfile | None:
    """SGLang as InferenceX's Qwen3.5 recipes launch it on B200 and B300 (None on other GPUs:
    see the constants above). The recipes pass ``--disable-radix-cache``, so SGLang keeps its
    overlap scheduler for this hybrid linear-attention model: ``ServerArgs`` turns it off only
    for the Mamba ``no_buffer`` strategy *with* the radix cache on
    (``SGLANG_HYBRID_NO_OVERLAP``). On B300 a precision without its own recipe takes the
    bf16 one."""
    if gpu.startswith("b300"):
        prec = precision if precision in INFERENCEX_QWEN35_B300_RECIPES else "bf16"
        tokens, mem, fusion_tp = INFERENCEX_QWEN35_B300_RECIPES[prec]
        return _sglang_recipe(
            f"qwen3.5_{prec}_b300.sh", tokens=tokens, mem=mem,
            allreduce_fusion=0 < fusion_tp <= tp,
            notes=("--disable-radix-cache (every stored B300 version): SGLang's overlap "
                   "scheduler stays on for the hybrid model",
                   "--stream-interval and --scheduler-recv-interval are not modelled for these "
                   "rows (see INFERENCEX_QWEN35_B300_RECIPES)"))
    if not gpu.startswith("b200"):
        return None
    return _sglang_recipe(
        "qwen3.5_fp8_b200.sh", tokens=INFERENCEX_QWEN35_B200_PREFILL_TOKENS,
        mem=INFERENCEX_QWEN35_B200_MEM_FRACTION, stream=INFERENCEX_QWEN35_B200_STREAM_INTERVAL,
        notes=("--scheduler-recv-interval is not modelled for these rows (see "
               "INFERENCEX_QWEN35_B200_STREAM_INTERVAL)",))


def _inferencex_trtllm(*, isl: int, osl: int, tp: int, model: str, max_batch_size: int,
                       gpu: str = "",
                       attention_dp: int = 1) -> EngineProfile | None:
    """TensorRT-LLM as InferenceX's recipes launch it (None: no recipe known for ``model``)."""
    name = model.lower()
    common = (
        "TensorRT-LLM PyTorch backend: overlap scheduler on, chunked prefill off, capacity "
        "scheduler GUARANTEED_NO_EVICT (LlmArgs defaults the recipe keeps)",
        "kv_cache_config enable_block_reuse: false (InferenceX recipe)",
    )
    if "llama" in name and "70b" in name:
        max_tokens = INFERENCEX_70B_TRT_MAX_NUM_TOKENS
        wait = isl == 1024 and osl == 1024 and tp < 8
        return EngineProfile(
            backend="trtllm", prefill_schedule="mixed", chunked_prefill=False,
            max_num_batched_tokens=max_tokens, max_prefill_tokens=0, prefix_caching=False,
            kv_admission="reserve_max", overlap_scheduler=True,
            batch_wait_iters=INFERENCEX_70B_TRT_WAIT_ITERS if wait else 0,
            batch_wait_tokens=(int(INFERENCEX_70B_TRT_WAIT_RATIO * max_tokens) if wait
                               else 0),
            sources=(
                *common,
                f"--max_num_tokens {max_tokens} (InferenceX "
                "benchmarks/70b_fp8_h200_trt_slurm.sh at a267b4b)",
                ("batch waiting: prompts wait up to 20 iterations until prompt + decode tokens "
                 f"reach 0.9 x max_num_tokens = {int(0.9 * max_tokens)} (the recipe's 1k/1k, "
                 "TP < 8 branch; TensorRT-LLM PyExecutor._waiting_requests)") if wait else
                "no batch waiting (the recipe sets it only for 1k/1k at TP < 8)",
            ))
    if "deepseek" in name:
        # dsr1_fp8_h200_trt.sh: MAX_NUM_TOKENS = round_up_64(CONC + ISL + 64), at least 8192.
        max_tokens = max(INFERENCEX_DSR1_TRT_MIN_NUM_TOKENS,
                         -(-(max_batch_size + isl + 64) // 64) * 64)
        adp = max(int(attention_dp), 1)
        arch = "blackwell" if _fp4_tensor_cores(gpu) else "hopper"
        free = INFERENCEX_DSR1_TRT_FREE_MEMORY[arch]
        return EngineProfile(
            backend="trtllm", prefill_schedule="mixed", chunked_prefill=False,
            max_num_batched_tokens=max_tokens * adp, max_prefill_tokens=0,
            prefix_caching=False, kv_admission="reserve_max", overlap_scheduler=True,
            adp_balance_timeout_iters=INFERENCEX_DSR1_TRT_ADP_TIMEOUT_ITERS if adp > 1 else 0,
            gpu_memory_utilization=free, stream_interval=INFERENCEX_DSR1_TRT_STREAM_INTERVAL,
            sources=(
                *common,
                f"kv_cache_config free_gpu_memory_fraction {free} (InferenceX "
                + ("dsr1_fp4_b200_trt.sh / dsr1_fp8_b200_trt.sh)" if arch == "blackwell"
                   else "dsr1_fp8_h200_trt.sh)"),
                f"--max_num_tokens {max_tokens} = max(8192, round_up_64(C + isl + 64)) "
                "(InferenceX benchmarks/dsr1_fp8_h200_trt.sh at 1fc5d73)"
                + (f", per attention-DP rank: x{adp} ranks (TensorRT-LLM: \"Max num tokens in "
                   "each rank\")" if adp > 1 else ""),
                f"stream_interval: {INFERENCEX_DSR1_TRT_STREAM_INTERVAL}, no "
                "num_postprocess_workers (same recipe): the client's first chunk taken to carry "
                f"the {INFERENCEX_DSR1_TRT_STREAM_INTERVAL}th token (empirical, "
                "ServingConfig.stream_interval; INFERENCEX_DSR1_TRT_STREAM_INTERVAL)",
                *((f"attention_dp_config enable_balance, batching_wait_iters 0, timeout_iters "
                   f"{INFERENCEX_DSR1_TRT_ADP_TIMEOUT_ITERS} (same recipe, DP_ATTENTION=true): "
                   "prompts wait until every attention-DP rank has one, at most that many "
                   "iterations (PyExecutor._balance_adp_requests)",) if adp > 1 else ()),
            ))
    if "gpt-oss" in name:
        blackwell = _fp4_tensor_cores(gpu)
        return EngineProfile(
            backend="trtllm", prefill_schedule="mixed", chunked_prefill=False,
            max_num_batched_tokens=INFERENCEX_GPTOSS_TRT_MAX_NUM_TOKENS, max_prefill_tokens=0,
            prefix_caching=False, kv_admission="reserve_max", overlap_scheduler=True,
            moe_kernel="mxfp8" if blackwell else "", kv_dtype="fp8" if blackwell else "bf16",
            gpu_memory_utilization=INFERENCEX_GPTOSS_TRT_FREE_MEMORY,
            sources=(
                *common,
                f"kv_cache_config free_gpu_memory_fraction {INFERENCEX_GPTOSS_TRT_FREE_MEMORY} "
                "(InferenceX gptoss_fp4_h200_trt.sh, gptoss_fp4_b200_trt.sh)",
                ("kv_cache_config dtype: fp8 (InferenceX gptoss_fp4_b200_trt.sh)" if blackwell
                 else "kv_cache_config dtype: auto (InferenceX gptoss_fp4_h200_trt.sh): the "
                 "checkpoint's bf16 attention dtype (gpt-oss declares no KV-cache scheme)"),
                ("moe_config backend TRTLLM (InferenceX gptoss_fp4_b200_trt.sh): on Blackwell "
                 "TensorRT-LLM runs the MXFP4 experts with MXFP8 activations (TensorRT-LLM "
                 "'Deployment Guide for GPT-OSS', MoE backend support matrix: B200/GB200/B300/"
                 "GB300 MXFP8 x MXFP4 TRTLLM; its w4a8_mxfp4_mxfp8 rows)") if blackwell else
                ("moe_config backend TRITON (InferenceX gptoss_fp4_h200_trt.sh): BF16 "
                 "activations with MXFP4 weights on Hopper (the same guide's matrix)"),
                f"--max_batch_size {max_batch_size} (the concurrency), --max_num_tokens "
                f"{INFERENCEX_GPTOSS_TRT_MAX_NUM_TOKENS} (InferenceX "
                "benchmarks/gptoss_fp4_h200_trt.sh)",
            ))
    return None


def _trtllm_bench(*, max_batch_size: int, max_num_tokens: int) -> EngineProfile:
    """TensorRT-LLM (PyTorch backend) as ``trtllm-bench throughput`` runs it."""
    from charon_search.serving.trtllm_bench import (
        PERF_OVERVIEW_CUDA_GRAPH_SIZES,
        captured_graph_sizes,
    )

    if max_batch_size < 1 or max_num_tokens < 1:
        raise ConfigError("launcher 'trtllm_bench' needs `max_batch_size` and `max_num_tokens` "
                          f">= 1, but got ({max_batch_size}, {max_num_tokens})")
    graphs = captured_graph_sizes(PERF_OVERVIEW_CUDA_GRAPH_SIZES, max_batch_size=max_batch_size,
                                  max_num_tokens=max_num_tokens)
    return EngineProfile(
        backend="trtllm", prefill_schedule="mixed", chunked_prefill=False,
        max_num_batched_tokens=max_num_tokens, max_prefill_tokens=0, prefix_caching=False,
        kv_admission="reserve_max", overlap_scheduler=True, max_num_seqs=max_batch_size,
        cuda_graph_sizes=graphs, http_frontend=False,
        sources=(
            f"trtllm-bench tuning heuristics: max_batch_size {max_batch_size}, max_num_tokens "
            f"{max_num_tokens} (bench/build/tuning.py; raised to isl + max_batch_size without "
            "chunked prefill, bench/benchmark/utils/general.py get_settings)",
            "TensorRT-LLM PyTorch backend defaults kept by trtllm-bench: overlap scheduler on "
            "(host work hidden), chunked prefill off, capacity scheduler GUARANTEED_NO_EVICT, "
            "in-flight batching of context and generation under max_num_tokens",
            f"CUDA graphs with padding for generation-only batches, captured sizes {graphs[0]}.."
            f"{graphs[-1]} (perf-overview llm_options.yml batch_sizes, filtered to the largest "
            "decode batch: model_engine._filter_cuda_graph_batch_sizes)",
        ))


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchmarkProtocol:
    """The closed-loop load generator of a silicon row: ``concurrency`` streams start together
    (every client below sends at ``--request-rate inf`` behind a ``concurrency`` semaphore),
    ignore EOS (every request generates its sampled output length), ``warmup_turns *
    concurrency`` warm-up requests run first and are left out (drained before the measured
    phase when ``warmup_drains``, else in the same loop), then ``measured_turns *
    concurrency`` requests are measured and averaged.

    The default is aiperf as aiconfigurator's ``bench_run.sh.j2`` runs it (``AIPERF_AIC``);
    ``INFERENCEX`` is SemiAnalysis InferenceX's ``benchmark_serving.py``. aiperf draws its
    prompts from a pool of 100 (``prompt_pool``), so an engine launched with prefix caching
    (vLLM's default) computes each pool prompt once and then serves it from its cache.
    aiconfigurator's launches turn prefix caching off (``engine_profile``), and the Qwen3 gap
    rows show a full prefill per request; the 11 vLLM Llama-3.1-8B-FP8 rows are the exception:
    by Little's law they would otherwise prefill at 52-95 % of the H200's FP8 peak while
    decoding. InferenceX's random prompts are all distinct.

    Simulated start: all streams at once (ramp 0). Identical requests then stay in waves,
    exactly in a prefill-first engine (nobody decodes until the wave is prefilled, which
    re-synchronizes every wave), partly in a mixed one (a wave's prefill chunks stagger it);
    lengths drawn from ``[range_ratio * len, len]`` desynchronize the waves over the turns."""

    name: str = "aiperf-aiconfigurator"
    warmup_turns: int = 2
    """``--warmup-request-count $((concurrency*2))``."""
    measured_turns: int = 50
    """``--num-requests $((concurrency*50))``: aiconfigurator's ``k8s_bench.yaml.j2``, its
    ``deployment_config.yaml`` default ``BenchConfig.num_requests`` = concurrency x 50, and the
    earlier ``bench_run.sh.j2`` (``BENCH_MULTI_ROUND`` 50; the 0.12.0 script's default is 20)."""
    range_ratio: float = 1.0
    """Prompt and output lengths are drawn uniformly from ``[int(range_ratio * len), len]``
    (1.0 = exactly ``isl`` / ``osl``)."""
    warmup_drains: bool = True
    """The client waits for every warm-up response before the measured phase, which therefore
    starts on an idle engine with all streams together, like a run without warm-up (the
    warm-up only warms caches and connections): nothing of it is simulated."""
    prompt_pool: int = 0
    """Distinct prompts the client draws its requests from, in turn (0 = a new prompt per
    request). An engine with prefix caching serves a repeated prompt from its cache; the
    warm-up's draws leave theirs cached (``WorkloadSpec.cached_prefixes``)."""
    sources: tuple[str, ...] = (
        "aiconfigurator generator/config/backend_templates/benchmark/{bench_run.sh,"
        "k8s_bench.yaml}.j2: aiperf --concurrency C --warmup-request-count 2C --num-requests 50C "
        "(deployment_config.yaml BenchConfig.num_requests = 50 x concurrency), synthetic prompts "
        "of exactly isl tokens (isl_stddev 0), output exactly osl tokens (ignore_eos), "
        "streaming",
        "aiperf waits for all warm-up responses before it starts the profiling phase (aiperf "
        "docs/tutorials/warmup.md, 'Grace Period'; the timing manager's phases complete when "
        "every credit of the phase has returned): the measured turns start from an idle "
        "engine, all C streams together, and the mean holds that first wave",
        "prompts come from a pool of 100: aiperf InputDefaults.NUM_DATASET_ENTRIES = 100 "
        "(genai-perf DEFAULT_NUM_DATASET_ENTRIES = 100 before it), sampled with "
        "DatasetSamplingStrategy.SHUFFLE (every entry once per pass), and bench_run.sh passes "
        "no --num-dataset-entries; warm-up and measured requests draw from the same pool",)

    def __post_init__(self) -> None:
        if not 0.0 < self.range_ratio <= 1.0:
            raise ConfigError(f"`range_ratio` must be in (0, 1], but got {self.range_ratio}")
        if self.prompt_pool < 0:
            raise ConfigError(f"`prompt_pool >= 0` must hold, but got {self.prompt_pool}")
        if self.warmup_turns < 0 or self.measured_turns < 1:
            raise ConfigError("`warmup_turns >= 0` and `measured_turns >= 1` must hold, but got "
                              f"({self.warmup_turns}, {self.measured_turns})")

    def length_bounds(self, length: int) -> tuple[int, int]:
        """Inclusive ``(low, high)`` of the lengths the client draws for a nominal ``length``."""
        return max(1, int(length * self.range_ratio)), length


#: aiconfigurator's gap-analysis benchmark (the rows whose source names
#: ``aic-auto-gap-analysis``).
AIPERF_AIC = BenchmarkProtocol(prompt_pool=100)

#: SemiAnalysis InferenceX (formerly InferenceMAX) fixed-sequence-length benchmark, the client of
#: the silicon rows from dated dumps (``source_file=<date>.csv; model=...; image=...`` and
#: ``db-dump/...; config_id; workflow_run_id``): their models, ISL/OSL grid (1k/1k, 1k/8k,
#: 8k/1k), concurrencies (4..64, 128, 512) and container images (``nvcr.io#nvidia/...``, the
#: enroot notation of its Slurm runners) are InferenceX's.
INFERENCEX = BenchmarkProtocol(
    name="inferencex", warmup_turns=0, measured_turns=10, range_ratio=0.8, warmup_drains=False,
    sources=(
        "InferenceX benchmarks/benchmark_lib.sh run_benchmark_serving: "
        "utils/bench_serving/benchmark_serving.py --dataset-name random --request-rate inf "
        "--max-concurrency C --num-prompts 10C (per-model scripts) --ignore-eos",
        "InferenceX .github/workflows/benchmark-tmpl.yml: RANDOM_RANGE_RATIO 0.8; "
        "benchmark_serving.py sample_random_requests draws input and output lengths uniformly "
        "from [int(0.8 len), len]",
        "benchmark_serving.py: its warm-up requests (if any) finish before the measured run, "
        "which starts on an idle server; mean TTFT/TPOT over all 10C requests",
    ))
