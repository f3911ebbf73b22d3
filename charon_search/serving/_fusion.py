"""Inference kernel fusion of the serving graphs, as vLLM / SGLang / TRT-LLM run them.

The frontend traces the HF modules op by op (q, k and v as three GEMMs, ``silu`` and ``mul``
as two kernels, MoE routing as ~25 small torch ops). Serving engines run fewer, fused kernels;
``fuse_for_inference`` rewrites one per-rank block graph (after TP/EP) into those kernels:

1. **Sibling GEMMs** reading the same activation with the same shape except ``n`` become one
   GEMM with ``n`` = the sum (vLLM ``QKVParallelLinear`` and ``MergedColumnParallelLinear``
   gate_up; TRT-LLM fused QKV / gate_up weights; DeepSeek's fused q_a/kv_a projection). FLOPs
   add up, weight bytes add up, the shared activation is read once. Only GEMMs of one role
   merge (the MoE router reads the same input as the shared expert but stays separate).
   Grouped expert GEMMs merge the same way (w1/w3 -> w13).
2. **Norm / RoPE / SwiGLU runs** now adjacent: the rule of engineer D's
   ``passes.fusion.FusionPass`` (fused RMSNorm, fused RoPE, fused SiLU-and-mul; its role sets
   are reused), with per-rank byte counts (``_fuse_glue_runs``).
3. **Residual add + RMSNorm** (vLLM ``fused_add_rms_norm``, TRT-LLM/SGLang the same): the add
   merges with the norm that consumes it. The block's trailing residual add fuses with the next
   layer's input norm; every layer of a block type repeats, so it is accounted in this block's
   leading norm (the first layer's input norm has no add and the last add fuses with the final
   norm instead: the count is off by one kernel per model, not per layer).
4. **KV-cache append**: the K and V writes are one kernel (vLLM ``reshape_and_cache_flash``).
5. **Eager attention** left by ``FusionPass`` (attention sinks, GQA ``repeat_kv`` clones,
   max-subtraction) becomes one flash-attention kernel (vLLM serves gpt-oss with sinks through
   FlashAttention-3 / FlashInfer) that reads the cache without repeating the KV heads.
6. **MoE routing** as vLLM ``FusedMoE`` runs it: router softmax + top-k + renormalize is one
   ``topk_softmax`` kernel; sort / histogram / cumsum of the dispatch is one
   ``moe_align_block_size`` kernel; the token permutation (gather) is fused into the first
   grouped GEMM's operand loads (it reads rows through ``sorted_token_ids``); the expert
   SiLU-and-mul is one kernel; the multiplication by routing weights is fused into the second
   grouped GEMM (``MUL_ROUTED_WEIGHT``); un-permute + top-k sum is one ``moe_sum`` kernel.
   These kernels after the router GEMM then join the ``fused_experts`` node: the measured MoE
   rows time the engine's MoE layer from the router logits on, all of them included.
7. **Embedding**: a gather reads only the looked-up rows (``tokens x hidden``), not the whole
   table; the RoPE cos/sin table is precomputed at load time (vLLM
   ``RotaryEmbedding.cos_sin_cache``), so its per-step ops are dropped.

Every fused kernel keeps the FLOPs of its parts; its HBM bytes are its external inputs and the
outputs used outside it (intermediates stay on chip), like ``FusionPass``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

from charon_search.ir import DTYPE_BYTES, Node, OpKind, Poly, Role
from charon_search.passes.tensor_parallel import is_activation_all_reduce

if TYPE_CHECKING:
    from charon_search.ir.graph import OpGraph

__all__ = ["fuse_for_inference", "fuse_shared_experts", "fuse_trtllm", "gather_experts_tp",
           "shard_experts_tp"]

_GEMMS = (OpKind.GEMM, OpKind.GROUPED_GEMM)
_MOE_GLUE_ROLES = frozenset({Role.MOE_ROUTER.value, Role.MOE_DISPATCH.value,
                             Role.MOE_COMBINE.value})
_GLUE_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.COPY, OpKind.SOFTMAX, OpKind.REDUCTION,
                         OpKind.MOE_ROUTING})


def fuse_for_inference(graph: OpGraph, *, kv_heads: int | None = None) -> OpGraph:
    """The block graph with the kernels an inference engine launches (see module doc).

    ``kv_heads``: KV heads per rank, for attention traced eagerly (e.g. gpt-oss attention
    sinks) that becomes one flash-attention kernel reading the un-repeated GQA cache.
    """
    g = _drop_rope_tables(graph)
    g = _merge_sibling_gemms(g)
    g = _fuse_glue_runs(g)
    g = _fuse_eager_attention(g, kv_heads)
    g = _fuse_moe(g)
    g = _fuse_residual_norm(g)
    g = _fuse_runs(g, lambda n: "kv" if "kv_append" in n.tags and n.kind == OpKind.COPY
                   else None, "reshape_and_cache", sum_numel=True)
    return g


# ---------------------------------------------------------------------------------------------
def _str(role: object) -> str:
    return str(getattr(role, "value", role))


def _tensor_bytes(graph: OpGraph, t: int, dtype: str | None = None) -> Poly:
    spec = graph.tensors[t]
    nbytes = spec.nbytes
    if dtype is not None:
        nbytes = nbytes * (DTYPE_BYTES.get(dtype, 2) / DTYPE_BYTES.get(spec.dtype, 2))
    return nbytes


def _merged(graph: OpGraph, nodes: Sequence[Node], *, name: str, kind: OpKind | None = None,
            params: dict[str, Poly] | None = None) -> Node:
    """One kernel for ``nodes``: FLOPs summed, bytes = external inputs + outputs used outside.

    Byte counts start from the nodes' own counts (which already reflect sharding and
    precision) and drop the intermediates' write and re-read.
    """
    produced = {t: n for n in nodes for t in n.outputs}
    inside = {n.id for n in nodes}
    graph_out = set(graph.outputs)
    ext_in = list(dict.fromkeys(t for n in nodes for t in n.inputs if t not in produced))
    internal = [t for t in produced
                if t not in graph_out and all(c in inside for c in graph.consumers.get(t, ()))]
    ext_out = [t for t in produced if t not in internal] or list(nodes[-1].outputs)
    bytes_read = sum((n.bytes_read for n in nodes), Poly())
    bytes_written = sum((n.bytes_written for n in nodes), Poly())
    for t in internal:
        if t in ext_out:
            continue
        readers = sum(1 for n in nodes for x in n.inputs if x == t)
        nb = _rank_bytes(graph, produced[t], t)
        bytes_written = bytes_written - nb
        bytes_read = bytes_read - nb * readers
    first = nodes[0]
    return first.replace(
        name=name, kind=kind or first.kind, inputs=tuple(ext_in), outputs=tuple(ext_out),
        flops=sum((n.flops for n in nodes), Poly()),
        bytes_read=_clip(bytes_read, graph, ext_in), bytes_written=_clip(bytes_written, graph,
                                                                       ext_out),
        params=params if params is not None else dict(first.params),
        target="serving:fusion", tags=first.tags | {"fused"})


def _rank_bytes(graph: OpGraph, producer: Node, t: int) -> Poly:
    """Per-rank bytes of tensor ``t``: its share of the producer's (per-rank) bytes written.

    ``TensorSpec`` keeps logical (unsharded) sizes after TP/EP; node byte counts are per rank.
    """
    outs = [x for x in producer.outputs if x in graph.tensors]
    total = sum(float(graph.tensors[x].nbytes(64, 1024, 1024)) for x in outs)
    if t not in graph.tensors or total <= 0:
        return producer.bytes_written
    return producer.bytes_written * (float(graph.tensors[t].nbytes(64, 1024, 1024)) / total)


def _clip(value: Poly, graph: OpGraph, tensors: Sequence[int]) -> Poly:
    """Guard against negative byte counts (traced counts that skip some tensor): at least the
    size of the listed external tensors' sum is kept when the subtraction undershoots."""
    if value(1, 1, 1) >= 0 and value(64, 4096, 4096) >= 0:
        return value
    return sum((_tensor_bytes(graph, t) for t in tensors), Poly())


