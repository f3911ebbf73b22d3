"""ServingConfig and its parts: how one model is served (engine knobs, parallelism, pools).

Everything here is a frozen, keyword-only dataclass validated in ``__post_init__`` and built from
YAML/JSON with ``from_dict``, which rejects unknown keys with the allowed ones.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from charon_search.config_fields import typed_kwargs
from charon_search.errors import ConfigError
from charon_search.hardware.spec import FRONTEND_KEYED_TIMES, SERVING_ENGINES, SERVING_FRONTENDS

__all__ = [
    "DEFAULT_CUDA_GRAPH_SIZES",
    "KV_ADMISSIONS",
    "KV_TRANSFER_TIERS",
    "MOE_KERNELS",
    "PREFILL_SCHEDULES",
    "SCHEDULERS",
    "TP_ALLREDUCES",
    "DisaggConfig",
    "PoolConfig",
    "ServingConfig",
    "SpeculativeConfig",
    "parse_disagg",
]

SCHEDULERS = ("vllm", "static")
#: How a continuous-batching iteration combines prefill and decode work.
#: ``mixed``: decodes first, then prefill chunks in the same forward pass, all within the token
#: budget (vLLM v1 ``Scheduler.schedule``: running requests before waiting ones; TRT-LLM
#: in-flight batching). ``prefill_first``: whenever a waiting request can be admitted, the
#: iteration is a prefill-only batch and running decodes wait (SGLang
#: ``Scheduler.get_next_batch_to_run`` without ``--enable-mixed-chunk``, its default).
PREFILL_SCHEDULES = ("mixed", "prefill_first")
#: When a request is admitted against the KV cache. ``on_demand``: blocks are allocated as the
#: request grows; when they run out the most recently admitted running request is preempted
#: (vLLM v1 ``Scheduler.schedule``). ``ratio``: SGLang's ``PrefillAdder``
#: (``managers/schedule_policy.py``): a request is admitted only if its remaining prompt plus
#: ``min(max_new_tokens, 4096)`` fits in the free KV minus the running requests' expected
#: future output (``new_token_ratio`` x their remaining output, the ratio decaying per decode
#: step and raised after a retraction; ``engine.ReplicaEngine``). ``ignore_eos``: the same
#: engine when its clients ignore EOS and its radix cache is off
#: (``PrefillAdder.add_one_req_ignore_eos``): admitted only if, with every request's remaining
#: output known, the cache never runs out as they finish. ``reserve_max``: admitted
#: only if its prompt + output fit next to the running requests' own prompt + output, so
#: nothing is ever preempted (TensorRT-LLM's default capacity scheduler policy
#: ``GUARANTEED_NO_EVICT``).
KV_ADMISSIONS = ("on_demand", "ratio", "ignore_eos", "reserve_max")
#: Tensor-parallel all-reduce implementations: NCCL, or an engine's custom NVLink kernel.
TP_ALLREDUCES = ("nccl", "vllm", "sglang", "trtllm")
#: Kernel running the routed experts of a quantized MoE checkpoint when a launch chose it;
#: ``""`` = the engine's default for the checkpoint's format (``serving._graphs``).
MOE_KERNELS = ("", "marlin", "mxfp8", "triton")
#: Serving engines a cluster calibrates times for (HTTP front end, prompt iterations);
#: ``""`` = none.
ENGINES = ("", *SERVING_ENGINES)
#: ``ServingConfig.frontend``: the engine's own server, or a front end launched in front of it.
FRONTENDS = ("", *SERVING_FRONTENDS)
KV_TRANSFER_TIERS = ("rdma", "nvlink")
#: ``int4``: 4-bit integer weights with 16-bit activations (W4A16), for checkpoints whose
#: catalog entry says which GEMMs are 4-bit (``serving._graphs.checkpoint_quant``).
PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "int4")
#: ``auto``: what an engine launched without ``--kv-cache-dtype`` stores, the KV-cache quantization
#: the checkpoint declares, else bf16 (``serving._graphs.checkpoint_kv_dtype``; resolved when
#: the simulation starts, ``resolve_kv_dtype``).
KV_DTYPES = ("auto", "bf16", "fp16", "fp8")

#: vLLM's default CUDA-graph capture sizes (v0.11+, ``VllmConfig._set_cudagraph_sizes``,
#: vllm/config/vllm.py): 1, 2, 4, every multiple of 8 below 256, then every 16th size from 256
#: up to ``max_cudagraph_capture_size`` = min(2 x max_num_seqs, 512), here 512 (max_num_seqs
#: 256). vLLM 0.10 captured every multiple of 8 up to 512.
DEFAULT_CUDA_GRAPH_SIZES: tuple[int, ...] = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))


def _choice(name: str, value: object, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"`{name}` must be one of {list(allowed)}, but got {value!r}")


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"`{name}` must be a positive integer, but got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeConfig:
    """Speculative decoding with a draft model or MTP heads."""

    num_draft_tokens: int
    """k: tokens proposed per step."""
    acceptance_rate: float | tuple[float, ...] = 0.7
    """Probability a draft token is accepted given all earlier ones were: one number, or one
    per draft position (length k)."""
    method: str = "mtp"
    """``mtp`` (extra decoder layer(s) of the target, DeepSeek-V3 style) or ``draft`` (a
    separate draft model run k times)."""
    draft_model: str = ""
    """Catalog name of the draft model (``method == 'draft'``)."""

    def __post_init__(self) -> None:
        _positive_int("speculative.num_draft_tokens", self.num_draft_tokens)
        _choice("speculative.method", self.method, ("mtp", "draft"))
        rates = self.per_position_acceptance
        if len(rates) != self.num_draft_tokens:
            raise ConfigError(
                "`len(speculative.acceptance_rate) == num_draft_tokens` must hold, but got "
                f"({len(rates)=}, num_draft_tokens={self.num_draft_tokens})"
            )
        if any(not 0.0 <= a <= 1.0 for a in rates):
            got = self.acceptance_rate
            raise ConfigError("`speculative.acceptance_rate` (serve --spec-acceptance) must lie "
                              f"in [0, 1] (one number, or one per draft position), but got {got}")
        if self.method == "draft" and not self.draft_model:
            raise ConfigError("speculative.method 'draft' needs `draft_model` (a catalog name)")

    @property
    def per_position_acceptance(self) -> tuple[float, ...]:
        a = self.acceptance_rate
        if isinstance(a, (int, float)):
            return (float(a),) * self.num_draft_tokens
        return tuple(float(x) for x in a)

    @property
    def expected_tokens_per_step(self) -> float:
        """Tokens committed per verify step: 1 (the target's own token) + expected accepted.

        Draft i is kept only if drafts 1..i all are: E = 1 + sum_i prod_{j<=i} a_j
        (Leviathan et al. 2023, eq. 1 for a constant rate: (1 - a^(k+1)) / (1 - a)).
        """
        total, keep = 1.0, 1.0
        for a in self.per_position_acceptance:
            keep *= a
            total += keep
        return total

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpeculativeConfig:
        kw = typed_kwargs(cls, data, "speculative")
        if isinstance(kw.get("acceptance_rate"), list):
            kw["acceptance_rate"] = tuple(kw["acceptance_rate"])
        return cls(**kw)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolConfig:
    """One pool of identical engine replicas (a prefill or decode pool of PD disaggregation)."""

    num_replicas: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cluster: str = ""
    """Cluster (GPU type) of this pool; empty = the simulation's cluster."""
    dp_attention: bool | None = None
    """MoE DP-attention in this pool; None = ``ServingConfig.dp_attention`` (disaggregated
    deployments often run attention-DP prefill beside attention-TP decode)."""
    max_num_batched_tokens: int = 0
    """Token budget of one iteration of a replica of this pool; 0 = ``ServingConfig``'s."""
    max_num_seqs: int = 0
    """Running requests per replica of this pool; 0 = ``ServingConfig``'s."""

    def __post_init__(self) -> None:
        for name in ("num_replicas", "tp", "pp", "ep"):
            _positive_int(f"pool.{name}", getattr(self, name))
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"`pool.{name}` must be an integer >= 0, but got {v!r}")
        if self.dp_attention not in (None, True, False):
            raise ConfigError("`pool.dp_attention` must be true, false or null, but got "
                              f"{self.dp_attention!r}")

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolConfig:
        return cls(**typed_kwargs(cls, data, "pool"))


