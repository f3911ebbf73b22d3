"""Latency of one engine iteration from the costed prefill/decode graphs of its batch.

An iteration runs prefill chunks (``q`` new tokens over ``kv`` context each) and decode tokens
(``q`` = 1, or k+1 when verifying speculative drafts) together. Its cost is decomposed:

* token-linear ops (GEMMs, norms, elementwise, MoE experts, TP collectives) depend only on the
  total token count ``T``: costed at ``(b=1, s=T)`` from the sharded block graphs;
* attention depends on each request's ``(q_len, kv_len)``: prefill chunks are costed one by one,
  decode requests together at their mean context length (decode attention is memory bound and
  linear in total KV bytes, so batch ``n`` at the mean equals the sum); layers with
  sliding-window attention (gpt-oss: every other layer, 128 keys) attend over at most the
  window;
* the LM head runs only on the positions that sample a token.

Every piece is memoized on a geometric grid (8 points per octave; 4 for the 2-D prefill
attention) and interpolated in between, so a 10,000-request simulation costs a few hundred
graph evaluations. The engine adds CUDA-graph padding, host launch cost of eager iterations and
the per-iteration CPU overhead.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from charon_search.errors import ConfigError
from charon_search.ir import Poly
from charon_search.ir.ops import OpKind, Role

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec
    from charon_search.hardware.spec import ClusterSpec
    from charon_search.ir.graph import OpGraph

__all__ = [
    "GRAPH_KERNEL_FLOOR_S",
    "AffineIterationCostModel",
    "GraphIterationCostModel",
    "IterationCostModel",
    "bucket",
]

PrefillChunks = Sequence[tuple[int, int]]
"""``(q_len, kv_len)`` of each prefill chunk in the batch (kv_len includes the chunk)."""


def grid_point(x: float, shift: int = 4) -> tuple[int, int, float]:
    """Neighbours of ``x`` on the memo grid and the interpolation weight of the upper one.

    The grid is every integer up to 32, then ``2**(shift-1)`` points per octave (8 by default:
    spacing <= 12.5 %), so a 10,000-request run evaluates each graph at a few hundred points;
    costs in between are interpolated linearly (costs are smooth in token counts away from
    tiny sizes).
    """
    if x <= 32:
        n = max(1, math.ceil(x))
        return n, n, 0.0
    step = 1 << (int(x).bit_length() - shift)
    lo = int(x // step) * step
    if lo == x:
        return lo, lo, 0.0
    return lo, lo + step, (x - lo) / step


def bucket(x: float) -> int:
    """The grid point at or above ``x``."""
    lo, hi, w = grid_point(x)
    return hi if w else lo


def _bilinear(f: Callable[[int, int], float], x: float, y: float, shift: int = 4) -> float:
    x0, x1, wx = grid_point(x, shift)
    y0, y1, wy = grid_point(y, shift)
    v = f(x0, y0)
    if wx == 0.0 and wy == 0.0:
        return v
    v0 = (1 - wy) * v + wy * f(x0, y1) if wy else v
    if not wx:
        return v0
    v1 = (1 - wy) * f(x1, y0) + wy * f(x1, y1) if wy else f(x1, y0)
    return (1 - wx) * v0 + wx * v1


class IterationCostModel(ABC):
    """Seconds of GPU work for one iteration of one replica (no host overhead).

    Subclasses give three pieces; ``iteration_s`` composes them (and wrappers such as the
    sequence-parallel one recombine them).
    """

    num_kernels: int = 0
    """Kernels launched by one eager forward pass (host launch cost when not graph-captured)."""
    num_attention_kernels: int = 0
    """Of those, the attention operators: all the host launches when the iteration replays
    piecewise CUDA graphs (``ServingConfig.piecewise_graph_tokens``)."""

    @abstractmethod
    def token_linear_s(self, tokens: int, rows: int) -> float:
        """Token-linear ops over ``tokens`` tokens plus the LM head over ``rows`` samples."""

    @abstractmethod
    def prefill_attention_s(self, q_len: int, kv_len: int) -> float:
        """Attention of one prefill chunk (``q_len`` new tokens, ``kv_len`` keys) over all
        layers."""

    @abstractmethod
    def decode_attention_s(self, num: int, kv_sum: float, q: int = 1) -> float:
        """Attention of ``num`` decoding requests (``q`` tokens each, ``kv_sum`` keys in all)."""

    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies on one GPU of the replica."""
        return 0.0

    def iteration_s(self, prefill: PrefillChunks, num_decode: int, decode_kv_sum: float,
                    decode_q: int = 1, *, padded_decode: int = 0) -> float:
        """GPU time of a batch: prefill chunks + ``num_decode`` requests decoding ``decode_q``
        tokens each over a total context of ``decode_kv_sum`` tokens. ``padded_decode`` (>=
        ``num_decode``) is the CUDA-graph batch the token-linear ops run at."""
        tokens = 0
        chunks = []
        for q, kv in prefill:
            tokens += q
            chunks.append(self.prefill_attention_s(q, kv))
        tokens += max(num_decode, padded_decode) * decode_q
        if tokens == 0:
            return 0.0
        attn = self.prefill_attention_total_s(chunks)
        attn += self.decode_attention_s(num_decode, decode_kv_sum, decode_q)
        return self.token_linear_s(tokens, len(prefill) + num_decode * decode_q) + attn

    def prefill_attention_total_s(self, chunks: Sequence[float]) -> float:
        """Attention time of an iteration's prefill chunks (each chunk's own time given): they
        run one after another on every GPU of the replica."""
        return float(sum(chunks))

    def mtp_step_s(self, num_decode: int, decode_kv_sum: float) -> float:
        """One MTP draft step (one extra decoder layer + LM head); default: a full decode step."""
        return self.iteration_s((), num_decode, decode_kv_sum, 1)

    def mtp_prefill_s(self, prefill: PrefillChunks) -> float:
        """The MTP layer's pass over an iteration's prompt chunks (its KV and each prompt's
        first proposal); default 0: a model without layers (``AffineIterationCostModel``)
        takes it as part of its prefill coefficients."""
        return 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AffineIterationCostModel(IterationCostModel):
    """A closed-form model ``base + per_token * T + per_kv_token * KV + per_pair * pairs``.

    ``KV`` is the keys read by all requests, ``pairs`` the causal (query, key) pairs of the
    prefill chunks.

    Useful for what-if studies with measured coefficients and for exact scheduler tests.
    """

    base_s: float = 0.0
    per_token_s: float = 0.0
    per_kv_token_s: float = 0.0
    per_attention_pair_s: float = 0.0
    """Seconds per (query, key) pair of prefill attention."""
    kv_token_bytes: float = 0.0
    num_kernels: int = 0
    num_attention_kernels: int = 0

    def token_linear_s(self, tokens: int, rows: int) -> float:
        return self.base_s + self.per_token_s * tokens if tokens else 0.0

    def decode_attention_s(self, num: int, kv_sum: float, q: int = 1) -> float:
        return self.per_kv_token_s * kv_sum if num else 0.0

    @staticmethod
    def prefill_attention_pairs(q: int, kv: int) -> float:
        # Causal: query i of the chunk sees kv - q + i + 1 keys.
        return q * (kv - q) + q * (q + 1) / 2

    def prefill_attention_s(self, q_len: int, kv_len: int) -> float:
        return (self.per_attention_pair_s * self.prefill_attention_pairs(q_len, kv_len)
                + self.per_kv_token_s * kv_len)

    def kv_bytes_per_token(self) -> float:
        return self.kv_token_bytes


