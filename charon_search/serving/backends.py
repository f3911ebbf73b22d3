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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from charon_search.errors import ConfigError

__all__ = ["BACKENDS", "BenchmarkProtocol", "EngineProfile", "engine_profile"]

BACKENDS = ("vllm", "sglang", "trtllm")

#: vLLM v1 default ``max_num_batched_tokens`` of the OpenAI API server on GPUs with >= 70 GiB
#: (H100/H200): 8192 (``EngineArgs._set_default_args``, v0.10+). aiconfigurator's vLLM 0.12
#: launch template passes no ``--max-num-batched-tokens``, so the default applies.
VLLM_API_SERVER_BATCHED_TOKENS = 8192
#: SGLang default ``chunked_prefill_size`` on 80-160 GB GPUs (H100, H200): 8192
#: (``ServerArgs`` GPU-memory-dependent defaults, 0.5.x).
SGLANG_CHUNKED_PREFILL_SIZE = 8192
#: aiconfigurator's rules size prefill limits as ``isl + 1500`` (sglang.rule
#: ``max_prefill_tokens``; trtllm.rule ``agg max_num_tokens = max_batch_size + isl + 1500``).
AIC_PREFILL_HEADROOM_TOKENS = 1500
#: SGLang's ``max_prefill_tokens`` when nobody sets it: 16384 (``ServerArgs``).
SGLANG_DEFAULT_MAX_PREFILL_TOKENS = 16384
LAUNCHERS = ("aiconfigurator", "engine_defaults")


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
    iteration_overhead_s: float | None = None
    """Host time per iteration the GPU waits for; None = the cluster's calibrated value. 0 for
    engines whose overlap scheduler prepares iteration n + 1 while the GPU runs n."""
    sources: tuple[str, ...]
    """One line per fact: what it is and where it comes from."""

    def config_kwargs(self) -> dict[str, Any]:
        """The ``ServingConfig`` fields this profile sets."""
        return {"prefill_schedule": self.prefill_schedule,
                "chunked_prefill": self.chunked_prefill,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_prefill_tokens": self.max_prefill_tokens,
                "prefix_caching": self.prefix_caching,
                "decode_in_budget": self.decode_in_budget,
                "kv_admission": self.kv_admission,
                "iteration_overhead_s": self.iteration_overhead_s}


#: SGLang versions whose aiconfigurator launch template never passes ``--enable-mixed-chunk``
#: although the agg rule asks for it: ``cli_args.0.5.1.post1.j2`` tests the key
#: ``enable-mix-chunk`` while the parameter mapping emits ``enable-mixed-chunk``.
SGLANG_UNMIXED_VERSIONS = ("0.5.1", "0.5.1.post1")


def engine_profile(backend: str, *, isl: int, max_batch_size: int, version: str = "",
                   launcher: str = "aiconfigurator") -> EngineProfile:
    """Scheduler facts of ``backend`` (``version`` where it matters) serving prompts of ``isl``
    tokens with at most ``max_batch_size`` running requests, launched by aiconfigurator's
    generator (``launcher="aiconfigurator"``) or with the engine's own defaults
    (``"engine_defaults"``: measurements whose launch flags are not known).

    Raises:
        ConfigError: unknown backend.
    """
    if launcher not in LAUNCHERS:
        raise ConfigError(f"`launcher` must be one of {list(LAUNCHERS)}, but got {launcher!r}")
    aic = launcher == "aiconfigurator"
    if backend == "vllm":
        return EngineProfile(
            backend=backend, prefill_schedule="mixed", chunked_prefill=True,
            max_num_batched_tokens=VLLM_API_SERVER_BATCHED_TOKENS, max_prefill_tokens=0,
            prefix_caching=True,
            sources=(
                "vLLM v1: decodes first, then chunked prefills in one token budget "
                "(v1/core/sched/scheduler.py)",
                f"vLLM v1 API-server budget {VLLM_API_SERVER_BATCHED_TOKENS} tokens on >= 70 GiB "
                "GPUs (EngineArgs defaults; aiconfigurator's vLLM template sets none)",
                "vLLM v1 prefix caching on by default (enable_prefix_caching=True)",
                "vLLM 0.12 schedules synchronously (async scheduling opt-in): the cluster's "
                "per-iteration host time applies",
            ))
    if backend == "sglang":
        mixed = aic and version not in SGLANG_UNMIXED_VERSIONS
        why = ("the aiconfigurator agg rule asks for it" if mixed else
               "the 0.5.1.post1 template misspells the flag" if aic else "SGLang default")
        return EngineProfile(
            backend=backend, prefill_schedule="mixed" if mixed else "prefill_first",
            chunked_prefill=True, max_num_batched_tokens=SGLANG_CHUNKED_PREFILL_SIZE,
            max_prefill_tokens=(isl + AIC_PREFILL_HEADROOM_TOKENS if aic
                                else SGLANG_DEFAULT_MAX_PREFILL_TOKENS),
            prefix_caching=False, decode_in_budget=False, iteration_overhead_s=0.0,
            sources=(
                "SGLang overlap scheduler on by default (disable_overlap_schedule=False): "
                "host work hidden behind the GPU",
                "SGLang: a new prefill batch runs before decoding; with --enable-mixed-chunk "
                "the running decodes ride along, else they wait (managers/scheduler.py); "
                f"mixed chunk {'on' if mixed else 'off'} ({why})",
                "SGLang: decode tokens do not count against the chunked-prefill size",
                f"SGLang chunked_prefill_size {SGLANG_CHUNKED_PREFILL_SIZE} on H100/H200 "
                "(ServerArgs defaults)",
                "max_prefill_tokens = isl + 1500 (aiconfigurator sglang.rule)" if aic else
                f"max_prefill_tokens {SGLANG_DEFAULT_MAX_PREFILL_TOKENS} (ServerArgs default)",
                "no prefix reuse: the silicon rows' TTFT equals half of a whole synchronized "
                "wave's prefill (TTFT ~ concurrency x isl / tp), which a radix-cache hit "
                "would remove",
            ))
    if backend == "trtllm":
        return EngineProfile(
            backend=backend, prefill_schedule="mixed", chunked_prefill=False,
            max_num_batched_tokens=max_batch_size + isl + AIC_PREFILL_HEADROOM_TOKENS,
            max_prefill_tokens=0, prefix_caching=False, kv_admission="reserve_max",
            iteration_overhead_s=0.0,
            sources=(
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


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchmarkProtocol:
    """The closed-loop load generator of the silicon rows (aiperf, as aiconfigurator's
    ``bench_run.sh.j2`` runs it): ``concurrency`` streams start together, ignore EOS (every
    request generates exactly ``osl`` tokens), ``warmup_turns * concurrency`` warm-up requests
    are left out. Prompts are treated as distinct: by Little's law the rows' engines do the
    whole prefill work (the 11 vLLM Llama-3.1-8B-FP8 rows are the exception: they imply prefill
    at 52-95 % of the FP8 peak, i.e. prompt reuse the protocol does not state).

    Simulated start: all streams at once (ramp 0). Identical requests then stay in waves,
    exactly in a prefill-first engine (nobody decodes until the wave is prefilled, which
    re-synchronizes every wave), partly in a mixed one (a wave's prefill chunks stagger it).
    Rows of other dumps do not say how their client started: they are run from evenly phased
    streams (``WorkloadSpec.ramp_up_s`` None), the steady state of a desynchronized loop."""

    warmup_turns: int = 2
    """``--warmup-request-count $((concurrency*2))``."""
    measured_turns: int = 50
    """``--num-requests $((concurrency*50))`` (BENCH_MULTI_ROUND default 50)."""