@dataclass(frozen=True, slots=True, kw_only=True)
class DisaggConfig:
    """Prefill/decode disaggregation (xPyD): two pools and how KV moves between them. The
    client's first token comes from the decode pool once the KV has arrived: as the request
    joins under ``engine="sglang"``, with the first decode step run for it otherwise."""

    prefill: PoolConfig
    decode: PoolConfig
    kv_transfer: str = "rdma"
    """Network tier the KV cache crosses: ``rdma`` (outermost tier, scale-out NIC) or
    ``nvlink`` (innermost tier, same NVLink domain)."""

    def __post_init__(self) -> None:
        _choice("disagg.kv_transfer", self.kv_transfer, KV_TRANSFER_TIERS)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DisaggConfig:
        kw = typed_kwargs(cls, data, "disagg")
        for k in ("prefill", "decode"):
            if k not in kw:
                raise ConfigError(f"disagg: missing key {k!r}")
            if isinstance(kw[k], str):
                kw[k] = _parse_pool(kw[k], k)
            elif isinstance(kw[k], Mapping):
                kw[k] = PoolConfig.from_dict(kw[k])
        return cls(**kw)


_POOL_RE = re.compile(
    r"^(?P<n>\d+)x(?:tp(?P<tp>\d+))?(?:pp(?P<pp>\d+))?(?:ep(?P<ep>\d+))?(?:@(?P<cl>[\w.\-/]+))?$"
)