def _rebuild(graph: OpGraph, replace: dict[int, Node], drop: set[int]) -> OpGraph:
    return graph.with_nodes(replace.get(n.id, n) for n in graph.nodes if n.id not in drop)


# ---------------------------------------------------------------------------------------------
def _drop_rope_tables(graph: OpGraph) -> OpGraph:
    """Drop the RoPE position / cos / sin table ops of the embedding block: an engine
    precomputes them at model load. (The lookup itself reads only its gathered rows and the
    token ids as traced: ``frontend._convert``.)"""
    if not any(n.kind == OpKind.EMBEDDING for n in graph.nodes):
        return graph
    drop = {n.id for n in graph.nodes
            if _str(n.role) == Role.EMBED.value and not n.is_comm
            and n.kind in (OpKind.ELEMENTWISE, OpKind.COPY)}
    return _rebuild(graph, {}, drop) if drop else graph


# ---------------------------------------------------------------------------------------------
def _fuse_glue_runs(graph: OpGraph) -> OpGraph:
    """Runs of norm / RoPE / activation ops: engineer D's ``FusionPass`` rule (its
    ``FUSABLE_ROLES`` on elementwise / copy / norm kinds), applied to the per-rank graph.

    ``FusionPass`` itself runs before TP and sizes fused kernels from ``TensorSpec`` bytes,
    which are logical (unsharded); after TP that overcounts sharded activations by ``tp``, so
    the merge here starts from the nodes' per-rank counts (``_merged``)."""
    from charon_search.passes.fusion import FUSABLE_KINDS, FUSABLE_ROLES

    roles = {_str(r) for r in FUSABLE_ROLES}

    def key(n: Node) -> str | None:
        return _str(n.role) if _str(n.role) in roles and n.kind in FUSABLE_KINDS else None

    return _fuse_runs(graph, key, "fused")