# ---------------------------------------------------------------------------------------------
# Graph-based model

GraphCostFn = Callable[["OpGraph", float, float, float], np.ndarray]


def collective_s(kind: str, nbytes: float, group_size: int, cluster: ClusterSpec,
                 stride: int = 1) -> float:
    """Seconds of one collective over the cluster topology (``cost.collectives``)."""
    if group_size <= 1 and kind != "send_recv":
        return 0.0
    from charon_search.cost.collectives import collective_time

    return float(collective_time(kind, nbytes, group_size, cluster, stride=stride))


GRAPH_KERNEL_FLOOR_S = 1.7e-6
"""Seconds of one small kernel replayed in a CUDA graph (launch and inter-kernel gap
included): median 1.65 us of the 8 smallest elementwise kernels (384 B - 393 KB, 1.53-1.73 us)
timed by graph replay on an H200 (``data/profiles/measured/h200-sxm-141gb.prefill-grid.parquet``,
``charon-search profile``, 2026-11-29); the decode-shape rows of the same run agree (RoPE over
327,680 elements and a 262,144-element add: 2 us each)."""


def graph_cost_fn(cluster: ClusterSpec, *, tp_allreduce: str = "nccl") -> GraphCostFn:
    """Seconds per node of a graph at ``(b, s, c)``.

    Compute nodes: the fused cost model (profile -> predictor -> roofline); communication
    nodes: ``collective_s`` with the group's ranks adjacent (TP/EP inside a replica), except
    all-reduces inside one node when ``tp_allreduce`` names an engine with a measured custom
    all-reduce, and TensorRT-LLM's across the trays of an NVL72 NVLink domain
    (``serving.custom_allreduce``); the other NCCL collectives inside one NVLink node from the
    profile DB's NCCL rows (``cost.measured_collectives``).
    """
    from charon_search.cost.measured_collectives import cost_model_nccl_floor_s, cost_model_nccl_s
    from charon_search.cost.selector import default_cost_model
    from charon_search.serving.custom_allreduce import custom_allreduce_s, mnnvl_allreduce_s

    model = default_cost_model(cluster)
    inner = cluster.tiers[0]
    nvlink_domain = inner.num_devices if inner.fabric == "nvlink" else cluster.gpus_per_node

    def _comm(kind: str, nbytes: float, group: int) -> float:
        t = None
        if tp_allreduce != "nccl" and kind == "all_reduce" and group > 1:
            if group <= cluster.gpus_per_node:
                t = custom_allreduce_s(tp_allreduce, cluster.gpu.name, group, nbytes)
            elif group <= nvlink_domain:
                t = mnnvl_allreduce_s(tp_allreduce, cluster.gpu.name, group, nbytes)
        if t is None:
            t = cost_model_nccl_s(model, kind, nbytes, group, cluster)
        return t if t is not None else max(collective_s(kind, nbytes, group, cluster),
                                           cost_model_nccl_floor_s(model, kind, nbytes, group,
                                                                   cluster))

    launch_s = float(cluster.gpu.launch_overhead_s)

    def _cost(g: OpGraph, b: float, s: float, c: float) -> np.ndarray:
        detailed = model.cost_graph_detailed(g, b, s, c)
        out = np.array(detailed.durations_s, dtype=float)
        # Roofline-costed kernels carry the spec's eager launch overhead (launch + inter-kernel
        # gap without CUDA graphs); in a serving engine they run back to back (graph replay,
        # or host launching ahead of the GPU; the host bound of eager iterations is the
        # engine's ``kernel_launch_overhead_s``), so their floor is the graph-replay one.
        roof = np.fromiter((p == "roofline" for p in detailed.provenance), bool, len(out))
        if launch_s > GRAPH_KERNEL_FLOOR_S and roof.any():
            out[roof] = np.maximum(out[roof] - launch_s, 0.0) + GRAPH_KERNEL_FLOOR_S
        comm = np.flatnonzero(np.isnan(out))
        for i in comm:
            node = g.nodes[i]
            if node.is_comm:
                out[i] = _comm(node.kind.value, node.param("bytes")(b, s, c),
                               round(node.param("group_size")(b, s, c)))
            else:
                out[i] = 0.0
        return out

    return _cost


