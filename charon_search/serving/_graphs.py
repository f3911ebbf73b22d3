"""Traced and parallelized inference graphs of one serving replica (cached per configuration).

``frontend.trace_model(spec, phase="prefill"|"decode")`` traces each block once;
``passes.parallelize_inference`` shards it over TP/EP and inserts the collectives. FP8/FP4
serving runs the GEMMs the checkpoint quantizes at that precision (``checkpoint_quant``: the
catalog's ``_charon_checkpoints`` entry, a copy of the checkpoint's HF ``quantization_config``);
routed-expert grouped GEMMs carry the MoE kernel format and the engine whose kernels run it
(tags ``moe_dtype:<fmt>``, ``moe_engine:<engine>``), which the cost model prices from measured
quantized MoE rows of that engine (``cost.selector``). A launch that picks another kernel for a
4-bit checkpoint (``moe_kernel``: Marlin) tags the rows of that kernel instead
(``MOE_KERNEL_ROWS``).
Routed experts are tensor-parallel over the ``tp / ep`` ranks that expert parallelism leaves
(``moe_tp_degree``: vLLM ``FusedMoE``, TRT-LLM ``moe_tp_size``). DP-attention (MoE) keeps
attention and dense layers whole on each rank (``tp = 1`` for them); its experts are sharded
over ``ep`` and, when ``ep < tp``, split ``tp / ep`` ways behind an all-gather and a
reduce-scatter of the DP ranks' tokens (``_fusion.gather_experts_tp``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from charon_search.catalog import config_hash
from charon_search.cost.predictor import MOE_WEIGHT_BYTES, ROOFLINE_COMPUTE_DTYPE
from charon_search.cost.selector import FP8_MOE_METHOD_TAG, GEMM_ROWS_TAG
from charon_search.errors import ConfigError
from charon_search.ir.graph import DTYPE_BYTES
from charon_search.ir.ops import OpKind, Role
from charon_search.ir.symbolic import Poly
from charon_search.memory.serving import moe_tp_degree

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec
    from charon_search.ir.graph import Node, OpGraph

__all__ = ["MOE_ENGINES", "CheckpointQuant", "checkpoint_quant", "moe_tp_degree",
           "serving_graphs"]

Graphs = tuple[dict[str, "OpGraph"], dict[str, "OpGraph"]]
_CACHE: dict[tuple, Graphs] = {}


def serving_graphs(model: ModelSpec, *, tp: int, pp: int, ep: int, dp_attention: bool,
                   precision: str, fused_kernels: bool = True, engine: str = "",
                   moe_kernel: str = "") -> Graphs:
    """``(prefill, decode)``: block name -> one GPU's forward graph of that block.

    Blocks are per layer; the caller multiplies by layers (all stages alike, ``pp`` only adds
    the stage hand-offs). ``fused_kernels`` applies the inference kernel fusion of
    ``serving._fusion`` (fused QKV / gate_up GEMMs, fused add+RMSNorm, fused MoE routing).
    ``engine`` (``vllm``/``sglang``/``trtllm``) names whose quantized MoE kernels run; any
    other value (engine unknown) means vLLM's (``MOE_ENGINES``). ``moe_kernel`` (a
    ``MOE_KERNEL_ROWS`` key, "" = the engine's default) overrides the kernel of 4-bit experts.
    """
    moe_engine = engine if engine in MOE_ENGINES else MOE_ENGINES[0]
    key = (_model_key(model), tp, ep, dp_attention, precision, fused_kernels, moe_engine,
           moe_kernel)
    hit = _CACHE.get(key)
    if hit is None:
        hit = _build(model, tp=tp, ep=ep, dp_attention=dp_attention, precision=precision,
                     fused_kernels=fused_kernels, engine=moe_engine, moe_kernel=moe_kernel)
        _CACHE[key] = hit
    return hit


def _model_key(model: ModelSpec) -> tuple:
    """What of ``model`` its serving graphs depend on: the HF config's content (the trace
    cache's ``config_hash``, which leaves out the private ``_charon_*`` keys), the shipped
    checkpoints' quantization (``_charon_checkpoints``, read by ``checkpoint_quant``) and the
    spec fields ``_build`` reads. Not the name alone: a config edited at the same path, or two
    HF modules of one class, share a name but not their graphs."""
    checkpoints = json.dumps(model.hf_config.get("_charon_checkpoints") or {}, sort_keys=True,
                             default=str)
    return (model.name, config_hash(model.hf_config),
            hashlib.sha256(checkpoints.encode()).hexdigest()[:16], model.num_layers,
            model.hidden_size, model.num_key_value_heads, model.layer_types)


def _build(model: ModelSpec, *, tp: int, ep: int, dp_attention: bool, precision: str,
           fused_kernels: bool, engine: str, moe_kernel: str = "") -> Graphs:
    from charon_search.frontend import trace_model
    from charon_search.passes import parallelize_inference
    from charon_search.serving._fusion import (
        fuse_for_inference,
        fuse_shared_experts,
        gather_experts_tp,
        shard_experts_tp,
    )

    quant = checkpoint_quant(model, precision) if precision in _PRECISION_BYTES else None
    dispatch = _dispatch_bytes(quant, engine=engine, ep=ep, dp_attention=dp_attention)
    out = []
    for phase in ("prefill", "decode"):
        traced = trace_model(model, phase=phase)
        graphs = dict(parallelize_inference(traced, tp=1 if dp_attention else tp, ep=ep,
                                            ep_dispatch_bytes=dispatch))
        # Rows an expert-parallel rank computes: the tokens of the ranks that dispatch to it
        # (tp attention-DP ranks, or one replicated TP batch) times top-k, spread over ep.
        share = ep / (tp if dp_attention else 1)
        if share > 1:
            graphs = {k: _expert_rows_per_rank(g, share) for k, g in graphs.items()}
        if quant is not None:
            rows_engine = _moe_rows_engine(engine, quant, ep, dp_attention)
            graphs = {k: _with_gemm_dtype(g, quant, rows_engine, ep, moe_kernel,
                                          dense_engine=engine)
                      for k, g in graphs.items()}
        moe_tp = moe_tp_degree(tp, ep)
        if moe_tp > 1 and dp_attention:
            graphs = {k: gather_experts_tp(g, tp, moe_tp) for k, g in graphs.items()}
        elif moe_tp > 1:
            graphs = {k: shard_experts_tp(g, moe_tp) for k, g in graphs.items()}
        if fused_kernels:
            attn_tp = 1 if dp_attention else tp
            kv_heads = max(1, model.num_key_value_heads // attn_tp)
            graphs = {k: fuse_for_inference(g, kv_heads=kv_heads) for k, g in graphs.items()}
            shared = _sglang_fused_shared_experts(model, engine, ep)
            if shared:
                graphs = {k: fuse_shared_experts(g, shared) for k, g in graphs.items()}
        out.append(graphs)
    return out[0], out[1]


def _dispatch_bytes(quant: CheckpointQuant | None, *, engine: str, ep: int,
                    dp_attention: bool) -> float:
    """Bytes per value of the expert-parallel dispatches (0: the activation's bf16).

    TensorRT-LLM quantizes an NVFP4 MoE's input before its expert-parallel all-to-all: with
    attention DP and EP, ``CutlassFusedMoE`` / ``WideEPMoE`` set ``use_postquant_alltoall``
    (``TRTLLM_MOE_POST_QUANT_ALLTOALLV``, default "1", and an NVFP4 quant mode), so each
    dispatch carries 4-bit values with their FP8 scales (the format's 0.5625 bytes a value)
    instead of bf16 ones. The combine stays bf16 (``use_low_precision_combine`` defaults off)."""
    if (quant is not None and engine == "trtllm" and dp_attention and ep > 1
            and quant.moe_dtype == "nvfp4"):
        return quant.weight_bytes
    return 0.0


def _sglang_fused_shared_experts(model: ModelSpec, engine: str, ep: int) -> int:
    """Shared experts SGLang runs inside the routed fused-MoE kernel (0: none).

    SGLang ``determine_num_fused_shared_experts`` (``models/deepseek_v2.py``, 0.4.7+, on by
    default: ``--disable-shared-experts-fusion`` turns it off): a config with 256 routed and 1
    shared expert (DeepSeek-V3/R1), an NVIDIA GPU of compute capability >= 8.0 (every GPU we
    ship), experts not expert-parallel (MoE EP size 1)."""
    cfg = model.hf_config
    if (engine != "sglang" or ep != 1 or cfg.get("n_routed_experts") != 256
            or cfg.get("n_shared_experts") != 1):
        return 0
    return 1


def _expert_rows_per_rank(graph: OpGraph, share: float) -> OpGraph:
    """Routed-expert grouped GEMMs of one expert-parallel rank compute ``1 / share`` of the
    dispatched token rows (balanced routing): ``parallelize_inference`` keeps every token's
    rows on each rank (FLOPs and the ``tokens`` shape parameter), ``share`` times too many
    for an inference engine's EP rank. Weight bytes (its local experts) are unchanged."""
    return graph.with_nodes(
        n.replace(flops=n.flops / share,
                  params={**n.params, "tokens": n.params["tokens"] / share},
                  tags=n.tags | {"ep_rows"})
        if n.kind == OpKind.GROUPED_GEMM and _str_role(n) == Role.MOE_EXPERT.value
        and "tokens" in n.params else n
        for n in graph.nodes)


def _str_role(n: object) -> str:
    role = getattr(n, "role", "")
    return str(getattr(role, "value", role))


#: Bytes per element of the serving GEMM precisions (weights and activations, W8A8 / W4A16).
_PRECISION_BYTES = {"fp8": 1.0, "fp4": 0.5, "int4": 0.5}

#: Engines with measured quantized MoE kernels in the profile DB (``moe_ffn_skew.<engine>``);
#: the first is the one assumed when a configuration does not name its engine (vLLM: the
#: engine of the DB's bf16 MoE rows and of aiconfigurator's default data slot).
MOE_ENGINES = ("vllm", "sglang", "trtllm")

#: GEMM roles a quantized checkpoint may hold at its precision. The router gate is absent: vLLM
#: builds it unquantized in ``DeepseekV2MoE`` and ``MixtralMoE`` (``quant_config=None``), gpt-oss's
#: router is a plain bf16 ``nn.Linear``, and the fp8/mxfp4 checkpoints that could quantize it
#: list it in ``modules_to_not_convert`` (Qwen3-FP8 ``mlp.gate``, MiniMax-M2.5 ``gate``). The LM
#: head is bf16 in every fp8/fp4 checkpoint we know.
_QUANTIZABLE_ROLES = frozenset({Role.ATTN_QKV.value, Role.ATTN_OUT.value, Role.MLP_IN.value,
                                Role.MLP_OUT.value, Role.MOE_EXPERT.value,
                                Role.MOE_SHARED.value})
#: A module name of each quantizable role in the HF layout, to test compressed-tensors ``ignore``
#: entries written as regular expressions (``re:<pattern>``, matched against whole names).
_ROLE_MODULES = {
    Role.ATTN_QKV.value: "model.layers.1.self_attn.q_proj",
    Role.ATTN_OUT.value: "model.layers.1.self_attn.o_proj",
    Role.MLP_IN.value: "model.layers.0.mlp.gate_proj",
    Role.MLP_OUT.value: "model.layers.0.mlp.down_proj",
    Role.MOE_EXPERT.value: "model.layers.1.mlp.experts.0.gate_proj",
    Role.MOE_SHARED.value: "model.layers.1.mlp.shared_experts.gate_proj",
}
#: HF module-name patterns of ``modules_to_not_convert`` -> the roles they keep in bf16. Each
#: names a GEMM module (or the block holding it) at the end of the entry, so the norms, the
#: sparse-attention indexer (GLM-5: ``self_attn.indexers_proj``, ``self_attn.indexer.k_norm``)
#: and the shared expert's one-output gate (Qwen3.5: ``mlp.shared_expert_gate``) that
#: checkpoints also list keep their block's projections quantized. Gated DeltaNet projections
#: (``linear_attn``) carry the attention roles, so excluding them excludes softmax attention's
#: too (NVIDIA's Qwen3.5 NVFP4 checkpoint excludes both).
_MODULE_ROLES: tuple[tuple[str, frozenset[str]], ...] = (
    (r"(self_attn|linear_attn)$", frozenset({Role.ATTN_QKV.value, Role.ATTN_OUT.value})),
    (r"self_attn\.(q|k|v|qkv|q_a|q_b|kv_a|kv_b)_proj(_with_mqa)?$",
     frozenset({Role.ATTN_QKV.value})),
    (r"self_attn\.o_proj$", frozenset({Role.ATTN_OUT.value})),
    (r"shared_experts?(\.(gate_up|gate|up|down)_proj)?$", frozenset({Role.MOE_SHARED.value})),
    (r"mlp\.(gate_up|gate|up|down)_proj$", frozenset({Role.MLP_IN.value, Role.MLP_OUT.value})),
    (r"(^|\.)experts(\.|$)", frozenset({Role.MOE_EXPERT.value})),  # not ``shared_experts``
)
#: MoE kernel format (aiconfigurator ``moe_dtype``: DB dtype of ``moe_ffn_skew.<engine>`` rows)
#: of a checkpoint quantization. MXFP4 (gpt-oss): Hopper has no FP4 tensor cores, so vLLM (OAI
#: Triton ``matmul_ogs``), TensorRT-LLM and SGLang run the experts as W4A16, dequantizing the
#: 4-bit weights to bf16 inside the kernel; fp8 with ``weight_block_size`` [128, 128]
#: (DeepSeek-V3/R1, Qwen3-FP8) is the block-scaled family, plain fp8 the per-tensor one.
#: NVFP4 (NVIDIA's ModelOpt checkpoints) runs each engine's measured NVFP4 MoE kernel on
#: Blackwell (FlashInfer's TRT-LLM-gen kernels for vLLM and SGLang, TensorRT-LLM's own
#: TRT-LLM-gen rows: ``scripts/import_peers.py`` ``PREFERRED_MOE_KERNEL``); GPUs without NVFP4
#: rows (Hopper) fall back to the bf16 MoE model at the format's bytes per weight.
_MOE_FORMAT = {"mxfp4": "w4a16_mxfp4", "fp8_block": "fp8_block", "fp8": "fp8",
               "int4_wo": "int4_wo", "nvfp4": "nvfp4"}
#: Stored bytes per weight of each checkpoint format, scales included: those of its MoE kernel
#: format (``cost.predictor.MOE_WEIGHT_BYTES``: fp8 1, MXFP4 4 bits + one E8M0 scale byte per
#: 32, int4 weight-only 4 bits + one bf16 scale per group of 128; ``checkpoint_quant`` takes the
#: group size from the checkpoint's config), NVFP4 4 bits + one FP8 E4M3 scale per 16.
_FORMAT_WEIGHT_BYTES = {method: MOE_WEIGHT_BYTES[fmt] for method, fmt in _MOE_FORMAT.items()
                        if fmt in MOE_WEIGHT_BYTES}
#: ``ServingConfig.moe_kernel`` -> (formats it runs, (engine, DB dtype) of its measured rows).
#: ``marlin``: the Marlin MoE kernel (``fused_marlin_moe``: 4-bit weights, MXFP4 or int4,
#: dequantized to bf16 in the kernel), one kernel whichever engine launches it; its rows pool
#: the vLLM and SGLang tables (profile variant ``moe_ffn_skew.marlin``, dtype ``w4a16_marlin``,
#: ``scripts/import_peers.py``).
#: ``mxfp8``: MXFP4 experts run with MXFP8 activations (W4A8) on Blackwell's FP4/FP8 tensor
#: cores, the engine's own ``w4a8_mxfp4_mxfp8`` rows (engine ``""`` = the configuration's).
#: ``triton``: vLLM's Triton fused MoE for fp8 and block-fp8 experts, at the checkpoint's own
#: format (DB dtype ``""``): profile variant ``moe_ffn_skew.vllm_triton``, which on Blackwell
#: differs from vLLM's default rows (FlashInfer's TRT-LLM MoE; ``scripts/import_peers.py``).
MOE_KERNEL_ROWS: dict[str, tuple[frozenset[str], tuple[str, str]]] = {
    "marlin": (frozenset({"w4a16_mxfp4", "int4_wo"}), ("marlin", "w4a16_marlin")),
    "mxfp8": (frozenset({"w4a16_mxfp4"}), ("", "w4a8_mxfp4_mxfp8")),
    "triton": (frozenset({"fp8", "fp8_block"}), ("vllm_triton", "")),
}


#: Expert formats of SGLang's wide-EP DeepEP decode rows (``moe_ffn_skew.sglang_deepep``).
SGLANG_DEEPEP_FORMATS = frozenset({"fp8_block"})


def _moe_rows_engine(engine: str, quant: CheckpointQuant, ep: int, dp_attention: bool) -> str:
    """Whose measured MoE rows price the routed experts: SGLang with attention DP and expert
    parallelism runs wide EP, DeepEP's low-latency dispatch into DeepGEMM's masked grouped GEMM
    for decode batches (SGLang's large-scale EP deployment of DeepSeek, ``--moe-a2a-backend
    deepep``; aiconfigurator prices such workers with its ``wideep`` tables), where its rows
    cover the format (``cost.selector`` takes them for batches of at most
    ``DEEPEP_LL_MAX_TOKENS`` tokens per rank; larger ones run DeepEP's normal mode); the
    engine's own rows otherwise."""
    if (engine == "sglang" and dp_attention and ep > 1
            and quant.moe_dtype in SGLANG_DEEPEP_FORMATS):
        return "sglang_deepep"
    return engine


@dataclass(frozen=True, kw_only=True)
class CheckpointQuant:
    """Which GEMMs a quantized checkpoint stores at ``precision`` and its MoE kernel format."""

    precision: str
    """``fp8`` or ``fp4`` (``ServingConfig.precision``)."""
    quantized_roles: frozenset[str]
    """GEMM roles at ``precision``; the others stay bf16."""
    moe_dtype: str = ""
    """Kernel format of the routed experts (``_MOE_FORMAT`` value); "" = none known."""
    block_fp8: bool = False
    """The quantized GEMMs hold 128x128 block-scaled fp8 weights (``weight_block_size``), which
    engines run with block-scaled kernels (``BLOCK_FP8_GEMM_ROWS``), not per-tensor fp8 ones."""
    weight_bytes: float = 0.0
    """Stored bytes per quantized weight with its scales (``_FORMAT_WEIGHT_BYTES``); 0 = the
    precision's bare element size (no checkpoint known)."""
    compute_dtype: str = ""
    """Dtype the quantized GEMMs compute in, i.e. of the activations they read
    (``cost.predictor.ROOFLINE_COMPUTE_DTYPE`` of the format): bf16 for weight-only W4A16
    checkpoints (MXFP4, int4 compressed-tensors), whose kernels dequantize the 4-bit weights
    and run bf16 MMAs on bf16 activations; "" = ``precision`` (W8A8 / W4A4)."""
    modelopt: bool = False
    """A TensorRT Model Optimizer export (``quant_method: modelopt``), which vLLM runs with its
    ModelOpt methods rather than ``Fp8MoEMethod``."""
    source: str = ""


def checkpoint_quant(model: ModelSpec, precision: str) -> CheckpointQuant:
    """The quantization of ``model``'s ``precision`` checkpoint.

    From the catalog entry's ``_charon_checkpoints[precision]`` (the checkpoint's HF id, its
    ``quantization_config`` and a source line) when present; otherwise every quantizable GEMM
    at ``precision`` with per-tensor ``fp8`` experts for fp8 and no known expert format for fp4.

    Raises:
        ConfigError: a shipped checkpoint entry with an unknown ``quant_method``.
    """
    shipped: Mapping[str, Any] = dict(model.hf_config.get("_charon_checkpoints") or {})
    entry: Mapping[str, Any] = shipped.get(precision) or {}
    qc: Mapping[str, Any] = entry.get("quantization_config") or {}
    if not qc:
        if precision == "int4":
            raise ConfigError(f"`precision` 'int4' (W4A16) needs a catalog checkpoint that says "
                              f"which GEMMs are 4-bit; {model.name} ships "
                              f"{sorted(shipped) or 'none'}")
        return CheckpointQuant(precision=precision, quantized_roles=_QUANTIZABLE_ROLES,
                               moe_dtype="fp8" if precision == "fp8" else "")
    method = str(qc.get("quant_method", ""))
    if method == "fp8" and qc.get("weight_block_size"):
        method = "fp8_block"
    if method == "compressed-tensors":
        method = _compressed_tensors_format(qc, f"model {model.name}: _charon_checkpoints."
                                                f"{precision}.quantization_config")
    if method == "modelopt":
        method = _modelopt_format(qc, f"model {model.name}: _charon_checkpoints.{precision}."
                                      f"quantization_config")
    if method not in _MOE_FORMAT:
        raise ConfigError(f"model {model.name}: _charon_checkpoints.{precision}.quant_method "
                          f"must be one of ['compressed-tensors', 'fp8', 'modelopt', 'mxfp4'], "
                          f"but got {qc.get('quant_method')!r}")
    keep: frozenset[str] = frozenset()
    for module in (*(qc.get("modules_to_not_convert") or ()), *(qc.get("ignore") or ()),
                   *(qc.get("exclude_modules") or ())):
        # ModelOpt writes globs ("model.layers.*.self_attn*", "*.mlp.shared_expert.*"): the
        # module is the name before the trailing wildcard.
        module = str(module) if str(module).startswith("re:") else str(module).rstrip("*.")
        if module.startswith("re:"):
            keep |= {role for role, name in _ROLE_MODULES.items()
                     if re.fullmatch(module[3:], name)}
            continue
        for pattern, roles in _MODULE_ROLES:
            if re.search(pattern, module):
                keep |= roles
    wbytes = _FORMAT_WEIGHT_BYTES[method]
    if method == "int4_wo":  # one bf16 scale per group (compressed-tensors group_size)
        groups = [dict(g.get("weights") or {}) for g in
                  dict(qc.get("config_groups") or {}).values()]
        wbytes = 0.5 + 2 / float(groups[0].get("group_size") or 128)
    return CheckpointQuant(precision=precision, quantized_roles=_QUANTIZABLE_ROLES - keep,
                           moe_dtype=_MOE_FORMAT[method] if Role.MOE_EXPERT.value not in keep
                           else "", block_fp8=method == "fp8_block", weight_bytes=wbytes,
                           modelopt=qc.get("quant_method") == "modelopt",
                           compute_dtype=ROOFLINE_COMPUTE_DTYPE.get(_MOE_FORMAT[method], ""),
                           source=str(entry.get("source", "")))


def weight_storage(model: ModelSpec, precision: str) -> dict[str, Any]:
    """``memory.serving.kv_cache_capacity`` keyword arguments for the weights of ``model``'s
    ``precision`` checkpoint: its weight dtype and, when quantized, the GEMM roles it stores
    quantized (the others, the embedding and LM head always, stay bf16) and their bytes with
    scales (``checkpoint_quant``)."""
    quant = checkpoint_quant(model, precision) if precision in _PRECISION_BYTES else None
    return {"weight_dtype": {"fp4": "nvfp4"}.get(precision, precision),
            "quantized_roles": quant.quantized_roles if quant else None,
            "quantized_weight_bytes": quant.weight_bytes if quant else 0.0}


#: What an engine's ``auto`` KV-cache dtype (a launch without ``--kv-cache-dtype``) resolves
#: to: the KV-cache quantization the checkpoint declares, else the model's activation dtype.
#: vLLM: ``kv_cache_dtype="auto"`` is ``model_config.dtype`` unless a ModelOpt checkpoint names
#: ``kv_cache_quant_algo`` (vllm-project/vllm#30785, Dec 2025, and issue #34752); SGLang: "the
#: default model precision in BF16" (docs, advanced_features/quantized_kv_cache) unless the
#: checkpoint's quant config names an FP8 ``kv_cache_quant_algo``. A block-fp8 checkpoint
#: (DeepSeek-V3/R1, MiniMax-M2.5, Qwen3-FP8: ``quant_method: fp8``) declares none, so its cache
#: stays bf16; NVIDIA's ModelOpt NVFP4 exports declare an 8-bit float one.
AUTO_KV_SOURCE = ("the engine's auto KV-cache dtype: the checkpoint's declared KV-cache "
                  "quantization (ModelOpt kv_cache_quant_algo / kv_cache_scheme), else the "
                  "model's bf16 (vLLM kv_cache_dtype='auto', vllm-project/vllm#30785; SGLang "
                  "--kv-cache-dtype auto)")


def checkpoint_kv_dtype(model: ModelSpec, precision: str) -> str:
    """The KV-cache dtype an engine left at ``auto`` gives ``model``'s ``precision`` checkpoint:
    ``fp8`` when its ``quantization_config`` declares an 8-bit float KV cache
    (``kv_cache_quant_algo: FP8``, or ``kv_cache_scheme`` with ``num_bits: 8, type: float``),
    else the activation dtype: ``fp16`` for an fp16 run, ``bf16`` otherwise
    (``AUTO_KV_SOURCE``). A checkpoint the catalog does not ship declares none.

    Raises:
        ConfigError: the checkpoint declares a KV-cache quantization other than 8-bit float,
            which the simulator does not model.
    """
    entry = dict(model.hf_config.get("_charon_checkpoints") or {}).get(precision) or {}
    qc: Mapping[str, Any] = entry.get("quantization_config") or {}
    where = f"model {model.name}: _charon_checkpoints.{precision}.quantization_config"
    algo = str(qc.get("kv_cache_quant_algo") or "").upper()
    scheme = qc.get("kv_cache_scheme") or {}
    if not isinstance(scheme, Mapping):
        raise ConfigError(f"{where}: `kv_cache_scheme` must be a mapping (num_bits, type), "
                          f"but got {scheme!r}")
    if algo not in ("", "FP8") or (scheme and not (scheme.get("num_bits") == 8
                                                   and scheme.get("type") == "float")):
        raise ConfigError(f"{where}: a declared KV-cache quantization must be 8-bit float "
                          f"(kv_cache_quant_algo FP8 or kv_cache_scheme num_bits 8, type "
                          f"float), but got {algo or dict(scheme)!r}")
    if algo == "FP8" or scheme:
        return "fp8"
    return "fp16" if precision == "fp16" else "bf16"


def _modelopt_format(qc: Mapping[str, Any], where: str) -> str:
    """The kernel format of a TensorRT Model Optimizer checkpoint (``quant_method``
    ``modelopt``): ``quant_algo`` NVFP4 (4-bit E2M1 weights and activations in groups of 16 with
    FP8 scales) or FP8 (per-tensor).

    Raises:
        ConfigError: another ``quant_algo``.
    """
    algo = str(qc.get("quant_algo", ""))
    formats = {"NVFP4": "nvfp4", "FP8": "fp8"}
    if algo not in formats:
        raise ConfigError(f"{where}: `quant_algo` must be one of {sorted(formats)}, but got "
                          f"{algo!r}")
    return formats[algo]


def _compressed_tensors_format(qc: Mapping[str, Any], where: str) -> str:
    """The kernel format of a compressed-tensors checkpoint: every config group 4-bit integer
    weights without activation quantization is W4A16 (``int4_wo``, the format vLLM's
    ``CompressedTensorsWNA16MarlinMoEMethod`` runs and aiconfigurator's ``int4_wo`` MoE rows
    measure). Other schemes are not modelled.

    Raises:
        ConfigError: a scheme other than 4-bit integer weight-only.
    """
    groups = list(dict(qc.get("config_groups") or {}).values())
    for g in groups:
        w = dict(g.get("weights") or {})
        if (w.get("num_bits"), w.get("type")) != (4, "int") or g.get("input_activations"):
            raise ConfigError(f"{where}: only 4-bit integer weight-only compressed-tensors "
                              f"groups (num_bits 4, type 'int', no input_activations) are "
                              f"modelled, but got weights {w} with input_activations "
                              f"{g.get('input_activations')}")
    if not groups:
        raise ConfigError(f"{where}: a compressed-tensors config needs `config_groups`")
    return "int4_wo"


#: Serving engine -> whose measured block-scaled fp8 GEMM rows (profile ``gemm`` variant,
#: dtype ``fp8_block``) price its dense GEMMs of a block-fp8 checkpoint. SGLang runs DeepGEMM's
#: ``fp8_gemm_nt`` (Hopper and Blackwell); TensorRT-LLM its own block-scaling GEMM on Hopper and
#: DeepGEMM on Blackwell; vLLM DeepGEMM too (``DeepGemmFp8BlockScaledMMKernel``, what its own
#: table names from 16 tokens up on Hopper and at every size on Blackwell), priced from SGLang's
#: DeepGEMM rows because vLLM's rows are host-bound (``scripts/import_peers.py``).
BLOCK_FP8_GEMM_ROWS = {"sglang": "sglang", "trtllm": "trtllm", "vllm": "sglang"}


def _with_gemm_dtype(graph: OpGraph, quant: CheckpointQuant, engine: str, ep: int = 1,
                     moe_kernel: str = "", dense_engine: str = "") -> OpGraph:
    """GEMMs of ``quant.quantized_roles`` run at ``quant.precision``; the rest stay bf16.

    Their weight bytes shrink to the checkpoint's stored bytes per weight, scales included
    (``quant.weight_bytes``: int4 in groups of 32 0.5625, MXFP4 0.53125, NVFP4 0.5625; the
    bare element size without a checkpoint); the activations they read move at the dtype the
    kernel computes in (``quant.compute_dtype``; for routed experts that of their kernel format,
    ``cost.predictor.ROOFLINE_COMPUTE_DTYPE``): fp8 / fp4 for W8A8 / W4A4 kernels, bf16 for
    weight-only W4A16 ones (int4, MXFP4 experts), which also keep ``dtype`` bf16 so the roofline
    prices them at the bf16 tensor-core rate, not the FP4 one. Outputs stay bf16. A node's
    weight elements are ``n x k`` (dense, the traced ``[k, n]`` weight of this rank) or
    ``num_experts x n x k`` (grouped: its local experts). Routed-expert grouped GEMMs are
    tagged with the MoE kernel format, ``engine`` and the EP degree
    (``moe_ep:<ep>``: their shape parameters are one rank's, ``tokens x top_k`` rows over its
    ``num_experts`` local experts; measured EP rows are keyed by the global tokens and experts).
    ``moe_kernel`` (``MOE_KERNEL_ROWS``) replaces the engine and format tags with the rows of
    the kernel the launch chose, for the formats that kernel runs.
    NB: activation-quantization kernels are not added (fused into the preceding norm/act in
    vLLM and TRT-LLM).
    """
    precision = quant.precision
    kinds = (OpKind.GEMM, OpKind.GROUPED_GEMM)
    wb = quant.weight_bytes or _PRECISION_BYTES[precision]
    moe_dtype = quant.moe_dtype
    formats, rows = MOE_KERNEL_ROWS.get(moe_kernel, (frozenset(), ("", "")))
    if moe_dtype in formats:
        engine, moe_dtype = rows[0] or engine, rows[1] or moe_dtype
    dense_dtype = quant.compute_dtype or precision
    expert_dtype = ROOFLINE_COMPUTE_DTYPE.get(moe_dtype, dense_dtype)
    moe_tags = frozenset({f"moe_dtype:{moe_dtype}", f"moe_engine:{engine}",
                          f"moe_ep:{ep}"} if moe_dtype else ())
    if engine == "vllm" and moe_dtype == "fp8" and not quant.modelopt:
        moe_tags |= {FP8_MOE_METHOD_TAG}  # vLLM's Fp8MoEMethod, not ModelOpt's (cost.selector)
    rows = BLOCK_FP8_GEMM_ROWS.get(dense_engine or engine, "") if quant.block_fp8 else ""
    dense_tags = frozenset({f"{GEMM_ROWS_TAG}{rows}"} if rows else ())

    def quantized(n: Node) -> Node:
        params, tags = n.params, n.tags | {precision}
        dtype = dense_dtype
        weights = n.params["n"] * n.params["k"]
        if n.kind == OpKind.GEMM:
            tags |= dense_tags
        elif n.kind == OpKind.GROUPED_GEMM:
            weights = weights * n.params["num_experts"]
            # The bf16 MoE cost model prices expert weights at this many bytes.
            params = {**params, "weight_bytes": Poly.const(wb)}
            if _str_role(n) == Role.MOE_EXPERT.value:
                tags |= moe_tags
                dtype = expert_dtype
        acts = n.bytes_read - weights * DTYPE_BYTES["bf16"]
        read = weights * wb + acts * (DTYPE_BYTES[dtype] / DTYPE_BYTES["bf16"])
        return n.replace(dtype=dtype, bytes_read=read, params=params, tags=tags)

    return graph.with_nodes(
        quantized(n) if n.kind in kinds and _str_role(n) in quant.quantized_roles else n
        for n in graph.nodes)