def _poly_key(p: Poly) -> tuple:
    terms = p.terms
    return tuple(sorted(terms.items() if hasattr(terms, "items") else terms))


def _merge_sibling_gemms(graph: OpGraph) -> OpGraph:
    params = set(graph.param_tensors)
    groups: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        if n.kind not in _GEMMS or "n" not in n.params:
            continue
        acts = tuple(t for t in n.inputs if t not in params)
        if not acts:
            continue
        shape = tuple((k, _poly_key(v)) for k, v in sorted(n.params.items()) if k != "n")
        key = (n.kind, _str(n.role), n.dtype, acts, shape)
        groups.setdefault(key, []).append(n)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for (_, _, dtype, acts, _), nodes in groups.items():
        if len(nodes) < 2:
            continue
        act_bytes = _tensor_bytes(graph, acts[0], dtype)
        first = nodes[0]
        weights = tuple(t for n in nodes for t in n.inputs if t in params)
        p = dict(first.params)
        p["n"] = sum((n.params["n"] for n in nodes), Poly())
        replace[first.id] = first.replace(
            name=f"fused_{first.name}", inputs=acts + weights,
            outputs=tuple(t for n in nodes for t in n.outputs),
            flops=sum((n.flops for n in nodes), Poly()),
            bytes_read=sum((n.bytes_read for n in nodes), Poly()) - act_bytes * (len(nodes) - 1),
            bytes_written=sum((n.bytes_written for n in nodes), Poly()), params=p,
            target="serving:fusion", tags=first.tags | {"fused", f"fused_gemms={len(nodes)}"})
        drop.update(n.id for n in nodes[1:])
    return _rebuild(graph, replace, drop) if replace else graph


def _fuse_runs(graph: OpGraph, key: Callable[[Node], object], label: str,
               kind: OpKind | None = None, sum_numel: bool = False) -> OpGraph:
    """Merge maximal runs of consecutive nodes with equal non-None ``key`` (``numel`` of the
    fused kernel: the largest part's, or the sum for independent writes)."""
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    nodes = graph.nodes
    i = 0
    while i < len(nodes):
        k = key(nodes[i])
        j = i + 1
        if k is not None:
            while j < len(nodes) and key(nodes[j]) == k:
                j += 1
            if j - i > 1:
                run = list(nodes[i:j])
                big = max(run, key=lambda n: float(n.bytes(64, 1024, 1024)))
                numel = (sum((n.params.get("numel", Poly()) for n in run), Poly()) if sum_numel
                         else big.params.get("numel", big.bytes / 2))
                norm = next((n for n in run if n.kind == OpKind.NORM), None)
                run_kind = kind or (OpKind.NORM if norm is not None else run[0].kind)
                if run_kind == OpKind.NORM and norm is not None:
                    params: dict[str, Poly] | None = dict(norm.params)
                elif run_kind in (OpKind.ELEMENTWISE, OpKind.COPY):
                    params = {"numel": numel}
                else:
                    params = dict(big.params)
                replace[run[0].id] = _merged(graph, run, name=f"{label}_{run[0].name}",
                                             kind=run_kind, params=params)
                drop.update(n.id for n in run[1:])
        i = j
    return _rebuild(graph, replace, drop) if replace else graph


_EAGER_ATTN = frozenset({OpKind.BATCHED_GEMM, OpKind.SOFTMAX, OpKind.ELEMENTWISE, OpKind.COPY,
                         OpKind.REDUCTION})


def _fuse_eager_attention(graph: OpGraph, kv_heads: int | None) -> OpGraph:
    from charon_search.passes.fusion import attention_params

    def key(n: Node) -> str | None:
        return ("attn" if _str(n.role) == Role.ATTN_CORE.value and n.kind in _EAGER_ATTN
                and "kv_append" not in n.tags else None)

    nodes = graph.nodes
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    i = 0
    while i < len(nodes):
        j = i + 1
        if key(nodes[i]) is not None:
            while j < len(nodes) and key(nodes[j]) is not None:
                j += 1
            run = list(nodes[i:j])
            bmms = [n for n in run if n.kind == OpKind.BATCHED_GEMM]
            if len(bmms) >= 2 and any(n.kind == OpKind.SOFTMAX for n in run):
                params = attention_params(bmms[0], bmms[1])
                if params is not None:
                    if kv_heads:
                        params["kv_heads"] = Poly.const(kv_heads)
                    q, kv = params["q_len"], params["kv_len"]
                    prefill = _poly_key(q) == _poly_key(kv)
                    params["causal"] = Poly.const(1 if prefill else 0)
                    flops = sum((n.flops for n in bmms[:2]), Poly())
                    flops = flops / 2 if prefill else flops
                    b, h, kvh = params["batch"], params["heads"], params["kv_heads"]
                    d, dv = params["head_dim"], params["v_head_dim"]
                    read = b * (q * h * d + kv * kvh * (d + dv)) * 2.0
                    base = _merged(graph, run, name=f"flash_{run[0].name}",
                                   kind=OpKind.ATTENTION, params=params)
                    replace[run[0].id] = base.replace(flops=flops, bytes_read=read,
                                                      bytes_written=b * q * h * dv * 2.0)
                    drop.update(n.id for n in run[1:])
        i = j
    return _rebuild(graph, replace, drop) if replace else graph