def _without_ep_a2a(graph: OpGraph) -> OpGraph:
    """Expert parallelism under tensor-parallel attention: every rank already holds all tokens
    (replicated by the attention all-reduce) and runs its local experts on the rows routed to
    them, so nothing is dispatched; the ranks' partial outputs are summed by one all-reduce of
    the block output (TensorRT-LLM ``FusedMoE.select_alltoall_method_type`` returns
    ``NotEnabled`` unless ``mapping.enable_attention_dp``, ``_torch/modules/fused_moe``). That
    all-reduce is the shared experts' when the block has one (``_fusion.shared_expert_allreduce``),
    else a new one with the attention all-reduce's message (tokens x hidden) replaces the
    combine all-to-all."""
    from charon_search.passes.tensor_parallel import is_activation_all_reduce
    from charon_search.serving._fusion import shared_expert_allreduce

    a2a = [n for n in graph.nodes if n.kind == OpKind.ALL_TO_ALL
           and n.name.startswith(("ep_dispatch_", "ep_combine_"))]
    if not a2a:
        return graph
    ar = next((n for n in graph.nodes if is_activation_all_reduce(n)), None)
    combine = [n for n in a2a if n.name.startswith("ep_combine_")]
    keep_one = ar is not None and combine and not shared_expert_allreduce(graph)
    out = []
    for n in graph.nodes:
        if n in a2a:
            if keep_one and ar is not None and n is combine[-1]:
                out.append(ar.replace(id=n.id, name=f"moe_ep_all_reduce_{ar.name}",
                                      inputs=n.inputs, outputs=n.outputs))
            continue
        out.append(n)
    return graph.with_nodes(out)


