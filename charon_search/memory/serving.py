"""Serving memory: weights per GPU, activation workspace, CUDA-graph pool, KV-cache capacity.

Three engines, three meanings of the memory fraction a launch sets (``MEMORY_RULES``):

- ``total`` (vLLM ``gpu_memory_utilization``, ``vllm/worker/worker.py``
  ``determine_num_available_blocks``, V1 ``gpu_worker.py``): the engine may use that share of
  the device; weights, the peak activation of a profile forward pass over
  ``max_batched_tokens`` tokens, the CUDA-graph pool and non-torch memory (CUDA context, NCCL)
  come off the top; the rest holds KV blocks of ``block_size`` tokens.
- ``static`` (SGLang ``mem_fraction_static``, "the fraction of the memory used for static
  allocation (model weights and KV cache memory pool)"; ``ModelRunner.profile_max_num_token``:
  ``rest = free after loading - free before loading x (1 - fraction)``): weights and KV share
  that fraction of the memory free before loading (the device less non-torch memory);
  activations and CUDA graphs live in the rest.
- ``free`` (TensorRT-LLM ``KvCacheConfig.free_gpu_memory_fraction``,
  ``KvCacheCreator._cal_max_tokens``): that share of the memory left free after the weights,
  a profiling forward pass over ``max_batched_tokens`` tokens, the CUDA-graph pool and
  non-torch memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from charon_search.catalog.spec import ModelSpec, is_linear_block
from charon_search.errors import ConfigError
from charon_search.hardware.spec import ClusterSpec
from charon_search.ir.graph import DTYPE_BYTES
from charon_search.ir.ops import DSA_SCALE_BLOCK, DSA_SCALE_BYTES
from charon_search.memory.liveness import ShardingPoint
from charon_search.memory.profile import ModelMemoryProfile, model_profile
from charon_search.memory.report import stage_layers

__all__ = ["MEMORY_RULES", "MEMORY_RULE_KNOBS", "WEIGHT_DTYPE_BYTES", "KvCacheCapacity",
           "dsa_indexer_bytes_per_token", "kv_bytes_per_token", "kv_cache_capacity",
           "moe_tp_degree"]

#: What an engine's memory fraction is a fraction of (module docstring): vLLM's of the whole
#: device, SGLang's of the memory for weights and KV, TensorRT-LLM's of the memory left free.
MEMORY_RULES = ("total", "static", "free")
#: Each rule's knob, as its engine names it.
MEMORY_RULE_KNOBS = {"total": "gpu_memory_utilization", "static": "mem_fraction_static",
                     "free": "free_gpu_memory_fraction"}

#: Bytes per weight of the serving precisions (int4/nvfp4: 4-bit values; scales neglected).
WEIGHT_DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "mxfp8": 1, "int8": 1, "int4": 0.5, "nvfp4": 0.5,
}
#: Largest decode batch vLLM captures a CUDA graph for (``max_capture_size`` default 512).
CUDA_GRAPH_MAX_BATCH = 512
#: Sequences whose last-token logits the profile pass computes (vLLM ``max_num_seqs`` = 256).
MAX_NUM_SEQS = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class KvCacheCapacity:
    """KV-cache capacity of one GPU (the tightest pipeline stage)."""

    weights_bytes: float
    activation_bytes: float
    """Peak activation workspace of a forward over ``max_batched_tokens`` tokens."""
    cuda_graph_pool_bytes: float
    non_torch_bytes: float
    """CUDA context, NCCL buffers (the cluster's calibrated allocator extra and comm buffers)."""
    kv_bytes_per_token: float
    """KV bytes one token takes on this GPU, over the layers of its stage."""
    available_bytes: float
    """Bytes left for KV blocks (0 when the model does not fit)."""
    num_tokens: int
    num_blocks: int
    block_size: int
    device_memory_bytes: float
    gpu_memory_utilization: float
    linear_state_bytes: float = 0.0
    """Bytes reserved on this GPU for linear-attention (Gated DeltaNet) request states."""
    linear_state_slots: int = 0
    """Requests whose linear-attention state fits in ``linear_state_bytes`` (0: no such
    layers)."""

    @property
    def fits(self) -> bool:
        return self.num_blocks > 0

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def kv_bytes_per_token(spec: ModelSpec, *, tp: int, num_layers: int | None = None,
                       kv_dtype: str = "bf16") -> float:
    """KV-cache bytes per token per GPU.

    ``layers`` defaults to the layers that hold a KV cache (``ModelSpec.num_kv_layers``: linear
    attention layers keep a fixed-size state instead, ``linear_state_bytes``).
    GQA/MHA: ``2 * layers * ceil(kv_heads / tp) * head_dim * dtype_bytes`` (K and V; a KV head is
    replicated when ``tp`` exceeds the KV heads). MLA: ``layers * (kv_lora_rank +
    qk_rope_head_dim) * dtype_bytes``, the compressed latent, replicated over TP
    (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1). DeepSeek Sparse Attention (``extra["dsa"]``,
    GLM-5) adds ``dsa_indexer_bytes_per_token`` and, with an fp8 cache, stores the latent in
    FlashMLA's sparse fp8 layout (``dsa_fp8_latent_bytes``).
    """
    _check_kv_dtype(kv_dtype)
    _check_degree("tp", tp)
    if num_layers is not None and (isinstance(num_layers, bool) or not isinstance(num_layers, int)
                                   or num_layers < 0):
        raise ConfigError(f"`num_layers` must be None or an integer >= 0, but got "
                          f"{num_layers!r}")
    layers = spec.num_kv_layers if num_layers is None else num_layers
    nbytes = DTYPE_BYTES[kv_dtype]
    if spec.attention == "mla":
        cfg = spec.hf_config
        rank = int(cfg.get("kv_lora_rank") or spec.extra.get("kv_lora_rank") or 0)
        rope = int(cfg.get("qk_rope_head_dim") or spec.extra.get("qk_rope_head_dim") or 0)
        if rank <= 0:
            raise ConfigError(f"MLA model {spec.name} needs `kv_lora_rank` in its config")
        if spec.extra.get("dsa"):
            latent = dsa_fp8_latent_bytes(rank, rope) if nbytes == 1 else (rank + rope) * nbytes
            return layers * latent + dsa_indexer_bytes_per_token(spec, num_layers=layers)
        return layers * (rank + rope) * nbytes
    heads = math.ceil(spec.num_key_value_heads / tp)
    return 2 * layers * heads * spec.head_dim * nbytes




def _kv_dtypes() -> tuple[str, ...]:
    """The KV-cache element types a cache can hold (``serving.config.KV_DTYPES`` less ``auto``,
    which the serving simulator resolves first; imported here, not at module level:
    ``charon_search.serving`` imports this module)."""
    from charon_search.serving.config import KV_DTYPES

    return tuple(d for d in KV_DTYPES if d != "auto")


def _check_kv_dtype(kv_dtype: object) -> None:
    allowed = _kv_dtypes()
    if kv_dtype not in allowed or kv_dtype not in DTYPE_BYTES:
        hint = (" (resolve a ServingConfig's 'auto' first: serving.resolve_kv_dtype)"
                if kv_dtype == "auto" else "")
        raise ConfigError(f"`kv_dtype` must be one of {list(allowed)}, but got {kv_dtype!r}"
                          + hint)


def _check_degree(name: str, v: object) -> None:
    """The serving configs' positive-integer check (``serving.config._positive_int``, imported
    here for the same reason as ``_kv_dtypes``)."""
    from charon_search.serving.config import _positive_int

    _positive_int(name, v)


def _check_ep(spec: ModelSpec, ep: int) -> None:
    """``ep`` shards the routed experts: a MoE model, and it divides their count."""
    if ep > 1 and not spec.is_moe:
        raise ConfigError(f"`ep > 1` needs a MoE model, but {spec.name} is dense (ep={ep}); "
                          f"allowed: ep=1")
    if spec.is_moe and spec.num_experts % ep:
        divisors = [d for d in range(1, spec.num_experts + 1) if spec.num_experts % d == 0]
        raise ConfigError(f"`ep` must divide num_experts, but got (ep={ep}, "
                          f"num_experts={spec.num_experts}); allowed: {divisors}")


def dsa_fp8_latent_bytes(rank: int, rope: int) -> int:
    """Bytes per token and layer of an fp8 MLA latent in FlashMLA's sparse-attention layout (the
    format SGLang's DSA backend stores with ``--kv-cache-dtype fp8_e4m3``): ``rank`` fp8 values,
    one fp32 scale per 128 of them and the ``rope`` RoPE values in bf16 (FlashMLA, "A Deep Dive
    Into The Flash MLA FP8 Decoding Kernel on Hopper": 656 bytes for 512 + 64)."""
    return rank + rank // DSA_SCALE_BLOCK * DSA_SCALE_BYTES + rope * 2


def dsa_indexer_bytes_per_token(spec: ModelSpec, *, num_layers: int | None = None) -> float:
    """Indexer key-cache bytes per token on one GPU of a DeepSeek Sparse Attention model (0
    otherwise): ``indexer layers x (d + d / 128 x 4)`` (132 B per layer for d = 128), every TP
    rank holding all of it (the indexer is replicated). ``num_layers`` (a pipeline stage's
    layers) takes their share of the model's indexer layers."""
    dsa = spec.extra.get("dsa")
    if not dsa:
        return 0.0
    d = int(dsa["index_head_dim"])
    layers = dsa["indexer_layers"] if num_layers is None else (
        num_layers * dsa["indexer_layers"] / spec.num_layers)
    return layers * (d + d // DSA_SCALE_BLOCK * DSA_SCALE_BYTES)


def linear_state_bytes_per_request(spec: ModelSpec, *, tp: int,
                                   num_layers: int | None = None) -> float:
    """Bytes one request's linear-attention state takes on one GPU (0 without such layers).

    Per Gated DeltaNet layer: the recurrent state, ``ceil(v_heads / tp) x d_k x d_v`` in fp32
    (SGLang and vLLM keep it in float32 by default: ``--mamba-ssm-dtype``), and the causal
    convolution's last ``kernel - 1`` inputs of its ``(2 k_heads d_k + v_heads d_v) / tp``
    channels in bf16. ``num_layers`` defaults to the model's linear-attention layers."""
    la = spec.extra.get("linear_attention")
    if not la:
        return 0.0
    layers = (sum(1 for t in spec.layer_types if is_linear_block(t)) if num_layers is None
              else num_layers)
    state = math.ceil(la["v_heads"] / tp) * la["k_head_dim"] * la["v_head_dim"] * 4
    channels = (2 * la["k_heads"] * la["k_head_dim"] + la["v_heads"] * la["v_head_dim"]) / tp
    return layers * (state + channels * (la["conv_kernel"] - 1) * 2)


def moe_tp_degree(tp: int, ep: int) -> int:
    """Ranks each routed expert is split over in a replica of ``tp`` GPUs (attention TP or
    attention-DP ranks) with expert-parallel degree ``ep``: the ``tp / ep`` ranks expert
    parallelism leaves (vLLM ``FusedMoEParallelConfig``: MoE TP = DP x TP / EP; TRT-LLM
    ``moe_tp_size x moe_ep_size = tp_size``; SGLang ``moe_tp = tp / ep``); 1 when ``ep`` does
    not divide ``tp`` or covers it."""
    return 1 if ep >= tp or tp % ep else tp // ep


def kv_cache_capacity(model: ModelSpec | str, cluster: ClusterSpec | str, *, tp: int,
                      pp: int = 1, ep: int = 1, gpu_memory_utilization: float = 0.9,
                      max_batched_tokens: int = 8192, block_size: int = 16,
                      kv_dtype: str = "bf16", weight_dtype: str = "bf16",
                      cuda_graph_pool_bytes: float | None = None,
                      activation_bytes: float | None = None,
                      profile: ModelMemoryProfile | None = None,
                      linear_state_ratio: float = 0.0,
                      linear_state_requests: int = 0,
                      moe_tp: int | None = None,
                      quantized_roles: frozenset[str] | None = None,
                      quantized_weight_bytes: float = 0.0,
                      memory_rule: str = "total",
                      extra_weights_bytes: float = 0.0,
                      extra_kv_bytes_per_token: float = 0.0,
                      mtp_layers: int = 0) -> KvCacheCapacity:
    """How many KV tokens/blocks fit on each GPU of a serving replica.

    Args:
        model: ``ModelSpec`` or catalog name.
        cluster: ``ClusterSpec`` or name (device capacity, non-torch calibration).
        tp, pp, ep: Parallel degrees of one replica; routed experts divide by ``ep x moe_tp``.
        moe_tp: Ranks each expert is split over; None = ``moe_tp_degree(tp, ep)`` (the
            ``tp / ep`` ranks expert parallelism leaves). Attention-DP replicas pass ``tp=1``
            (attention and dense layers whole on each rank) and their ``moe_tp``.
        gpu_memory_utilization: The launch's memory fraction, in (0, 1], read under
            ``memory_rule``.
        max_batched_tokens: Tokens of the largest forward pass (chunked-prefill budget).
        block_size: Tokens per KV block.
        kv_dtype, weight_dtype: Storage dtypes.
        cuda_graph_pool_bytes: CUDA-graph memory pool; ``None`` estimates it as the activation
            peak of a decode step at the largest captured batch (graphs share one pool).
        activation_bytes: Override of the activation workspace (else liveness of the traced
            prefill blocks).
        profile: A precomputed ``prefill`` profile (else traced and cached).
        linear_state_ratio: Models with linear-attention layers: linear-state memory over KV
            memory (SGLang ``--mamba-full-memory-ratio``, 0.9 by default): the memory left
            after weights and workspaces is split in that ratio.
        linear_state_requests: Without a ratio, room for this many requests' linear states
            (one per running request, as vLLM allocates them) is reserved first.
        quantized_roles: The GEMM roles a quantized checkpoint stores at ``weight_dtype``
            (``serving._graphs.checkpoint_quant``); every other weight (embedding, LM head,
            norms, router, and e.g. the attention a checkpoint keeps bf16) is held in bf16.
            None: every weight at ``weight_dtype``.
        quantized_weight_bytes: Bytes per quantized weight with its scales (MXFP4 0.53125,
            NVFP4 0.5625); 0 = ``weight_dtype``'s bare element size.
        memory_rule: ``total`` (vLLM), ``static`` (SGLang) or ``free`` (TensorRT-LLM): what
            ``gpu_memory_utilization`` is a fraction of (module docstring). Under ``static`` the
            activation and CUDA-graph bytes are reported but held outside the fraction.
        extra_weights_bytes, extra_kv_bytes_per_token: per GPU, what another model sharing the
            GPUs adds (a speculative draft model's weights, and its KV beside each token's).
        mtp_layers: Multi-token-prediction layers served for speculative decoding, on the last
            pipeline stage: each is a decoder layer of the last layer's block type (its weights
            and KV; DeepSeek-V3's MoE layer, 11.51 B parameters) plus its ``2h x h`` input
            projection in bf16 (``eh_proj``); they share the target's embedding and LM head.
    """
    from charon_search.memory.report import _resolve

    spec, cl = _resolve(model, cluster)
    for name, v in (("tp", tp), ("pp", pp), ("ep", ep), ("block_size", block_size),
                    ("max_batched_tokens", max_batched_tokens)):
        _check_degree(name, v)
    _check_kv_dtype(kv_dtype)
    _check_ep(spec, ep)
    if not isinstance(mtp_layers, int) or mtp_layers < 0:
        raise ConfigError(f"`mtp_layers` must be a non-negative integer, but got {mtp_layers!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError("`0 < gpu_memory_utilization <= 1` must hold, but got "
                          f"{gpu_memory_utilization}")
    if memory_rule not in MEMORY_RULES:
        raise ConfigError(f"`memory_rule` must be one of {list(MEMORY_RULES)}, but got "
                          f"{memory_rule!r}")
    if weight_dtype not in WEIGHT_DTYPE_BYTES:
        raise ConfigError(f"`weight_dtype` must be one of {sorted(WEIGHT_DTYPE_BYTES)}, "
                          f"but got {weight_dtype!r}")
    if spec.num_attention_heads % tp:
        raise ConfigError(f"`tp` must divide num_attention_heads, but got "
                          f"(tp={tp}, num_attention_heads={spec.num_attention_heads})")
    if pp > spec.num_layers:
        raise ConfigError(f"`pp <= num_layers` must hold, but got ({pp=}, "
                          f"num_layers={spec.num_layers})")
    prof = profile or (None if activation_bytes is not None and cuda_graph_pool_bytes is not None
                       else model_profile(spec, phase="prefill", attn_impl="sdpa"))
    layer_types = spec.layer_types or ("dense",) * spec.num_layers
    stages = stage_layers(layer_types, pp)
    wbytes = WEIGHT_DTYPE_BYTES[weight_dtype]
    expert_tp = moe_tp_degree(tp, ep) if moe_tp is None else moe_tp
    if expert_tp < 1:
        raise ConfigError(f"`moe_tp` must be a positive integer, but got {moe_tp!r}")
    cal = cl.calibration
    # NCCL's buffers wherever the rank talks to others: TP, PP, and expert parallelism (an
    # attention-DP rank runs its attention with tp = 1 but its MoE over the EP group).
    talks = tp > 1 or pp > 1 or ep > 1 or expert_tp > 1
    non_torch = cal.allocator_reserved_extra_bytes + cal.comm_buffer_bytes * talks
    best: KvCacheCapacity | None = None
    for i, layers in enumerate(stages):
        if i == pp - 1 and mtp_layers:
            layers = list(layers) + [layer_types[-1]] * mtp_layers
        names = list(layers) + (["embedding"] if i == 0 else []) + (
            ["lm_head"] if i == pp - 1 else [])
        weights = extra_weights_bytes
        if i == pp - 1:
            weights += mtp_layers * 2 * spec.hidden_size ** 2 * WEIGHT_DTYPE_BYTES["bf16"]
        for name in names:
            groups = _param_groups(prof, spec, name)
            if quantized_roles is not None and groups.by_role:
                for role, r_tp, r_rep, r_expert in groups.by_role:
                    per = ((quantized_weight_bytes or wbytes) if role in quantized_roles
                           else WEIGHT_DTYPE_BYTES["bf16"])
                    weights += (r_tp / tp + r_rep + r_expert / (ep * expert_tp)) * per
                continue
            dense = groups.tp / tp + groups.rep
            weights += (dense + groups.expert / (ep * expert_tp)) * wbytes
        act = activation_bytes if activation_bytes is not None else _forward_peak(
            prof, names, tokens=max_batched_tokens, tp=tp)
        graphs = cuda_graph_pool_bytes if cuda_graph_pool_bytes is not None else _forward_peak(
            prof, names, tokens=min(CUDA_GRAPH_MAX_BATCH, max_batched_tokens), tp=tp, decode=True)
        kv_layers = sum(1 for t in layers if not is_linear_block(t))
        per_token = kv_bytes_per_token(spec, tp=tp, num_layers=kv_layers, kv_dtype=kv_dtype)
        if per_token > 0:
            per_token += extra_kv_bytes_per_token
        if memory_rule == "static":
            avail = max(0.0, gpu_memory_utilization * (cl.gpu.hbm_capacity_bytes - non_torch)
                        - weights)
        elif memory_rule == "free":
            avail = max(0.0, gpu_memory_utilization * (cl.gpu.hbm_capacity_bytes - weights - act
                                                       - graphs - non_torch))
        else:
            avail = max(0.0, gpu_memory_utilization * cl.gpu.hbm_capacity_bytes - weights - act
                        - graphs - non_torch)
        per_state = linear_state_bytes_per_request(
            spec, tp=tp, num_layers=sum(1 for t in layers if is_linear_block(t)))
        states = 0.0
        if per_state > 0:
            states = (avail * linear_state_ratio / (1.0 + linear_state_ratio)
                      if linear_state_ratio > 0 else min(avail, linear_state_requests * per_state))
            avail -= states
        tokens = int(avail // per_token) if per_token > 0 else 0
        blocks = tokens // block_size
        cap = KvCacheCapacity(
            weights_bytes=weights, activation_bytes=act, cuda_graph_pool_bytes=graphs,
            non_torch_bytes=non_torch, kv_bytes_per_token=per_token, available_bytes=avail,
            num_tokens=blocks * block_size, num_blocks=blocks, block_size=block_size,
            device_memory_bytes=cl.gpu.hbm_capacity_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            linear_state_bytes=states,
            linear_state_slots=int(states // per_state) if per_state > 0 else 0,
        )
        if best is None or cap.num_blocks < best.num_blocks:
            best = cap
    assert best is not None
    return best


def _param_groups(prof: ModelMemoryProfile | None, spec: ModelSpec, name: str) -> Any:
    from charon_search.memory.static import analytic_param_groups

    if prof is not None and name in prof.params:
        return prof.params[name]
    return analytic_param_groups(spec, name)


def _forward_peak(prof: ModelMemoryProfile | None, names: list[str], *, tokens: int, tp: int,
                  decode: bool = False) -> float:
    """Largest live forward bytes of one block over ``tokens`` tokens (blocks run one at a time;
    the activations of one block are freed before the next runs)."""
    if prof is None:
        return 0.0
    # Prefill: one sequence of `tokens`; decode: `tokens` sequences of one token each, attending
    # to a short context (the KV cache itself is not activation memory).
    point = (ShardingPoint(b=tokens, s=1, c=1, tp=tp) if decode
             else ShardingPoint(b=1, s=tokens, c=tokens, tp=tp))
    # Logits are computed for the last token of each sequence only.
    seqs = min(tokens, MAX_NUM_SEQS)
    peak = 0.0
    for name in names:
        blk = prof.blocks.get(name)
        if blk is not None:
            at = ShardingPoint(b=seqs, s=1, c=1, tp=tp) if name == "lm_head" else point
            peak = max(peak, blk.evaluate(at)["fwd_peak"])
    return peak