def _fuse_moe(graph: OpGraph) -> OpGraph:
    if not any(n.kind == OpKind.GROUPED_GEMM for n in graph.nodes):
        return graph
    params = set(graph.param_tensors)
    producer = {t: n for n in graph.nodes for t in n.outputs}
    consumers: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for t in n.inputs:
            consumers.setdefault(t, []).append(n)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for n in graph.nodes:
        # Token permutation (gather of activations) read directly by the grouped GEMM.
        if (_str(n.role) == Role.MOE_DISPATCH.value and n.kind == OpKind.COPY and n.outputs
                and all(c.kind == OpKind.GROUPED_GEMM
                        for t in n.outputs for c in consumers.get(t, ()))
                and all(consumers.get(t) for t in n.outputs)):
            src = n.inputs[0]
            drop.add(n.id)
            for t in n.outputs:
                for c in consumers[t]:
                    cur = replace.get(c.id, c)
                    replace[c.id] = cur.replace(
                        inputs=tuple(src if x == t else x for x in cur.inputs))
        # Routing-weight multiply fused into the producing grouped GEMM's epilogue.
        if (_str(n.role) == Role.MOE_COMBINE.value and n.kind == OpKind.ELEMENTWISE
                and n.inputs and n.inputs[0] in producer
                and producer[n.inputs[0]].kind == OpKind.GROUPED_GEMM
                and len(consumers.get(n.inputs[0], ())) == 1):
            gemm = producer[n.inputs[0]]
            cur = replace.get(gemm.id, gemm)
            extra = tuple(t for t in n.inputs[1:] if t not in cur.inputs and t not in params)
            replace[gemm.id] = cur.replace(inputs=cur.inputs + extra, outputs=n.outputs,
                                           flops=cur.flops + n.flops,
                                           tags=cur.tags | {"fused"})
            drop.add(n.id)
    g = _rebuild(graph, replace, drop) if replace or drop else graph

    def glue_key(n: Node) -> str | None:
        role = _str(n.role)
        if n.is_comm or n.kind not in _GLUE_KINDS:
            return None
        if role in _MOE_GLUE_ROLES:
            return role
        if role == Role.MOE_EXPERT.value and n.kind == OpKind.ELEMENTWISE:
            return role  # SiLU-and-mul between the grouped GEMMs
        return None

    g = _fuse_runs(g, glue_key, "fused_moe")
    return _absorb_moe_routing(_fused_expert_ffn(g))