def _reads_kv8(graph: OpGraph, kv_dtype: str, engine: str) -> OpGraph:
    """A graph whose attention reads an 8-bit KV cache: its attention nodes are tagged with
    the cache's element type and the engine whose kernel reads it, which the cost model prices
    from that engine's measured fp8-cache rows (``cost.selector._kv8_rows``) or, without them,
    a decode from bf16 rows at the same KV bytes and a prompt at its bf16 price. The engines'
    decode kernels read an 8-bit cache natively (TensorRT-LLM's XQA; FlashInfer and its
    TensorRT-LLM-gen kernels, vLLM's FP8 KV path since vllm#7798 and SGLang's Blackwell
    default; FlashAttention 3; FlashMLA / trtllm_mla for MLA)."""
    from charon_search.cost.selector import ATTN_ENGINE_TAG, KV8_ENGINES, KV_CACHE_TAG

    tags = frozenset({f"{KV_CACHE_TAG}{kv_dtype}",
                      *((f"{ATTN_ENGINE_TAG}{engine}",) if engine in KV8_ENGINES else ())})
    return graph.with_nodes([n.replace(tags=n.tags | tags) if _is_attention(n) else n
                             for n in graph.nodes])


def _is_attention(node: object) -> bool:
    """Ops whose cost depends on (q_len, kv_len) per request, not on the token count (the DSA
    indexer's logits and top-k included)."""
    return getattr(node, "kind", None) in (OpKind.ATTENTION, OpKind.SPARSE_INDEXER) or getattr(
        node, "role", "") in (Role.ATTN_CORE, Role.ATTN_CORE.value)


