"""Traced and parallelized inference graphs of one serving replica (cached per configuration).

``frontend.trace_model(spec, phase="prefill"|"decode")`` traces each block once;
``passes.parallelize_inference`` shards it over TP/EP and inserts the collectives. FP8/FP4
serving runs the GEMMs at that precision (weights quantized, as vLLM/TRT-LLM fp8 checkpoints).
DP-attention (MoE) keeps attention and dense layers whole on each rank (``tp = 1`` for them) and
shards experts over ``ep``. Without DP-attention, routed experts are tensor-parallel over the
``tp / ep`` ranks that expert parallelism leaves (vLLM ``FusedMoE``, TRT-LLM ``moe_tp_size``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from charon_search.ir.ops import OpKind, Role
from charon_search.ir.symbolic import Poly

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec
    from charon_search.ir.graph import Node, OpGraph

__all__ = ["serving_graphs"]

Graphs = tuple[dict[str, "OpGraph"], dict[str, "OpGraph"]]
_CACHE: dict[tuple, Graphs] = {}


def serving_graphs(model: ModelSpec, *, tp: int, pp: int, ep: int, dp_attention: bool,
                   precision: str, fused_kernels: bool = True) -> Graphs:
    """``(prefill, decode)``: block name -> one GPU's forward graph of that block.

    Blocks are per layer; the caller multiplies by layers (all stages alike, ``pp`` only adds
    the stage hand-offs). ``fused_kernels`` applies the inference kernel fusion of
    ``serving._fusion`` (fused QKV / gate_up GEMMs, fused add+RMSNorm, fused MoE routing).
    """
    key = (model.name, model.num_layers, model.hidden_size, model.layer_types, tp, ep,
           dp_attention, precision, fused_kernels)
    hit = _CACHE.get(key)
    if hit is None:
        hit = _build(model, tp=tp, ep=ep, dp_attention=dp_attention, precision=precision,
                     fused_kernels=fused_kernels)
        _CACHE[key] = hit
    return hit


def _build(model: ModelSpec, *, tp: int, ep: int, dp_attention: bool, precision: str,
           fused_kernels: bool) -> Graphs:
    from charon_search.frontend import trace_model
    from charon_search.passes import parallelize_inference
    from charon_search.serving._fusion import fuse_for_inference, shard_experts_tp

    out = []
    for phase in ("prefill", "decode"):
        traced = trace_model(model, phase=phase)
        graphs = dict(parallelize_inference(traced, tp=1 if dp_attention else tp, ep=ep))
        # Rows an expert-parallel rank computes: the tokens of the ranks that dispatch to it
        # (tp attention-DP ranks, or one replicated TP batch) times top-k, spread over ep.
        share = ep / (tp if dp_attention else 1)
        if share > 1:
            graphs = {k: _expert_rows_per_rank(g, share) for k, g in graphs.items()}
        if precision in ("fp8", "fp4"):
            graphs = {k: _with_gemm_dtype(g, precision) for k, g in graphs.items()}
        moe_tp = 1 if dp_attention or ep >= tp or tp % ep else tp // ep
        if moe_tp > 1:
            graphs = {k: shard_experts_tp(g, moe_tp) for k, g in graphs.items()}
        if fused_kernels:
            attn_tp = 1 if dp_attention else tp
            kv_heads = max(1, model.num_key_value_heads // attn_tp)
            graphs = {k: fuse_for_inference(g, kv_heads=kv_heads) for k, g in graphs.items()}
        out.append(graphs)
    return out[0], out[1]


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
_PRECISION_BYTES = {"fp8": 1.0, "fp4": 0.5}


def _with_gemm_dtype(graph: OpGraph, dtype: str) -> OpGraph:
    """GEMMs (not the LM head, kept in bf16 by fp8/fp4 checkpoints) run at ``dtype``.

    Their operand bytes shrink with the element size (the quantized checkpoint stores weights
    at ``dtype``; fp8 kernels also read fp8 activations); outputs stay bf16.
    NB: activation-quantization kernels are not added (fused into the preceding norm/act in
    vLLM and TRT-LLM).
    """
    kinds = (OpKind.GEMM, OpKind.GROUPED_GEMM)
    scale = _PRECISION_BYTES[dtype] / 2.0
    wbytes = Poly.const(_PRECISION_BYTES[dtype])

    def quantized(n: Node) -> Node:
        params = n.params
        if n.kind == OpKind.GROUPED_GEMM:
            # The MoE cost model prices expert weights at this many bytes (profile rows: bf16).
            params = {**params, "weight_bytes": wbytes}
        return n.replace(dtype=dtype, bytes_read=n.bytes_read * scale, params=params,
                         tags=n.tags | {dtype})

    return graph.with_nodes(
        quantized(n) if n.kind in kinds and n.role != Role.LM_HEAD.value else n
        for n in graph.nodes)