def _absorb_moe_routing(graph: OpGraph) -> OpGraph:
    """The routing and combine kernels of one MoE layer join its ``fused_experts`` node.

    What a measured MoE row times is the engine's MoE layer called with the router logits
    (aiconfigurator's vLLM collector calls ``FusedMoE(hidden_states, router_logits)``, its
    SGLang collector ``experts(hidden_states, TopK(hidden_states, router_logits))``; the
    FlashInfer TRT-LLM MoE kernels, vLLM's and SGLang's Blackwell default, take the logits and
    route inside): the top-k / sigmoid scoring, the ``moe_align_block_size`` sort, the grouped
    GEMMs and the weighted top-k sum (``moe_sum``, or the kernel's finalize), in one number.
    TensorRT-LLM's collector is ASSUMED to cover the same span. Priced as
    separate nodes as well, they counted twice (DeepSeek-V3 at 8,657 prompt tokens on a B200,
    TP 8: 23 ms of a 231 ms step). Absorbed here: the router-role ops after the router GEMM,
    the dispatch-role ops, and the combine-role ops that read the experts' output (directly or
    through the EP combine all-to-all). Not absorbed: the router GEMM and what feeds it, and
    the add of a separately computed shared expert's output. Their FLOPs and bytes move onto
    the experts node, so a roofline-priced MoE (no measured rows) still moves them.

    Dropped: router-role ops that only feed the router GEMM. The HF DeepSeek-V3 / Kimi-K2 /
    GLM-5 gate casts its input and weight to fp32 before the GEMM (``F.linear(hidden_states.
    type(torch.float32), self.weight.type(torch.float32))``); the engines run the gate on the
    bf16 activations (vLLM ``ReplicatedLinear``, SGLang ``MoEGate`` ``F.linear`` or
    ``dsv3_router_gemm``, TensorRT-LLM ``dsv3_router_gemm_op``), so no cast kernel runs.
    """
    nodes = graph.nodes
    experts = [n for n in nodes if n.kind == OpKind.GROUPED_GEMM and "moe_ffn" in n.tags]
    routers = [n for n in nodes if n.kind == OpKind.GEMM and _str(n.role) == Role.MOE_ROUTER.value]
    if len(experts) != 1 or len(routers) != 1:
        return graph
    ffn, router = experts[0], routers[0]
    producer, consumers = graph.producer, graph.consumers
    after_router = set(router.outputs)
    expert_out = set(ffn.outputs)
    absorbed: list[Node] = []
    alias: dict[int, int] = {}
    casts = [n for n in nodes if not n.is_comm and n.kind in _GLUE_KINDS
             and _str(n.role) == Role.MOE_ROUTER.value and n.outputs
             and all(set(consumers.get(t, ())) == {router.id} for t in n.outputs)]
    for n in casts:
        if len(n.outputs) == len(n.inputs):
            alias.update(zip(n.outputs, n.inputs))
        else:
            alias.update((t, n.inputs[0]) for t in n.outputs)
    for n in nodes:
        if n.is_comm:
            if any(t in expert_out for t in n.inputs):
                expert_out |= set(n.outputs)  # the EP combine all-to-all of the experts' rows
            continue
        if n.kind not in _GLUE_KINDS:
            continue
        role = _str(n.role)
        if role == Role.MOE_ROUTER.value and not any(t in after_router for t in n.inputs):
            continue  # before the router GEMM (e.g. a cast of its input)
        if role == Role.MOE_COMBINE.value:
            src = next((t for t in n.inputs if t in expert_out), None)
            if src is None:
                continue  # e.g. routed + shared-expert output
        elif role in (Role.MOE_ROUTER.value, Role.MOE_DISPATCH.value):
            src = next((t for t in n.inputs if t in producer or t in after_router), None)
            if src is None:
                continue
            after_router |= set(n.outputs)
        else:
            continue
        absorbed.append(n)
        for t in n.outputs:
            alias[t] = src
    if not absorbed and not casts:
        return graph

    def resolve(t: int) -> int:
        while t in alias:
            t = alias[t]
        return t

    gone = {n.id for n in (*absorbed, *casts)}
    out: list[Node] = []
    for n in nodes:
        if n.id in gone:
            continue
        inputs = tuple(dict.fromkeys(resolve(t) for t in n.inputs))
        if n.id == ffn.id:
            n = n.replace(inputs=tuple(t for t in inputs if t not in n.outputs),
                          flops=n.flops + sum((a.flops for a in absorbed), Poly()),
                          bytes_read=n.bytes_read + sum((a.bytes_read for a in absorbed),
                                                        Poly()),
                          bytes_written=n.bytes_written + sum((a.bytes_written
                                                               for a in absorbed), Poly()))
        elif inputs != n.inputs:
            n = n.replace(inputs=inputs)
        out.append(n)
    outputs = tuple(resolve(t) for t in graph.outputs)
    return graph.with_nodes(out, **({"outputs": outputs} if outputs != graph.outputs else {}))


def _fused_expert_ffn(graph: OpGraph) -> OpGraph:
    """w13 grouped GEMM + SiLU-and-mul + w2 grouped GEMM -> one ``grouped_gemm`` node with
    ``n`` = the expert intermediate size and ``k`` = hidden: the whole ``fused_experts`` op,
    which is what the profile DB's ``moe_ffn`` rows time (aiconfigurator's MoE profiles time
    the engine's fused MoE op, gate/up + activation + down) and what the ``grouped_gemm``
    predictor's shape model assumes (``2 rows 3 n k`` FLOPs). Intermediates are written to and
    read from HBM as vLLM's ``intermediate_cache1/2`` are, so bytes simply add up."""
    nodes = graph.nodes
    for i, up in enumerate(nodes):
        if up.kind != OpKind.GROUPED_GEMM:
            continue
        j = i + 1
        while j < len(nodes) and (_str(nodes[j].role) == Role.MOE_EXPERT.value
                                  and nodes[j].kind in (OpKind.ELEMENTWISE, OpKind.COPY)):
            j += 1  # activation (SwiGLU; gpt-oss: clamped SwiGLU + bias add/gather)
        if j == i + 1 or j >= len(nodes):
            continue
        # Expert parallelism dispatches every grouped GEMM's inputs; inside one fused expert
        # FFN the activations never leave the GPU, so a dispatch between w13 and w2 is not
        # run by the engine (one dispatch before the FFN, one combine after it).
        skipped = []
        while (j + 1 < len(nodes) and nodes[j].is_comm and nodes[j].group == "ep"
               and nodes[j].kind == OpKind.ALL_TO_ALL
               and nodes[j + 1].kind == OpKind.GROUPED_GEMM):
            skipped.append(nodes[j])
            j += 1
        mid, down = list(nodes[i + 1:j - len(skipped)]), nodes[j]
        if not (down.kind == OpKind.GROUPED_GEMM and "k" in down.params
                and "n" in down.params):
            continue
        parts = [up, *mid, down]
        inner = {t for n in parts[:-1] for t in n.outputs}
        p = dict(up.params)
        p["n"], p["k"] = down.params["k"], down.params["n"]
        ffn = up.replace(
            name=f"fused_experts_{up.name}",
            inputs=tuple(dict.fromkeys(t for n in parts for t in n.inputs if t not in inner)),
            outputs=down.outputs, flops=sum((n.flops for n in parts), Poly()),
            bytes_read=sum((n.bytes_read for n in parts), Poly()),
            bytes_written=sum((n.bytes_written for n in parts), Poly()),
            params=p, target="serving:fusion", tags=up.tags | down.tags | {"fused", "moe_ffn"})
        drop = {n.id for n in parts[1:]} | {n.id for n in skipped}
        return graph.with_nodes(ffn if n.id == up.id else n for n in nodes if n.id not in drop)
    return graph