class _Part:
    """Nodes of one block split into attention and token-linear sub-graphs.

    ``sliding`` of the block's ``count`` layers attend over a sliding window of ``window``
    keys (gpt-oss: every other layer, 128 keys); their attention kernels read and score only
    the window. ``attention_windowed`` is the attention graph with the causal mask dropped: a
    prompt chunk past the window's length sees exactly ``window`` keys per query."""

    __slots__ = ("attention", "attention_windowed", "count", "linear", "num_nodes", "sliding",
                 "window")

    def __init__(self, graph: OpGraph, count: int, *, sliding: int = 0, window: int = 0) -> None:
        attn = [n for n in graph.nodes if _is_attention(n)]
        lin = [n for n in graph.nodes if not _is_attention(n)]
        self.attention = graph.with_nodes(attn)
        self.linear = graph.with_nodes(lin)
        self.count = count
        self.num_nodes = len(graph.nodes)
        self.sliding = sliding if window > 0 else 0
        self.window = window
        self.attention_windowed = graph.with_nodes([
            n.replace(params={**n.params, "causal": Poly.const(0.0)})
            if "causal" in n.params else n for n in attn]) if self.sliding else self.attention

    def attention_s(self, sum_fn: Callable[[OpGraph, float, float, float], float], b: float,
                    q: float, kv: float, *, prefill: bool) -> float:
        """The attention of all ``count`` layers: full layers over ``kv`` keys, sliding ones
        over at most ``window`` (``sum_fn`` prices one layer's graph at ``(b, q, kv)``)."""
        full = self.count - self.sliding
        t = full * sum_fn(self.attention, b, q, kv) if full else 0.0
        if self.sliding:
            if kv <= self.window:
                t += self.sliding * sum_fn(self.attention, b, q, kv)
            elif prefill:  # every query of the chunk sees (about) the window: no mask
                t += self.sliding * sum_fn(self.attention_windowed, b, q, self.window)
            else:
                t += self.sliding * sum_fn(self.attention, b, q, self.window)
        return t