def _parse_pool(text: str, name: str) -> PoolConfig:
    m = _POOL_RE.match(text.strip().lower())
    if not m:
        raise ConfigError(
            f"disagg pool `{name}` must look like 2xTP2 (NxTPa[PPb][EPc][@cluster]), "
            f"but got {text!r}"
        )
    return PoolConfig(num_replicas=int(m["n"]), tp=int(m["tp"] or 1), pp=int(m["pp"] or 1),
                      ep=int(m["ep"] or 1), cluster=m["cl"] or "")


def parse_disagg(text: str, kv_transfer: str = "rdma") -> DisaggConfig:
    """Parse ``prefill=2xTP2,decode=1xTP4`` (as in ``charon-search serve --disagg``)."""
    parts: dict[str, PoolConfig] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("prefill", "decode"):
            raise ConfigError(
                f"`--disagg` must be 'prefill=NxTPa,decode=MxTPb', but got {text!r}"
            )
        parts[key] = _parse_pool(value, key)
    if set(parts) != {"prefill", "decode"}:
        raise ConfigError(f"`--disagg` needs both prefill= and decode=, but got {text!r}")
    return DisaggConfig(prefill=parts["prefill"], decode=parts["decode"], kv_transfer=kv_transfer)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingConfig:
    """How a model is served: parallelism, scheduler and engine features (vLLM vocabulary)."""

    tp: int = 1
    """Tensor-parallel degree of one replica."""
    pp: int = 1
    """Pipeline-parallel degree of one replica (stages run one batch at a time)."""
    ep: int = 1
    """Expert-parallel degree (MoE); experts are sharded over ep of the replica's GPUs."""
    dp: int = 1
    """Identical replicas behind a round-robin router (aggregated serving)."""
    dp_attention: bool = False
    """MoE DP-attention: attention data parallel over the ``tp`` GPUs (each holds whole heads
    for its share of the requests), experts over ``ep``."""
    sp: int = 1
    """Sequence-parallel degree for prefill attention (zigzag split, KV all-gather); extra GPUs
    per replica beyond tp * pp."""
    dynamic_sp: bool = False
    """Choose each prefill request's SP degree per batch (Charon's case study) instead of the
    fixed degree ``sp`` for every request."""
    scheduler: str = "vllm"
    """``vllm`` (continuous batching) or ``static`` (batch-at-a-time baseline)."""
    max_num_seqs: int = 256
    """Requests running at once per replica."""
    max_num_batched_tokens: int = 8192
    """Token budget of one iteration (decode tokens + prefill chunk tokens)."""
    chunked_prefill: bool = True
    """Sarathi-style chunked prefill: split long prompts to fill the token budget."""
    prefill_schedule: str = "mixed"
    """``mixed`` (decodes and prefill chunks share one iteration and its budget) or
    ``prefill_first`` (a prefill batch runs alone while decodes wait); see
    ``PREFILL_SCHEDULES``."""
    max_prefill_tokens: int = 0
    """Cap on the prompt tokens of one iteration's prefill batch (SGLang
    ``--max-prefill-tokens``); 0 = only the token budget applies."""
    decode_in_budget: bool = True
    """Decode tokens count against ``max_num_batched_tokens`` (vLLM, TensorRT-LLM); False:
    the budget is for prefill tokens only (SGLang's chunked-prefill size)."""
    kv_admission: str = "on_demand"
    """``on_demand``, ``ratio`` or ``reserve_max``; see ``KV_ADMISSIONS``."""
    batch_wait_iters: int = 0
    """Hold newly arrived prompts back while decodes run, for at most this many iterations, until
    the prompt + decode tokens of the batch reach ``batch_wait_tokens`` (TensorRT-LLM
    ``batch_wait_timeout_iters`` / ``batch_wait_max_tokens_ratio * max_num_tokens``,
    ``PyExecutor._waiting_requests``); 0 = admit at once."""
    batch_wait_tokens: int = 0
    adp_balance_timeout_iters: int = 0
    """Attention-DP context balancing (TensorRT-LLM ``attention_dp_config: enable_balance``,
    ``PyExecutor._balance_adp_requests``): with ``dp_attention``, prompts start only when every
    attention-DP rank (``tp`` of them) has one to start, unless some rank has no decoding
    request or they have been held this many iterations; 0 = off. One engine stands for the
    ranks, so "every rank has one" is read as "at least ``tp`` prompts wait" (the router sends
    each new request to the least loaded rank) and "every rank decodes" as "at least ``tp``
    decodes"."""
    prefix_caching: bool = False
    """Reuse cached KV blocks of a shared prompt prefix (radix tree, LRU eviction)."""
    block_size: int = 16
    """Tokens per paged KV block."""
    windowed_kv: bool | None = None
    """Layers with sliding-window or chunked local attention (``ModelSpec.sliding_layers``:
    gpt-oss, Llama 4) keep only their window's KV blocks of each request in a pool shared with
    the full-attention layers (``kv_cache.KvWindow``), as vLLM's hybrid KV cache manager (the
    v1 default) does and TensorRT-LLM's variable sliding-window cache nearly does (its
    per-window pools are sized by layers x window). False = every layer keeps every token
    (vLLM ``--disable-hybrid-kv-cache-manager``). None = the engine's way: the shared pool,
    except for SGLang, whose sliding-window layers get a pool of their own holding
    ``--swa-full-tokens-ratio`` (0.8) times the full-attention pool's tokens
    (``simulator.SGLANG_SWA_FULL_TOKENS_RATIO``): the full-attention pool is the limit and
    holds ``layers / (full + 0.8 x windowed layers)`` times the tokens of a cache without
    windows (gpt-oss: 36 / 32.4 = 1.11); its Llama 4 chunked-attention pools
    (``--hybrid-kvcache-ratio``) are not modelled (no saving). vLLM 0.10 to 0.12 kept Llama 4's
    chunked layers at full length unless ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE``
    was set (vllm#21761, on by default again since vllm#29627): set False for those."""
    gpu_memory_utilization: float | None = None
    """The launch's memory fraction, read as ``engine``'s own knob
    (``memory.serving.MEMORY_RULES``): vLLM ``--gpu-memory-utilization`` (share of the device
    for weights, activations and KV), SGLang ``--mem-fraction-static`` (share for weights and
    KV; activations and CUDA graphs outside it), TensorRT-LLM ``free_gpu_memory_fraction``
    (share of the memory left free after weights and a profiling pass); no engine: vLLM's.
    None = the engine's default (vLLM and TensorRT-LLM 0.9, SGLang its per-launch rule,
    ``serving.backends.engine_memory``)."""
    num_kv_blocks: int = 0
    """Override the KV-cache capacity in blocks per replica (0 = from the memory model)."""
    cuda_graph: bool = True
    """Decode-only batches replay captured CUDA graphs (no host launch cost)."""
    cuda_graph_sizes: tuple[int, ...] = DEFAULT_CUDA_GRAPH_SIZES
    """Captured decode batch sizes. vLLM (``engine`` ``vllm`` or ``""``) keys its graphs by
    tokens (``CudagraphDispatcher``: a speculative verify batch of n requests x q tokens is
    matched on n x q); SGLang and TensorRT-LLM by requests."""
    cuda_graph_padding: bool = True
    """A decode batch is padded up to the next captured size; False: only a batch of exactly
    a captured size replays its graph, any other runs eagerly (TensorRT-LLM
    ``CudaGraphConfig.enable_padding``, False by default)."""
    piecewise_graph_tokens: int = 0
    """Iterations carrying prompt tokens with at most this many tokens in all replay piecewise
    CUDA graphs: the model between its attention calls is captured, and only the attention
    operators are launched by the host (vLLM's ``PIECEWISE`` / ``FULL_AND_PIECEWISE``
    cudagraph modes up to ``max_cudagraph_capture_size``, ``compilation/cuda_graph.py``).
    0: every iteration with prompt tokens launches all its kernels from the host (vLLM's
    ``FULL_DECODE_ONLY``, SGLang and TensorRT-LLM prefills)."""
    kernel_launch_overhead_s: float = 4.0e-6
    """Host time to launch one kernel when not replaying a graph; an eager iteration takes at
    least ``kernels * this``. ~4 us per launch: CUDA C best-practices guide, "kernel launch
    overhead" (a few microseconds). The cluster's calibrated ``eager_kernel_host_s[engine]``
    (the engine's whole host time per operator: Python model code, dispatch and launch) takes
    over where it is larger. Behind an overlap scheduler the host starts launching a batch as
    soon as it has launched the previous one, so that one's GPU time hides part of it."""
    tp_allreduce: str = "nccl"
    """Who runs the tensor-parallel activation all-reduces inside a node: ``nccl`` (the
    cluster's collective model) or an engine's custom NVLink kernel (``vllm``, ``sglang``,
    ``trtllm``: measured latency, ``serving.custom_allreduce``)."""
    stream_interval: int = 1
    """Tokens per streamed response chunk, the first chunk included: the client's first chunk
    is taken to carry the ``stream_interval``-th token. TTFT and TPOT are reported as that
    client measures them (TTFT to the first chunk; TPOT = (E2E - TTFT) / (output tokens - 1)),
    the chunk's arrival placed at the request's mean token interval after its first token.

    This is an empirical rule, not the engines': the InferenceX SGLang rows launched with
    ``--stream-interval`` (DeepSeek-R1 every 10 tokens, Qwen3.5 on B200 every 30) and the
    TensorRT-LLM DeepSeek rows (``stream_interval: 10`` without post-processing workers,
    ``backends.INFERENCEX_DSR1_TRT_STREAM_INTERVAL``) measure TTFT about (interval - 1) decode
    steps above the simulated prefill, but SGLang's ``stream_output_generation``
    (``scheduler_output_processor_mixin.py``) sends a streaming request's output when
    ``len(output_ids) % stream_interval == 1`` and TensorRT-LLM's ``PyExecutor.
    _handle_responses`` when ``py_decoding_iter == 1`` or a multiple of the interval: the first
    token at once, then every interval. The delay the rule reproduces has a cause not identified
    here."""
    scheduler_recv_interval: int = 1
    """SGLang ``--scheduler-recv-interval`` (``managers/scheduler_recv_skipper.py``): the
    scheduler polls for new requests only every this many decode-only batches; after a batch
    with prompt tokens (weight 1000) or while idle it polls at once. A request that arrives in
    between waits for the next poll before it can be prefilled. 1 = poll before every batch
    (the default of every engine)."""
    moe_kernel: str = ""
    """Kernel that runs the routed experts of a quantized checkpoint, when a launch flag or the
    engine's default on the GPU chose it: ``marlin`` (the Marlin MoE kernel for 4-bit MXFP4 or
    int4 weights, e.g. vLLM ``VLLM_MXFP4_USE_MARLIN=1``), ``mxfp8`` (MXFP4 weights with MXFP8
    activations on Blackwell, e.g. TensorRT-LLM's TRTLLM MoE backend), ``triton`` (vLLM's
    Triton fused MoE for fp8 and block-fp8 weights, e.g. ``--moe-backend triton`` or
    ``VLLM_USE_FLASHINFER_MOE_FP8=0 VLLM_MOE_USE_DEEP_GEMM=0``); ``""`` = the engine's default
    for the format. Other formats ignore it."""
    allreduce_norm_fusion: bool = False
    """The RMSNorm (with its residual add) that follows a tensor-parallel all-reduce runs in the
    all-reduce kernel's epilogue, so it costs no kernel of its own: SGLang's
    ``--enable-flashinfer-allreduce-fusion`` (FlashInfer's fused all-reduce). TensorRT-LLM
    always does it (``serving._fusion.fuse_trtllm``, with ``tp_allreduce="trtllm"``). Applies
    to TP > 1 without attention DP."""
    fused_kernels: bool = True
    """Cost the kernels vLLM/SGLang/TRT-LLM launch (fused QKV and gate_up GEMMs, fused
    add+RMSNorm, RoPE, SiLU-and-mul, fused MoE routing; ``serving._fusion``) instead of one
    kernel per traced op."""
    iteration_overhead_s: float | None = None
    """Per-iteration CPU/scheduler time; None = the cluster's calibrated
    ``iteration_cpu_overhead_s``."""
    overlap_scheduler: bool = False
    """The host forms batch n + 1 while the GPU runs batch n (TensorRT-LLM's overlap scheduler,
    SGLang's overlap schedule, vLLM ``--async-scheduling``). A prompt that arrives while batch n
    runs therefore misses batch n + 1, which was formed when n started, and joins n + 2 at the
    earliest (only an otherwise empty batch sees it at once: then nothing overlaps). Host time
    per iteration is hidden, so such engines run with ``iteration_overhead_s = 0``."""
    engine: str = ""
    """The serving engine this configuration stands for (``vllm``, ``sglang``, ``trtllm``;
    ``""`` = a generic engine). It selects the cluster's calibrated front-end times
    (``frontend_latency_s``, ``frontend_prompt_token_s``, ``frontend_output_token_s``),
    prompt-iteration overhead (``prefill_iteration_overhead_s``) and disaggregated hand-over
    time (``disagg_handoff_s``). It does not set the engine's scheduler defaults (chunk size,
    overlap scheduler, all-reduce kernel, memory fraction): the other fields are taken as
    given; ``serving.engine_serving_config`` fills them as ``serve --engine`` does."""
    frontend_latency_s: float | None = None
    """Time a request spends in the engine's serving front end, outside the simulated
    scheduler: the HTTP server, chat template and tokenization, the hand-over to the executor
    and the first token's way back to the client. It is added to the request's path into the
    engine, so it counts in TTFT and E2E (and delays a closed loop's next request) but not in
    TPOT. None = the cluster's calibrated ``frontend_latency_s`` of the process that takes the
    request: ``[engine]`` for the engine's own server, ``["dynamo"]`` when ``frontend`` is
    ``dynamo`` (0 when it has none)."""
    frontend_prompt_token_s: float | None = None
    """Front-end time per prompt token, on top of ``frontend_latency_s``: the server turns the
    prompt text into token ids and processes the request's input before the scheduler sees it,
    so a longer prompt reaches the engine later. Counts like ``frontend_latency_s`` (TTFT and
    E2E, not TPOT). None = the cluster's calibrated ``frontend_prompt_token_s`` of the process
    that tokenizes: ``[engine]`` for the engine's own server, ``["dynamo"]`` when ``frontend``
    is ``dynamo`` (0 when it has none)."""
    frontend: str = ""
    """What streams the engine's tokens to the clients: ``""`` = the engine's own server (one
    front end for all replicas, at the cluster's ``frontend_output_token_s[engine]``) or
    ``"dynamo"`` = NVIDIA Dynamo (``dynamo.frontend`` with one ``dynamo.<engine>`` Python
    worker per replica, which hands every token of its replica's requests to the frontend: one
    queue per replica, at the cluster's ``frontend_output_token_s["dynamo"]``)."""
    frontend_output_token_s: float | None = None
    """Front-end time per streamed output token (one per request per iteration that gives it a
    token): the server's front-end process turns token ids back into text and writes each
    request's stream chunk to its client, one after another, for all requests together. The
    tokens of an iteration reach their clients once the front end has worked through them and
    every token queued before them, so while the engine emits tokens faster than
    ``1 / frontend_output_token_s`` per second they queue there: TTFT, TPOT and E2E grow and a
    closed loop's next request starts later. None = the cluster's calibrated
    ``frontend_output_token_s`` of ``frontend`` (else of ``engine``; 0 when it has none)."""
    frontend_output_stream_s: float | None = None
    """Front-end time per streaming request per output cycle: the server's front-end process
    hands each request that has new tokens one stream chunk (detokenized text, the response
    object, the HTTP write), going through the requests one after another. Tokens the engine
    emits while the front end is still busy wait for its next cycle and *merge* into one chunk
    per request (vLLM's ``RequestOutputCollector``), so the cost of a cycle is this times the
    requests it serves, however many iterations it covers. It delays every token by the cycle
    that delivers it: in a steady closed loop that lag is the same for a request's first and
    last token, so it counts in TTFT and E2E, and TPOT stays the engine's; unlike
    ``frontend_output_token_s`` it never caps the output rate. None = the cluster's calibrated
    ``frontend_output_stream_s`` of ``frontend`` (else of ``engine``; 0 when it has none)."""
    prefill_iteration_overhead_s: float | None = None
    """Host time an iteration that carries prompt tokens adds to its GPU time, which the
    overlap scheduler does not hide: such iterations run eagerly (TensorRT-LLM and SGLang
    capture CUDA graphs of decode-only batches; prompt batches launch every kernel from the
    Python model code) and set up the new requests. It lengthens the iteration for every request
    in it, so it counts in TTFT and, through the decodes that ride along, in TPOT. None = the
    cluster's calibrated ``prefill_iteration_overhead_s[engine]`` (0 when it has none)."""
    disagg_handoff_s: float | None = None
    """Disaggregated serving only: time a request's hand-over from its prefill replica to its
    decode replica takes beyond moving the KV bytes (the transfer's control plane: the decode
    side's KV pre-allocation and handshake with the prefill worker, the completion notice, and
    the decode scheduler polling for it). The decode replica sees the request this long after
    its KV transfer ends, so it counts in TTFT and E2E, not in TPOT. None = the cluster's
    calibrated ``disagg_handoff_s[engine]`` (0 when it has none)."""
    precision: str = "bf16"
    """Weight/GEMM precision."""
    kv_dtype: str = "auto"
    """KV-cache element type (``KV_DTYPES``); ``auto`` = the engines' default: the KV-cache
    quantization the ``precision`` checkpoint declares (NVIDIA's ModelOpt NVFP4 exports: fp8),
    else bf16 (``serving._graphs.checkpoint_kv_dtype``)."""
    speculative: SpeculativeConfig | None = None
    disagg: DisaggConfig | None = None
    slo_ttft_s: float | None = None
    """TTFT objective for goodput (None = not constrained)."""
    slo_tpot_s: float | None = None
    """TPOT objective for goodput (None = not constrained)."""

    def __post_init__(self) -> None:
        # Accept the YAML forms directly (``disagg="prefill=2xTP2,decode=1xTP4"``, dicts).
        if isinstance(self.disagg, str):
            object.__setattr__(self, "disagg", parse_disagg(self.disagg))
        elif isinstance(self.disagg, Mapping):
            object.__setattr__(self, "disagg", DisaggConfig.from_dict(self.disagg))
        if isinstance(self.speculative, Mapping):
            object.__setattr__(self, "speculative", SpeculativeConfig.from_dict(self.speculative))
        if not isinstance(self.disagg, (DisaggConfig, type(None))):
            raise ConfigError(f"`disagg` must be 'prefill=NxTPa,decode=MxTPb' or a mapping with "
                              f"prefill and decode pools, but got {self.disagg!r}")
        if not isinstance(self.speculative, (SpeculativeConfig, type(None))):
            raise ConfigError(f"`speculative` must be a mapping of SpeculativeConfig fields "
                              f"(num_draft_tokens, acceptance_rate, method, draft_model), but "
                              f"got {self.speculative!r}")
        object.__setattr__(self, "cuda_graph_sizes", tuple(self.cuda_graph_sizes))
        for name in ("tp", "pp", "ep", "dp", "sp", "max_num_seqs", "max_num_batched_tokens",
                     "block_size", "stream_interval", "scheduler_recv_interval"):
            _positive_int(name, getattr(self, name))
        _choice("scheduler", self.scheduler, SCHEDULERS)
        _choice("prefill_schedule", self.prefill_schedule, PREFILL_SCHEDULES)
        _choice("kv_admission", self.kv_admission, KV_ADMISSIONS)
        _choice("tp_allreduce", self.tp_allreduce, TP_ALLREDUCES)
        _choice("moe_kernel", self.moe_kernel, MOE_KERNELS)
        _choice("engine", self.engine, ENGINES)
        _choice("frontend", self.frontend, FRONTENDS)
        for name in (*FRONTEND_KEYED_TIMES, "prefill_iteration_overhead_s", "disagg_handoff_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v >= 0.0):
                raise ConfigError(f"`{name}` must be >= 0 seconds (or null for the cluster's "
                                  f"calibrated value), but got {v!r}")
        overhead = self.iteration_overhead_s
        if overhead is not None and not (isinstance(overhead, (int, float)) and overhead >= 0.0):
            raise ConfigError("`iteration_overhead_s` must be >= 0 seconds (or null for the "
                              f"cluster's calibrated value), but got {overhead!r}")
        launch = self.kernel_launch_overhead_s
        if not (isinstance(launch, (int, float)) and launch >= 0.0):
            raise ConfigError(f"`kernel_launch_overhead_s` must be >= 0 seconds, but got "
                              f"{launch!r}")
        for name in ("slo_ttft_s", "slo_tpot_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v > 0.0):
                raise ConfigError(f"`{name}` must be > 0 seconds (or null: not constrained), "
                                  f"but got {v!r}")
        if not isinstance(self.cuda_graph_padding, bool):
            raise ConfigError("`cuda_graph_padding` must be true or false, but got "
                              f"{self.cuda_graph_padding!r}")
        for name in ("batch_wait_iters", "batch_wait_tokens", "adp_balance_timeout_iters",
                     "piecewise_graph_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"`{name}` must be an integer >= 0, but got {v!r}")
        if not isinstance(self.max_prefill_tokens, int) or self.max_prefill_tokens < 0:
            raise ConfigError(f"`max_prefill_tokens` must be an integer >= 0, but got "
                              f"{self.max_prefill_tokens!r}")
        _choice("precision", self.precision, PRECISIONS)
        _choice("kv_dtype", self.kv_dtype, KV_DTYPES)
        if self.gpu_memory_utilization is not None and not (
                0.0 < self.gpu_memory_utilization <= 1.0):
            raise ConfigError(
                "`0 < gpu_memory_utilization <= 1` (serve --memory-fraction) must hold (or "
                f"null: the engine's default), but got {self.gpu_memory_utilization}"
            )
        if self.num_kv_blocks < 0:
            raise ConfigError(f"`num_kv_blocks >= 0` must hold, but got {self.num_kv_blocks}")
        sizes = tuple(self.cuda_graph_sizes)
        if any(not isinstance(x, int) or x < 1 for x in sizes) or list(sizes) != sorted(sizes):
            raise ConfigError(
                f"`cuda_graph_sizes` must be increasing positive integers, but got {sizes}"
            )
        if self.dynamic_sp and self.sp == 1:
            raise ConfigError("`dynamic_sp` needs sp > 1, but got sp=1")
        if self.disagg is not None and self.scheduler != "vllm":
            raise ConfigError("`disagg` needs scheduler 'vllm', but got "
                              f"scheduler={self.scheduler!r}")
        if self.disagg is not None and self.sp > 1:
            # The pools' GPUs are their own degrees; an sp over them would speed the prefill
            # pool up on GPUs the report never counts.
            raise ConfigError(f"`sp` (sequence parallelism) applies to a colocated replica, not "
                              f"to `disagg` pools, but got sp={self.sp}: give the prefill pool "
                              "more GPUs (e.g. prefill=1xTP8) instead")
        if self.speculative is not None and self.scheduler == "static":
            raise ConfigError("`speculative` needs a continuous-batching scheduler: the "
                              "'static' baseline decodes one token a step, so its report "
                              "would credit drafts it never verifies")

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.sp

    @property
    def num_gpus(self) -> int:
        if self.disagg is not None:
            d = self.disagg
            return (d.prefill.num_replicas * d.prefill.gpus_per_replica
                    + d.decode.num_replicas * d.decode.gpus_per_replica)
        return self.gpus_per_replica * self.dp

    def replace(self, **changes: Any) -> ServingConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "serving config") -> ServingConfig:
        """Build from a mapping (YAML/JSON); unknown keys raise ``ConfigError``."""
        return cls(**typed_kwargs(cls, data, where))