def shard_experts_tp(graph: OpGraph, moe_tp: int, *, rows: int = 1,
                     reduce: bool = True) -> OpGraph:
    """Expert tensor parallelism of inference engines (vLLM ``FusedMoE`` without expert
    parallelism, TRT-LLM ``moe_tp_size``): each routed expert's w13 is split column-wise and
    w2 row-wise over ``moe_tp`` ranks, and the MoE output is all-reduced over them.

    ``passes.tensor_parallel`` leaves routed experts unsharded (expert TP = 1, Megatron's
    training default); serving engines shard them whenever expert parallelism does not cover
    the TP group (``moe_tp = tp / ep``). The all-reduce copies the block's attention TP
    all-reduce (same ``tokens x hidden`` message); ``reduce=False`` adds none (the caller
    reduces, ``gather_experts_tp``). ``rows``: each rank computes ``rows`` times the traced
    token rows (the tokens of the attention-DP ranks gathered to it), at ``1 / moe_tp`` of
    every expert's width.
    """
    if moe_tp <= 1:
        return graph
    params = set(graph.param_tensors)
    ar = next((n for n in graph.nodes if is_activation_all_reduce(n)), None)
    reduce_new = reduce and not shared_expert_allreduce(graph)
    experts = [n for n in graph.nodes if n.kind == OpKind.GROUPED_GEMM
               and _str(n.role) == Role.MOE_EXPERT.value]
    if not experts or (ar is None and reduce):
        return graph
    out: list[Node] = []
    next_id = max(n.id for n in graph.nodes) + 1
    last_combine = max((i for i, n in enumerate(graph.nodes)
                        if _str(n.role) in (Role.MOE_COMBINE.value, Role.MOE_EXPERT.value)),
                       default=len(graph.nodes) - 1)
    for i, n in enumerate(graph.nodes):
        if n in experts:
            acts = [t for t in n.inputs if t not in params and t in graph.tensors]
            act = _tensor_bytes(graph, acts[0], n.dtype) if acts else Poly()
            p = dict(n.params)
            column = n is experts[0] or len(experts) == 1
            dim = "n" if column else "k"
            p[dim] = p[dim] / moe_tp
            if "tokens" in p:
                p["tokens"] = p["tokens"] * rows
            n = n.replace(flops=n.flops * rows / moe_tp,
                          bytes_read=act * rows + (n.bytes_read - act) / moe_tp,
                          bytes_written=n.bytes_written * rows / (moe_tp if column else 1),
                          params=p, tags=n.tags | {"moe_tp"})
        elif _str(n.role) == Role.MOE_EXPERT.value and n.kind == OpKind.ELEMENTWISE:
            f = rows / moe_tp
            n = n.replace(flops=n.flops * f, bytes_read=n.bytes_read * f,
                          bytes_written=n.bytes_written * f,
                          params={k: v * f for k, v in n.params.items()})
        out.append(n)
        if i == last_combine and reduce_new and ar is not None:
            out.append(ar.replace(id=next_id, name=f"moe_tp_all_reduce_{ar.name}",
                                  inputs=(), outputs=()))
    return graph.with_nodes(out)