class GraphIterationCostModel(IterationCostModel):
    """Iteration latency from the traced, parallelized and costed prefill/decode graphs.

    Args:
        model: the served model.
        cluster: the replica's cluster (GPU type and topology).
        tp, pp, ep: parallel degrees of one replica.
        dp_attention: MoE DP-attention (attention replicated over the tp GPUs, each running
            1/tp of the requests with whole heads).
        precision: GEMM precision (``fp8`` runs GEMMs at the fp8 rate).
        kv_dtype: KV-cache element type.
        cost_fn: seconds per node (defaults to ``graph_cost_fn(cluster)``).
        fused_kernels: run the kernels an inference engine fuses (``serving._fusion``);
            False costs the traced ops one kernel each.
        tp_allreduce: ``nccl`` or the engine whose custom all-reduce runs the TP all-reduces
            inside a node (``graph_cost_fn``); ``trtllm`` also runs TensorRT-LLM's fused
            all-reduce + RMSNorm and RoPE-in-attention kernels (``_fusion.fuse_trtllm``).
        moe_kernel: the kernel of a 4-bit checkpoint's routed experts
            (``ServingConfig.moe_kernel``; "" = the engine's default).
    """

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, *, tp: int = 1, pp: int = 1,
                 ep: int = 1, dp_attention: bool = False, precision: str = "bf16",
                 kv_dtype: str = "bf16", cost_fn: GraphCostFn | None = None,
                 fused_kernels: bool = True, tp_allreduce: str = "nccl",
                 moe_kernel: str = "", allreduce_norm_fusion: bool = False) -> None:
        from charon_search.serving._graphs import serving_graphs

        self.model = model
        self.cluster = cluster
        self.tp, self.pp, self.ep = tp, pp, ep
        self.dp_attention = dp_attention
        self._cost = cost_fn or graph_cost_fn(cluster, tp_allreduce=tp_allreduce)
        prefill, decode = serving_graphs(model, tp=tp, pp=pp, ep=ep,
                                         dp_attention=dp_attention, precision=precision,
                                         fused_kernels=fused_kernels, engine=tp_allreduce,
                                         moe_kernel=moe_kernel)
        if fused_kernels and (tp_allreduce == "trtllm" or allreduce_norm_fusion):
            from charon_search.serving._fusion import fuse_trtllm

            ar_norm = tp > 1 and not dp_attention
            rope = tp_allreduce == "trtllm"
            prefill = {k: fuse_trtllm(g, allreduce_norm=ar_norm, rope_in_attention=rope)
                       for k, g in prefill.items()}
            decode = {k: fuse_trtllm(g, allreduce_norm=ar_norm, rope_in_attention=rope)
                      for k, g in decode.items()}
        if ep > 1 and not dp_attention:
            prefill = {k: _without_ep_a2a(g) for k, g in prefill.items()}
            decode = {k: _without_ep_a2a(g) for k, g in decode.items()}
        self._prefill_parts: list[_Part] = []
        self._decode_parts: list[_Part] = []
        self._head: _Part | None = None
        self._embed: _Part | None = None
        from charon_search.cost.selector import KV8_DTYPES

        if kv_dtype in KV8_DTYPES:
            prefill = {k: _reads_kv8(g, kv_dtype, tp_allreduce) for k, g in prefill.items()}
            decode = {k: _reads_kv8(g, kv_dtype, tp_allreduce) for k, g in decode.items()}
        window = model.sliding_window
        for name, graph in prefill.items():
            count = self._count(name)
            if name == "lm_head":
                self._head = _Part(graph, 1)
            elif name == "embedding":
                self._embed = _Part(graph, 1)
            else:
                sliding = self._sliding_layers(name, count)
                self._prefill_parts.append(_Part(graph, count, sliding=sliding, window=window))
                self._decode_parts.append(_Part(decode[name], count, sliding=sliding,
                                                window=window))
        if not self._prefill_parts:
            raise ConfigError(f"model {model.name}: the traced graph has no decoder blocks")
        self.num_kernels = sum(p.num_nodes * p.count for p in self._prefill_parts) + sum(
            p.num_nodes for p in (self._head, self._embed) if p is not None)
        self.num_attention_kernels = sum(len(p.attention.nodes) * p.count
                                         for p in self._prefill_parts)
        from charon_search.memory.serving import kv_bytes_per_token

        self._kv_token_bytes = kv_bytes_per_token(
            model, tp=1 if dp_attention else tp, num_layers=math.ceil(model.num_kv_layers / pp),
            kv_dtype=kv_dtype)
        self._pp_hop = self._pp_send_recv_fn()
        self._memo_linear: dict[int, float] = {}
        self._memo_head: dict[int, float] = {}
        self._memo_prefill_attn: dict[tuple[int, int], float] = {}
        self._memo_decode_attn: dict[tuple[int, int, int], float] = {}
        self._memo_mtp: dict[int, float] = {}
        self._memo_token_linear: dict[tuple[int, int], float] = {}

    def _count(self, name: str) -> int:
        if not self.model.layer_types:
            return self.model.num_layers
        return self.model.num_layers_of(name)

    def _sliding_layers(self, name: str, count: int) -> int:
        """How many of block type ``name``'s ``count`` layers use sliding-window attention
        (``ModelSpec.sliding_layers``)."""
        flags = self.model.sliding_layers
        if not flags:
            return 0
        blocks = tuple(self.model.layer_types) or (name,) * self.model.num_layers
        sliding = sum(1 for b, slides in zip(blocks, flags, strict=True)
                      if b == name and slides)
        # A pipeline stage holds its share of the block's layers (``count``).
        total = sum(1 for b in blocks if b == name) or 1
        return round(sliding * count / total)

    def _pp_send_recv_fn(self) -> Callable[[int], float]:
        if self.pp == 1:
            return lambda tokens: 0.0
        hidden_bytes = self.model.hidden_size * 2
        stride = self.tp
        return lambda tokens: (self.pp - 1) * collective_s(
            "send_recv", tokens * hidden_bytes, 2, self.cluster, stride=stride)

    def _sum(self, graph: OpGraph, b: float, s: float, c: float) -> float:
        if not graph.nodes:
            return 0.0
        return float(np.sum(self._cost(graph, b, s, c)))

    # -------------------------------------------------------------- memoized pieces
    def _linear_at(self, tokens: int) -> float:
        hit = self._memo_linear.get(tokens)
        if hit is None:
            hit = sum(p.count * self._sum(p.linear, 1, tokens, tokens)
                      for p in self._prefill_parts)
            if self._embed is not None:
                hit += self._sum(self._embed.linear, 1, tokens, tokens)
            hit += self._pp_hop(tokens)
            self._memo_linear[tokens] = hit
        return hit

    def rank_tokens(self, tokens: int) -> int:
        """Tokens one rank's token-linear ops see: each attention-DP rank runs its share."""
        return -(-tokens // self.tp) if self.dp_attention else tokens

    def linear_breakdown(self, tokens: int) -> list[tuple[str, str, str, float]]:
        """The decoder blocks' token-linear ops at ``tokens`` tokens (decode: one per running
        request), largest first: ``(node name, op kind, cost source, seconds summed over the
        layers)``. Their sum is ``linear_s(tokens)`` less the embedding and pipeline hops; the
        cost source is the fused model's provenance (``profile``, ``predictor``, ``roofline``)
        or ``collective`` for communication."""
        from charon_search.cost.selector import default_cost_model

        fused = default_cost_model(self.cluster)
        tokens = self.rank_tokens(tokens)
        total: dict[tuple[str, str, str], float] = {}
        for part in self._prefill_parts:
            g = part.linear
            if not g.nodes:
                continue
            secs = self._cost(g, 1, tokens, tokens)
            prov = fused.cost_graph_detailed(g, 1, tokens, tokens).provenance
            for node, t, src in zip(g.nodes, secs, prov, strict=True):
                key = (node.name, str(node.kind), src or "collective")
                total[key] = total.get(key, 0.0) + float(t) * part.count
        return sorted(((*k, v) for k, v in total.items()), key=lambda r: -r[3])

    def linear_s(self, tokens: int) -> float:
        """Token-linear ops of all layers (+ embedding, PP hops) at ``tokens`` tokens."""
        if tokens <= 0:
            return 0.0
        tokens = self.rank_tokens(tokens)
        lo, hi, w = grid_point(tokens)
        if w == 0.0:
            return self._linear_at(lo)
        return (1 - w) * self._linear_at(lo) + w * self._linear_at(hi)

    def _head_at(self, rows: int) -> float:
        hit = self._memo_head.get(rows)
        if hit is None:
            assert self._head is not None
            # The head runs on the last position of each sampled row: b = rows, s = 1.
            hit = self._sum(self._head.linear, rows, 1, 1) + self._sum(
                self._head.attention, rows, 1, 1)
            self._memo_head[rows] = hit
        return hit

    def head_s(self, rows: int) -> float:
        """Final norm + LM head over ``rows`` sampled positions."""
        if self._head is None or rows <= 0:
            return 0.0
        lo, hi, w = grid_point(rows)
        if w == 0.0:
            return self._head_at(lo)
        return (1 - w) * self._head_at(lo) + w * self._head_at(hi)

    def _prefill_attn_at(self, q: int, kv: int) -> float:
        key = (q, kv)
        hit = self._memo_prefill_attn.get(key)
        if hit is None:
            hit = sum(p.attention_s(self._sum, 1, q, max(kv, q), prefill=True)
                      for p in self._prefill_parts)
            self._memo_prefill_attn[key] = hit
        return hit

    def prefill_attention_s(self, q_len: int, kv_len: int) -> float:
        # 4 points per octave: causal attention work ~ q*kv - q^2/2 is nearly bilinear.
        return _bilinear(self._prefill_attn_at, q_len, max(kv_len, q_len), shift=3)

    def prefill_attention_total_s(self, chunks: Sequence[float]) -> float:
        """The prefill chunks of one iteration share one launch of each attention kernel: the
        serving engines' context attention takes the whole batch as variable-length sequences
        (FlashAttention ``varlen``, FlashInfer batch prefill, TensorRT-LLM's context FMHA over
        packed tokens), so a kernel's fixed cost (its time for a one-token prompt) is paid
        once per launch, not once per chunk; each chunk adds its time above that floor.

        Under attention DP each rank runs the attention of its own requests (whole heads) in
        its own launch: the iteration waits for the busiest of ``tp`` ranks, at least the
        longest chunk and at least an even share (balanced placement, as TensorRT-LLM's
        ``attention_dp_config`` balancing and SGLang's DP scheduler aim for)."""
        n = len(chunks)
        if n <= 1:
            return float(sum(chunks))
        ranks = min(n, self.tp) if self.dp_attention and self.tp > 1 else 1
        floor = min(self.prefill_attention_s(1, 1), min(chunks))
        total = float(sum(chunks)) - (n - ranks) * floor
        return max(total / ranks, max(chunks))

    def _decode_attn_at(self, n: int, kv: int, q: int) -> float:
        key = (n, kv, q)
        hit = self._memo_decode_attn.get(key)
        if hit is None:
            hit = sum(p.attention_s(self._sum, n, q, kv, prefill=False)
                      for p in self._decode_parts)
            self._memo_decode_attn[key] = hit
        return hit

    def decode_attention_s(self, num: int, kv_sum: float, q: int = 1) -> float:
        """Decode attention of ``num`` requests at their mean context (bilinear on the grid)."""
        if num <= 0:
            return 0.0
        if self.dp_attention and self.tp > 1:
            num = -(-num // self.tp)  # each attention-DP rank holds 1/tp of the requests
            kv_sum = kv_sum / self.tp
        # Bilinear on the (batch, mean context) grid.
        f = self._decode_attn_at
        x0, x1, wx = grid_point(num)
        y0, y1, wy = grid_point(max(1.0, kv_sum / num))
        v0 = (1 - wy) * f(x0, y0, q) + wy * f(x0, y1, q) if wy else f(x0, y0, q)
        if not wx:
            return v0
        v1 = (1 - wy) * f(x1, y0, q) + wy * f(x1, y1, q) if wy else f(x1, y0, q)
        return (1 - wx) * v0 + wx * v1

    def token_linear_s(self, tokens: int, rows: int) -> float:
        key = (tokens, rows)
        hit = self._memo_token_linear.get(key)
        if hit is None:
            hit = self.linear_s(tokens) + self.head_s(rows)
            if len(self._memo_token_linear) < 200_000:
                self._memo_token_linear[key] = hit
        return hit

    def _mtp_linear(self, tokens: int) -> float:
        """The token-linear ops of one decoder layer of the last block type (the MTP layer's)
        at ``tokens`` tokens, on the bucket grid."""
        key = bucket(tokens)
        hit = self._memo_mtp.get(key)
        if hit is None:
            hit = self._sum(self._prefill_parts[-1].linear, 1, key, key)
            self._memo_mtp[key] = hit
        return hit

    def _layers(self) -> int:
        return max(1, sum(p.count for p in self._decode_parts))

    def mtp_step_s(self, num_decode: int, decode_kv_sum: float) -> float:
        """One MTP head: one decoder layer of the last block type plus the LM head."""
        if num_decode <= 0:
            return 0.0
        key = bucket(num_decode)
        return (self._mtp_linear(self.rank_tokens(key)) + self.head_s(key)
                + self.decode_attention_s(num_decode, decode_kv_sum) / self._layers())

    def mtp_prefill_s(self, prefill: PrefillChunks) -> float:
        """The MTP layer over the prompt chunks: one decoder layer of the last block type over
        their tokens with one layer's share of their attention, and the LM head on each
        chunk's last token (its first proposal)."""
        tokens = sum(q for q, _ in prefill)
        if not tokens:
            return 0.0
        attn = self.prefill_attention_total_s([self.prefill_attention_s(q, kv)
                                               for q, kv in prefill])
        return (self._mtp_linear(self.rank_tokens(tokens)) + self.head_s(len(prefill))
                + attn / self._layers())

    def kv_bytes_per_token(self) -> float:
        return self._kv_token_bytes