def gather_experts_tp(graph: OpGraph, dp: int, moe_tp: int) -> OpGraph:
    """Expert tensor parallelism under attention data parallelism (one graph per DP rank,
    traced at that rank's own tokens): the ``dp`` ranks all-gather their hidden states before
    the experts, every rank runs its ``1 / ep`` of the experts at ``1 / moe_tp`` of their width
    on the rows of all ``dp`` ranks routed to them (``moe_tp`` times its own rows, since
    ``dp = moe_tp x ep``), and a reduce-scatter returns each rank its tokens' summed outputs.

    That is the attention-DP MoE path of the engines: TensorRT-LLM ``FusedMoE`` all-gathers
    and reduce-scatters over the attention-DP ranks when its all-to-all is not enabled (it is
    only for ``moe_tp_size == 1``); vLLM's data-parallel MoE without expert parallelism shards
    each expert over ``dp x tp`` ranks (``FusedMoEParallelConfig``) behind its naive
    all-gather dispatch / reduce-scatter combine; SGLang's DP attention gathers the DP ranks'
    tokens for its tensor-parallel MoE. The expert-parallel all-to-alls the graph carries are
    replaced by these two collectives; each moves ``dp x tokens x hidden`` activations (bf16,
    the router's input), ``bytes`` in ``cost.collectives``' convention (all-gather output,
    reduce-scatter input).
    """
    if moe_tp <= 1 or dp <= 1:
        return graph
    router = next((n for n in graph.nodes if n.kind == OpKind.GEMM
                   and _str(n.role) == Role.MOE_ROUTER.value), None)
    moe = [i for i, n in enumerate(graph.nodes)
           if _str(n.role) in (Role.MOE_DISPATCH.value, Role.MOE_EXPERT.value,
                               Role.MOE_COMBINE.value)]
    if router is None or not moe:
        return graph
    params = set(graph.param_tensors)
    act = next(t for t in router.inputs if t not in params and t in graph.tensors)
    message = _tensor_bytes(graph, act) * dp
    g = shard_experts_tp(graph, moe_tp, rows=moe_tp, reduce=False)
    nodes = g.nodes
    first = next(i for i, n in enumerate(nodes) if _str(n.role) in (
        Role.MOE_DISPATCH.value, Role.MOE_EXPERT.value, Role.MOE_COMBINE.value))
    last = max(i for i, n in enumerate(nodes) if _str(n.role) in (
        Role.MOE_EXPERT.value, Role.MOE_COMBINE.value))
    next_id = max(n.id for n in nodes) + 1

    def collective(kind: OpKind, offset: int, name: str) -> Node:
        return Node(id=next_id + offset, name=name, kind=kind, target="pass:dp_attention",
                    role="comm", params={"bytes": message, "group_size": Poly.const(dp)},
                    stream="comm_dp", group="dp")

    out: list[Node] = []
    for i, n in enumerate(nodes):
        if i == first:
            out.append(collective(OpKind.ALL_GATHER, 0, "dp_all_gather_moe"))
        if not (n.kind == OpKind.ALL_TO_ALL and n.group == "ep"):
            out.append(n)
        if i == last:
            out.append(collective(OpKind.REDUCE_SCATTER, 1, "dp_reduce_scatter_moe"))
    return g.with_nodes(out)


def fuse_shared_experts(graph: OpGraph, num_shared: int) -> OpGraph:
    """SGLang's shared-expert fusion: the ``num_shared`` shared experts run inside the routed
    fused-MoE kernel as extra experts every token selects (top-k + ``num_shared`` over
    ``num_experts + num_shared``), so their separate GEMMs and SiLU-and-mul disappear; their
    FLOPs and weight bytes move into the fused node. SGLang
    ``DeepseekV2ForCausalLM.determine_num_fused_shared_experts`` does this by default for
    DeepSeek-V3/R1 (256 routed + 1 shared experts) on NVIDIA GPUs of compute capability >= 8.0
    unless the experts are expert-parallel. Graphs without one fused routed-expert node and
    shared-expert nodes are returned unchanged."""
    experts = [n for n in graph.nodes if n.kind == OpKind.GROUPED_GEMM
               and _str(n.role) == Role.MOE_EXPERT.value and "moe_ffn" in n.tags]
    shared = [n for n in graph.nodes if _str(n.role) == Role.MOE_SHARED.value and not n.is_comm]
    if len(experts) != 1 or not shared or num_shared < 1:
        return graph
    e = experts[0]
    gone = {n.id for n in shared}
    p = dict(e.params)
    p["top_k"] = p["top_k"] + Poly.const(num_shared)
    p["num_experts"] = p["num_experts"] + Poly.const(num_shared)
    fused = e.replace(params=p, flops=e.flops + sum((n.flops for n in shared), Poly()),
                      bytes_read=e.bytes_read + sum(
                          (n.bytes_read for n in shared if n.kind in _GEMMS), Poly()),
                      tags=e.tags | {"fused_shared_experts"})
    return graph.with_nodes(fused if n.id == e.id else n for n in graph.nodes
                            if n.id not in gone)


def shared_expert_allreduce(graph: OpGraph) -> bool:
    """The block all-reduces its shared experts' output over TP (a DeepSeek-style MoE layer
    after ``passes.tensor_parallel``). Inference engines add the routed experts' partial sums
    to the shared experts' before that one all-reduce, so the routed experts need none of their
    own: vLLM ``DeepseekV2MoE`` (shared experts ``reduce_results=False``, one
    ``maybe_all_reduce_tensor_model_parallel``), SGLang ``DeepseekV2MoE`` (one
    ``tensor_model_parallel_all_reduce``), TensorRT-LLM ``Deepseekv3MoE`` (shared
    ``reduce_output=False``, one all-reduce fused with the next RMSNorm)."""
    first = next((i for i, n in enumerate(graph.nodes) if _str(n.role) == Role.MOE_SHARED.value),
                 None)
    return first is not None and any(is_activation_all_reduce(n) for n in graph.nodes[first:])


def _fuse_residual_norm(graph: OpGraph) -> OpGraph:
    nodes = list(graph.nodes)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    compute = [n for n in nodes if not n.is_comm]
    for a, b in pairwise(compute):
        if (_str(a.role) == Role.RESIDUAL.value and a.kind == OpKind.ELEMENTWISE
                and b.kind == OpKind.NORM and any(t in b.inputs for t in a.outputs)
                and a.id not in drop and b.id not in replace):
            merged = _merged(graph, [a, b], name=f"fused_add_{b.name}", kind=OpKind.NORM,
                             params=dict(b.params)).replace(role=b.role)
            replace[a.id] = merged
            drop.add(b.id)
    g = _rebuild(graph, replace, drop) if replace else graph
    # Trailing residual add -> the next layer's input norm (accounted in this block's leading
    # norm, see the module doc).
    comp = [n for n in g.nodes if not n.is_comm]
    if len(comp) < 3:
        return g
    last, lead = comp[-1], comp[0]
    if (_str(last.role) == Role.RESIDUAL.value and last.kind == OpKind.ELEMENTWISE
            and lead.kind == OpKind.NORM and _str(lead.role) == Role.ATTN_NORM.value):
        out_bytes = sum((_tensor_bytes(g, t) for t in last.outputs), Poly())
        fused = lead.replace(
            name=f"fused_add_{lead.name}", flops=lead.flops + last.flops,
            # Reads the two addends instead of their sum; writes the sum (next residual).
            bytes_read=lead.bytes_read + last.bytes_read - out_bytes,
            bytes_written=lead.bytes_written + last.bytes_written,
            target="serving:fusion", tags=lead.tags | {"fused", "fused_residual"})
        g = g.with_nodes(fused if n.id == lead.id else n for n in g.nodes if n.id != last.id)
    return g


def fuse_trtllm(graph: OpGraph, *, allreduce_norm: bool = True,
                rope_in_attention: bool = True) -> OpGraph:
    """The kernels TensorRT-LLM (PyTorch backend) runs beyond ``fuse_for_inference``; an engine
    launched with the all-reduce + RMSNorm fusion alone (SGLang's
    ``--enable-flashinfer-allreduce-fusion``) takes ``rope_in_attention=False``.

    * **All-reduce + residual + RMSNorm** (``allreduce_norm``; TP > 1 without attention-DP):
      the decoder layers pass ``AllReduceParams(fusion_op=AllReduceFusionOp.RESIDUAL_RMS_NORM)``
      to the TP all-reduce after attention and after the MLP/MoE, so the next RMSNorm runs in
      the all-reduce kernel's epilogue (``tensorrt_llm/_torch/models/modeling_llama.py``
      ``PRE_MLP_FUSION`` / ``POST_MLP_FUSION``; ``modeling_deepseekv3.py`` ``PRE_MOE_FUSION``).
      The norm that follows a TP all-reduce is dropped (its time is inside the measured
      all-reduce latency); the block's leading norm follows the previous layer's trailing
      all-reduce the same way (off by one kernel per model, as in ``_fuse_residual_norm``).
    * **RoPE in the attention op**: TRT-LLM's attention applies RoPE in its QKV preprocessing
      kernel, which also writes the KV cache (``invokeApplyBiasRopeUpdateKVCache``,
      ``cpp/tensorrt_llm/kernels/unfusedAttentionKernels``): the separate RoPE kernel is
      dropped; the KV-append kernel stays as that preprocessing kernel.
    """
    nodes = graph.nodes
    drop: set[int] = set()
    if rope_in_attention:
        drop.update(n.id for n in nodes
                    if _str(n.role) == Role.ATTN_ROPE.value and not n.is_comm
                    and n.kind in (OpKind.ELEMENTWISE, OpKind.COPY))
    if allreduce_norm:
        for a, b in pairwise(nodes):
            if is_activation_all_reduce(a) and b.kind == OpKind.NORM:
                drop.add(b.id)
        comp = [n for n in nodes if not n.is_comm]
        if (nodes and is_activation_all_reduce(nodes[-1]) and comp and comp[0].kind == OpKind.NORM
                and _str(comp[0].role) == Role.ATTN_NORM.value):
            drop.add(comp[0].id)
    return graph.with_nodes(n for n in nodes if n.id not in drop) if drop else graph
