"""The fused cost model: exact profile hit -> trained predictor -> roofline, per node.

``FusedCostModel(cluster)`` prices the compute nodes of a graph on the cluster's GPU:

1. **profile** — the node's exact shape (after sharding passes) is in the profile DB for this
   GPU, op kind, family and dtype: the measured latency. MLA decode in absorbed form (one
   shared 576-wide latent KV head) has its own measured family, ``decode_mla``.
2. **predictor** — a model trained on this GPU's rows of that op kind (``cost/predictor.py``).
   ``attention_bwd`` without measurements is the forward prediction times
   ``ATTENTION_BWD_FLOP_RATIO`` (2.5: the backward does 2.5x the forward's matmul FLOPs —
   dQ, dK, dV, dP plus the recomputed P — at a similar efficiency; FlashAttention-2 paper,
   §3.1), recorded as provenance ``predictor`` with detail ``fwd-scaled``. Grouped GEMM nodes
   use the measured MoE expert-FFN throughput at the node's shape (detail ``moe-ffn-rate``).
   Routed experts of a quantized serving checkpoint (tags ``moe_dtype:<fmt>`` and
   ``moe_engine:<engine>``, ``serving._graphs``) use the measured rows of that kernel format
   on that engine under power-law routing (``moe_ffn_skew.<engine>``: the routing
   aiconfigurator prices serving with), else of the same format on another engine (vLLM,
   SGLang, TensorRT-LLM in that order), else the bf16 model at the node's weight bytes. A
   launch-chosen Marlin kernel (tag ``moe_engine:marlin``) uses ``moe_ffn_skew.marlin``, and
   vLLM's Triton fused MoE (tag ``moe_engine:vllm_triton``) ``moe_ffn_skew.vllm_triton``,
   vLLM's default rows where a GPU has no Triton rows;
   SGLang's wide-EP MoE (tag ``moe_engine:sglang_deepep``) the DeepEP low-latency rows up
   to ``DEEPEP_LL_MAX_TOKENS`` tokens per EP rank (decode) and the DeepEP normal-mode rows
   beyond (prefill: DeepGEMM's contiguous grouped GEMM), SGLang's fused-MoE rows where a GPU
   has neither.
   Gated DeltaNet (``linear_attention``) nodes interpolate the measured kernel rows at their
   heads in tokens (prefill) or sequences (decode), the layer's causal convolution included.
   DeepSeek Sparse Attention nodes (the ``sparse_indexer`` and a sparse ``attention`` node,
   ``Node.sparse_topk``) interpolate SGLang's measured GLM-5 kernel rows (``sparse_attention``:
   logits + top-k, sparse MLA) in (batch, keys) for decode and (new tokens, keys) for prefill;
   the decode logits are the node's roofline and the decode sparse MLA an MLA decode over its
   kept keys (the measured decode rows time the prefill kernels).
3. **roofline** — the ``roofline`` backend (``cost/roofline.py``).

Communication nodes are not priced here (``NaN`` / ``None``): the engine prices them with
``cost.collectives``. A GPU without measurements gets roofline only and a line in ``warnings``.

``cost_graph(graph, b, s, c)`` is vectorized: one ``predict`` per (op kind, family) per graph
and point, memoized on (graph identity, b, s, c).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from charon_search.cost.base import COST_BACKENDS, CostBackend, NodeCost, ShapePoint
from charon_search.cost.predictor import NUM_SMS, PREDICTED_KINDS, PredictorStore
from charon_search.cost.profile_db import SHAPE_KEYS, ProfileDB, default_profile_db
from charon_search.cost.roofline import TENSOR_CORE_KINDS
from charon_search.ir.ops import ATTENTION_BWD_FLOP_RATIO, CAUSAL_CONV_TAG, Role

if TYPE_CHECKING:
    from charon_search.hardware.spec import ClusterSpec, GpuSpec
    from charon_search.ir.graph import Node, OpGraph

__all__ = [
    "ATTENTION_BWD_FLOP_RATIO",
    "FusedCostModel",
    "GraphCost",
    "PredictorCostBackend",
    "ProfileCostBackend",
    "default_cost_model",
    "provenance_shares",
]

#: MLA heads of SGLang's measured GLM-5 sparse-attention rows (TP 1: all 64 heads).
DSA_ROW_HEADS = 64.0
# ATTENTION_BWD_FLOP_RATIO (charon_search.ir): backward/forward FLOP ratio of fused attention,
# used when no backward rows exist; the training coster adds the backward's lower FLOP rate
# (``cost.attention_kernels.BWD_THROUGHPUT_VS_FWD``).

_MEMO_SIZE = 4096
#: Matmul-like kinds (``roofline.TENSOR_CORE_KINDS``) as the strings nodes carry.
_TENSOR_KINDS = frozenset(str(k) for k in TENSOR_CORE_KINDS)


@dataclass(frozen=True, kw_only=True)
class GraphCost:
    """Per-node durations (s; NaN for comm nodes) and provenance of one graph at one point."""

    durations_s: np.ndarray
    provenance: tuple[str, ...]
    """Per node: ``profile``/``predictor``/``roofline``, or ``""`` for comm nodes."""

    def shares(self) -> dict[str, float]:
        """Fraction of the priced time per provenance."""
        return provenance_shares(self.durations_s, self.provenance)


def provenance_shares(durations_s: np.ndarray, provenance: Sequence[str]) -> dict[str, float]:
    """Fraction of total (non-NaN) duration costed by each provenance."""
    d = np.asarray(durations_s, dtype=float)
    ok = ~np.isnan(d)
    total = float(d[ok].sum())
    out: dict[str, float] = {}
    for dur, prov in zip(d[ok], np.asarray(provenance, dtype=object)[ok]):
        out[prov] = out.get(prov, 0.0) + float(dur)
    return {k: (v / total if total > 0 else 0.0) for k, v in sorted(out.items())}


#: Elementwise node role -> measured elementwise family (``cost/predictor.PREDICTED_KINDS``).
_ELEMENTWISE_FAMILY = {"residual": "add", "mlp.act": "act", "attn.rope": "rope"}


#: Head size of MLA decode in absorbed form (DeepSeek-V2/V3, Kimi-K2: kv_lora_rank 512 + rope
#: 64): every query head reads one shared latent KV head of this size.
MLA_HEAD_DIM = 576


def _family(kind: str, params: dict[str, float], role: str = "") -> str:
    if kind in ("attention", "attention_bwd"):
        if params.get("q_len", 2.0) != 1.0:
            return "prefill"
        mla = params.get("kv_heads") == 1.0 and params.get("head_dim") == MLA_HEAD_DIM
        return "decode_mla" if mla else "decode"
    if kind == "grouped_gemm":
        return "moe_ffn"
    if kind == "elementwise":
        return _ELEMENTWISE_FAMILY.get(str(role), "")
    return ""


#: Tag prefixes of an attention node (``serving.iteration_cost._reads_kv8``): the element type of
#: the KV cache it reads (``kv_cache:fp8``) and the engine whose kernel reads it
#: (``attn_engine:vllm``).
KV_CACHE_TAG, ATTN_ENGINE_TAG = "kv_cache:", "attn_engine:"
#: Decode attention over an 8-bit KV cache is priced from the engine's measured fp8-cache rows
#: (variant ``<family>.<engine>``, dtype ``fp8``, ``scripts/import_peers.py``) of the node's
#: decode family (``KV8_DECODE_FAMILIES``). The engines' kernels gain very differently over a
#: bf16 cache (aiconfigurator rows, 32 query / 4 KV heads, 32 requests at 4,096 keys:
#: TensorRT-LLM's XQA 0.54x the bf16 time on H200, vLLM's FlashAttention 3 0.79x, SGLang's FA3
#: 0.92x; on B200 vLLM's TRT-LLM-gen decode 0.65x, SGLang's ``trtllm_mha`` 0.79x; TensorRT-LLM's
#: MLA 1.08-1.75x the half-bytes price on Hopper). Where the GPU has no such rows, the bf16 rows
#: at the same KV bytes (the context times ``KV8_FALLBACK_SCALE``) time it. A prompt's attention
#: over an fp8 cache is priced from the engine's ``prefill.<engine>`` rows where measured (vLLM's
#: FlashAttention 3 dequantizing: 1.48x its bf16-cache time at 2k+ tokens on Hopper), else at
#: its bf16 price.
KV8_DECODE_FAMILIES = ("decode", "decode_mla")
KV8_FALLBACK_SCALE = 0.5
#: KV-cache element types one byte wide, and the engines with fp8-cache decode rows.
KV8_DTYPES = ("fp8", "int8")
KV8_ENGINES = ("vllm", "sglang", "trtllm")

#: Model family to try when a GPU has no rows of the node's own family.
_FALLBACK_FAMILY = {"moe_ffn": "moe_ffn_skew", "decode_mla": "decode", "add": "", "act": "",
                    "rope": ""}
#: Engines with quantized MoE rows (``moe_ffn_skew.<engine>``), in fallback order.
_MOE_ENGINES = ("vllm", "sglang", "trtllm")
#: SGLang's wide-EP decode kernel (DeepEP low-latency dispatch into DeepGEMM's masked grouped
#: GEMM), its prefill kernel (DeepEP normal-mode dispatch into DeepGEMM's contiguous grouped
#: GEMM: aiconfigurator's ``wideep_context_moe_perf`` rows) and the engine whose rows price the
#: batches where a GPU has no wide-EP rows (SGLang's fused MoE).
DEEPEP_FAMILY, DEEPEP_FALLBACK = "moe_ffn_skew.sglang_deepep", "moe_ffn_skew.sglang"
DEEPEP_NORMAL_FAMILY = "moe_ffn_skew.sglang_deepep_normal"
#: Tag of per-tensor fp8 experts that vLLM runs with ``Fp8MoEMethod`` (an ``fp8`` checkpoint,
#: or ``--quantization fp8``), whose default is the Triton fused MoE. vLLM's measured
#: per-tensor ``fp8`` rows time ModelOpt's FlashInfer CUTLASS method, which only ModelOpt
#: exports run: on Hopper (H100) they are 2.0-2.6x slower than bf16 from 1 to 16,384 tokens
#: (Mixtral's experts: 0.67 vs 0.26 ms at one token). Before Blackwell such experts take the
#: Triton rows (``moe_ffn_skew.vllm_triton``; H100 has only their block-scaled ones, the same
#: kernel with one scale per 128 x 128 block); Blackwell keeps vLLM's own rows.
FP8_MOE_METHOD_TAG = "moe_method:fp8"
#: Tokens per EP rank DeepEP's low-latency mode dispatches at most (SGLang
#: ``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK``, default 128; aiconfigurator's
#: ``wideep_generation_moe_perf`` rows stop there). Larger batches (prefill) run DeepEP's normal
#: mode (``DEEPEP_NORMAL_FAMILY``).
DEEPEP_LL_MAX_TOKENS = 128


def _moe_kernel(tags: frozenset[str]) -> tuple[str, str, int] | None:
    """(family, DB dtype, EP degree) of a routed-expert node tagged with its quantized kernel
    (``serving._graphs``), or None."""
    fmt = next((t[10:] for t in tags if t.startswith("moe_dtype:")), "")
    if not fmt:
        return None
    engine = next((t[11:] for t in tags if t.startswith("moe_engine:")), _MOE_ENGINES[0])
    ep = int(next((t[7:] for t in tags if t.startswith("moe_ep:")), "1"))
    return f"moe_ffn_skew.{engine}", fmt, ep


def _global_moe_shape(params: dict[str, float], ep: int) -> None:
    """One EP rank's expert shape (its ``tokens x top_k`` rows over its local experts) in the
    measured rows' convention: global tokens and experts, ``group_size`` = EP degree
    (aiconfigurator's MoE tables; ``shape_flops_bytes`` gives the same rows, weights and FLOPs).
    """
    if ep > 1 and "tokens" in params and "num_experts" in params:
        params["tokens"] *= ep
        params["num_experts"] *= ep
        params["group_size"] = float(ep)


def _moe_candidates(fam: str, dtype: str) -> list[tuple[str, str]]:
    """Quantized-MoE models to try after ``(fam, dtype)``: other engines' rows of the format
    (SGLang's own first for its DeepEP kernel), then the bf16 balanced-routing model (today's
    pricing, at the node's weight bytes)."""
    engines = [f"moe_ffn_skew.{e}" for e in _MOE_ENGINES]
    if fam in (DEEPEP_FAMILY, DEEPEP_NORMAL_FAMILY):
        engines = [DEEPEP_FALLBACK] + [e for e in engines if e != DEEPEP_FALLBACK]
    # The Triton fused MoE with per-tensor scales, where a GPU has only its block-scaled rows
    # (H100: vLLM 0.24's tables time per-tensor fp8 with ModelOpt's FlashInfer kernel only):
    # the same kernel, loading one scale per tensor instead of per 128x128 block.
    first = ([(fam, "fp8_block")] if fam == "moe_ffn_skew.vllm_triton" and dtype == "fp8"
             else [])
    return first + [(e, dtype) for e in engines if e != fam] + [
        ("moe_ffn", "bf16"), ("moe_ffn_skew", "bf16")]


#: Tag prefix of a dense GEMM whose checkpoint stores 128x128 block-scaled fp8 weights
#: (``serving._graphs``): ``gemm_rows:<engine>`` names whose measured ``fp8_block`` GEMM rows
#: (profile variant ``<engine>``) price it.
GEMM_ROWS_TAG = "gemm_rows:"
#: Engines with block-scaled fp8 GEMM rows, in fallback order (``scripts/import_peers.py``).
BLOCK_FP8_GEMM_ENGINES = ("sglang", "trtllm")


#: Element types whose tensor-core (matmul-like) nodes have no rows of their own and must not
#: take the bf16 ones: an fp32 matmul runs at the spec's ``fp32`` rate (PyTorch's default,
#: ``torch.backends.cuda.matmul.allow_tf32 = False``, is a CUDA-core SGEMM: 67 TFLOP/s on H100
#: against 989.5 for bf16), a ``tf32`` one at the TF32 tensor-core rate (494.5). The bf16 rows
#: would price them 2-15x too fast (``roofline`` prices them at their own peak instead).
FULL_PRECISION_DTYPES = frozenset({"fp32", "tf32"})


def _db_dtype(dtype: str, kind: str = "") -> str:
    """The DB dtype of a node's rows: fp16 runs at bf16 speed, and so do fp32 / tf32 nodes
    off the tensor cores (elementwise, norms: memory-bound, their bytes tell them apart); an
    fp32 / tf32 matmul keeps its own dtype (no rows: ``FULL_PRECISION_DTYPES``)."""
    if dtype in FULL_PRECISION_DTYPES and kind in _TENSOR_KINDS:
        return dtype
    return {"fp16": "bf16", "fp32": "bf16", "tf32": "bf16"}.get(dtype, dtype)


def _make_roofline() -> CostBackend | None:
    try:
        import charon_search.cost.roofline  # noqa: F401 - registers "roofline"

        return COST_BACKENDS.get("roofline")()
    except Exception:  # roofline module not present yet
        return None


def _token_rows(node: Node, params: dict[str, float], b: float, s: float
                ) -> dict[str, float]:
    """``rows`` (tokens, ``b * s``) and ``cols`` (elements per token) of an elementwise op
    whose ``numel`` is linear in ``b`` and in ``s``, as the measured rows give them: the
    engines' token-wise kernels run one thread block per token, so at few tokens the width sets
    the time. A residual add, an activation or RoPE has its hidden, ffn or q/k width per
    token; a dropout over attention scores (``b s c``) its heads x keys. Empty for any other
    op, whose width is unknown (the predictor's missing-value branches price it)."""
    numel = node.params.get("numel")
    tokens = b * s
    if (numel is None or tokens <= 0 or params.get("numel", 0.0) <= 0
            or numel.degree("b") != 1 or numel.degree("s") != 1):
        return {}
    return {"rows": tokens, "cols": params["numel"] / tokens}


class FusedCostModel:
    """Profile -> predictor -> roofline costing of compute nodes on ``cluster.gpu``.

    Args:
        cluster: the cluster (only its GPU matters here).
        db: profile DB; the shipped one by default (``None`` and no shipped DB: roofline only).
        store: predictor store; one over ``db`` by default.
        roofline: the fallback backend; the registered ``roofline`` backend by default.
        use_profile: allow exact profile hits.
        use_predictor: allow trained predictors.
    """

    def __init__(self, cluster: ClusterSpec, *, db: ProfileDB | None = None,
                 store: PredictorStore | None = None, roofline: CostBackend | None = None,
                 use_profile: bool = True, use_predictor: bool = True) -> None:
        self.cluster = cluster
        self.gpu: GpuSpec = cluster.gpu
        self.db = db if db is not None else default_profile_db()
        self.store = store if store is not None else (
            PredictorStore(self.db) if self.db is not None else None)
        self.roofline = roofline if roofline is not None else _make_roofline()
        if self.roofline is not None:
            self.roofline.prepare(cluster)
        self.use_profile = use_profile
        self.use_predictor = use_predictor
        self.warnings: list[str] = []
        self.gpu_key = (self.db.resolve_gpu(self.gpu.name, *self.gpu.aliases)
                        if self.db is not None else None)
        if self.gpu_key is None:
            self.warnings.append(f"no profile data for {self.gpu.name}; roofline only")
        self.num_sms = int(getattr(self.gpu, "num_sms", 0) or
                           NUM_SMS.get(self.gpu_key or "", 132))
        # key -> (graph, cost); holding the graph keeps its id() from being reused.
        self._memo: OrderedDict[tuple[Any, ...], tuple[OpGraph, GraphCost]] = OrderedDict()
        self._lock = threading.Lock()
        self._shape_cache: dict[tuple[str, str, str], dict[tuple[Any, ...], float]] = {}
        self._gdn_curves: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray] | None] = {}
        self._dsa_curves: dict[tuple[str, bool], dict[float, tuple[np.ndarray, np.ndarray]]] = {}
        self._gemm_rows_engine: dict[str, str | None] = {}  # GEMM_ROWS_TAG engine -> rows

    # ------------------------------------------------------------------ single node
    def cost(self, node: Node, point: ShapePoint) -> NodeCost | None:
        """Seconds and provenance for one node; None for communication nodes."""
        if node.is_comm:
            return None
        gc = self._cost_nodes([node], point.b, point.s, point.c)
        return NodeCost(duration_s=float(gc[0][0]), provenance=gc[1][0], detail=gc[2][0])

    # ------------------------------------------------------------------ whole graph
    def cost_graph(self, graph: OpGraph, b: float, s: float, c: float | None = None
                   ) -> np.ndarray:
        """Seconds per node of ``graph`` at ``(b, s, c)``; NaN for communication nodes.

        Memoized on (graph identity, b, s, c); see ``cost_graph_detailed`` for provenance.
        """
        return self.cost_graph_detailed(graph, b, s, c).durations_s

    def cost_graph_detailed(self, graph: OpGraph, b: float, s: float, c: float | None = None
                            ) -> GraphCost:
        """Durations and per-node provenance of ``graph`` at ``(b, s, c)`` (memoized)."""
        cc = s if c is None else c
        key = (id(graph), len(graph.nodes), float(b), float(s), float(cc))
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None and hit[0] is graph:
                self._memo.move_to_end(key)
                return hit[1]
        dur, prov, _ = self._cost_nodes(graph.nodes, b, s, cc, graph=graph)
        gc = GraphCost(durations_s=dur, provenance=tuple(prov))
        dur.setflags(write=False)
        with self._lock:
            self._memo[key] = (graph, gc)
            self._memo.move_to_end(key)
            while len(self._memo) > _MEMO_SIZE:
                self._memo.popitem(last=False)
        return gc

    # ------------------------------------------------------------------ implementation
    def _cost_nodes(self, nodes: Sequence[Node], b: float, s: float, c: float,
                    graph: OpGraph | None = None) -> tuple[np.ndarray, list[str], list[str]]:
        n = len(nodes)
        dur = np.full(n, np.nan)
        prov = [""] * n
        detail = [""] * n
        # Group compute nodes by (kind, family, dtype) for one batched predict per group.
        groups: dict[tuple[str, str, str], list[tuple[int, dict[str, float]]]] = {}
        profiled = self.gpu_key is not None and self.db is not None and self.use_profile
        scaled_c: dict[int, float] = {}  # node -> the context its (fallback) price sees
        for i, node in enumerate(nodes):
            if node.is_comm:
                continue
            kind = str(node.kind)
            cn = node.attended_c(c)  # sparse attention: its top-k keys
            params = {k: float(v(b, s, cn)) for k, v in node.params.items()}
            kv8 = self._kv8_rows(node.tags, kind, params) if node.tags else None
            if kv8 == "":
                # No measured fp8-cache rows of this kernel: bf16 rows at the same KV bytes.
                cn = scaled_c[i] = max(1.0, cn * KV8_FALLBACK_SCALE)
                params = {k: float(v(b, s, cn)) for k, v in node.params.items()}
            if kind == "elementwise":
                # Bytes moved distinguish fp32 from bf16 and 2-input from 1-input ops.
                nbytes = float(node.bytes(b, s, c))
                if nbytes > 0:
                    params["bytes"] = nbytes
                params.update(_token_rows(node, params, b, s))
            if (node.dtype in FULL_PRECISION_DTYPES and kind in _TENSOR_KINDS
                    and node.role != Role.MOE_ROUTER):
                # fp32 / tf32 matmuls: their own peak, never the bf16 rows (see the constant).
                # Not a router: HF's DeepSeek-V3 / Kimi / GLM code upcasts the router GEMM to
                # fp32, which the engines and Megatron run on bf16 inputs (vLLM's replicated
                # gate, TensorRT-LLM's dsv3_router_gemm_op, Megatron's moe_router_dtype
                # default); at the fp32 rate it added 11 % to DeepSeek-V3's H200 prefill.
                dur[i], prov[i], detail[i] = self._roofline(node, b, s, c)
                continue
            fam = _family(kind, params, node.role)
            dtype = _db_dtype(node.dtype)
            if kv8:
                fam, dtype = kv8, "fp8"
            if kind == "gemm" and node.tags:
                fam, dtype = self._gemm_rows(node.tags, fam, dtype)
            if kind == "grouped_gemm" and node.tags:
                moe = _moe_kernel(node.tags)
                if moe is not None:
                    fam, dtype = moe[0], moe[1]
                    if (FP8_MOE_METHOD_TAG in node.tags and fam == "moe_ffn_skew.vllm"
                            and "fp4" not in self.gpu.peak_flops_per_s):
                        fam = "moe_ffn_skew.vllm_triton"
                    if fam == DEEPEP_FAMILY and params.get("tokens", 0.0) > DEEPEP_LL_MAX_TOKENS:
                        fam = DEEPEP_NORMAL_FAMILY  # a prefill batch: DeepEP's normal mode
                    _global_moe_shape(params, moe[2])
            if profiled and (kind in ("linear_attention", "linear_attention_bwd")
                             or CAUSAL_CONV_TAG in node.tags):
                gdn = self._linear_attention_hit(kind, params, node.tags)
                if gdn is not None:
                    dur[i], prov[i], detail[i] = gdn[0], "profile", gdn[1]
                    continue
            if profiled and (kind == "sparse_indexer" or node.sparse_topk is not None):
                dsa = self._sparse_attention_hit(node, params, b, s, c)
                if dsa is not None:
                    dur[i], prov[i], detail[i] = dsa, "profile", "interp"
                    continue
            if profiled:
                hit = self._profile_hit(kind, fam, dtype, params)
                if hit is not None:
                    dur[i], prov[i], detail[i] = hit, "profile", "exact"
                    continue
                if kind == "attention_bwd":
                    # No backward rows: the measured forward at the same shape, scaled like
                    # the predictor path below (a measured forward beats a predicted one).
                    hit = self._profile_hit("attention", fam, dtype, params)
                    if hit is not None:
                        dur[i] = hit * ATTENTION_BWD_FLOP_RATIO
                        prov[i], detail[i] = "profile", "fwd-scaled"
                        continue
            groups.setdefault((kind, fam, dtype), []).append((i, params))
        roof_all: np.ndarray | None = None
        for (kind, fam, dtype), members in groups.items():
            pred_kind = "attention" if kind == "attention_bwd" else kind
            predictor = None
            if (self.use_predictor and self.store is not None and self.gpu_key is not None
                    and pred_kind in PREDICTED_KINDS):
                predictor = self.store.get(self.gpu_key, pred_kind, fam, dtype,
                                           num_sms=self.num_sms)
                alts = (_moe_candidates(fam, dtype) if fam.startswith("moe_ffn_skew.") else
                        ((_FALLBACK_FAMILY.get(fam), dtype), (fam, "bf16")))
                for alt_fam, alt_dtype in alts:
                    # e.g. fp8 attention has no rows: the bf16 model is the closest
                    # measurement; A100 MoE has only skewed-routing rows.
                    if predictor is None and alt_fam is not None:
                        predictor = self.store.get(self.gpu_key, pred_kind, alt_fam, alt_dtype,
                                                   num_sms=self.num_sms)
            if predictor is not None:
                idx = [i for i, _ in members]
                cols = {k: np.array([p.get(k, np.nan) for _, p in members])
                        for k in {k for _, p in members for k in p}}
                if kind == "grouped_gemm":
                    cols.setdefault("group_size", np.ones(len(idx)))
                secs = self._predict_cached(predictor, (kind, fam, dtype), members, cols)
                tag = "model"
                if kind == "attention_bwd":
                    secs = secs * ATTENTION_BWD_FLOP_RATIO
                    tag = "fwd-scaled"
                elif kind == "grouped_gemm":
                    tag = "moe-ffn-rate"
                    secs = self._grouped_gemm_from_ffn(secs, cols, [nodes[i] for i in idx],
                                                       b, s, c)
                for j, i in enumerate(idx):
                    dur[i], prov[i], detail[i] = float(secs[j]), "predictor", tag
                continue
            if graph is not None and roof_all is None:
                roof_all = self._roofline_graph(graph, b, s, c)
            for i, _ in members:
                if i in scaled_c:
                    dur[i], prov[i], detail[i] = self._roofline(nodes[i], b, s, scaled_c[i])
                elif roof_all is not None:
                    dur[i], prov[i], detail[i] = float(roof_all[i]), "roofline", ""
                else:
                    dur[i], prov[i], detail[i] = self._roofline(nodes[i], b, s, c)
        return dur, prov, detail

    def _predict_cached(self, predictor: Any, group: tuple[str, str, str],
                        members: list[tuple[int, dict[str, float]]],
                        cols: dict[str, np.ndarray]) -> np.ndarray:
        """Predictions per member, calling the model only for shapes not seen before.

        Search evaluates the same op shapes under many configurations, so most calls are
        dict hits and the (millisecond) sklearn ``predict`` runs once per new shape batch.
        """
        cache = self._shape_cache.setdefault(group, {})
        keys = [tuple(sorted(p.items())) for _, p in members]
        out = np.empty(len(members))
        missing = [j for j, k in enumerate(keys) if k not in cache]
        if missing:
            sub = {c: v[missing] for c, v in cols.items()}
            secs = predictor.predict(sub, len(missing))
            for j, sec in zip(missing, secs):
                cache[keys[j]] = float(sec)
            if len(cache) > 1_000_000:
                cache.clear()
        for j, k in enumerate(keys):
            out[j] = cache[k]
        return out

    def _roofline_graph(self, graph: OpGraph, b: float, s: float, c: float
                        ) -> np.ndarray | None:
        try:
            from charon_search.cost.roofline import roofline_times
        except ImportError:
            return None
        return roofline_times(graph, self.gpu, b, s, c)

    def _linear_attention_hit(self, kind: str, params: dict[str, float],
                              tags: frozenset[str]) -> tuple[float, str] | None:
        """Gated DeltaNet time from the measured kernel rows (``linear_attention`` table).

        A delta-rule node costs its kernel plus the layer's causal convolution, both at the
        node's heads and tokens: chunked prefill at ``b x q_len`` tokens (one sequence's rows,
        log-log interpolated in tokens, linear beyond the last row), recurrent decode at ``b``
        sequences; the backward is the forward times ``ATTENTION_BWD_FLOP_RATIO``. The
        convolution node itself then costs nothing here (detail ``in-delta-rule``). None when
        this GPU has no rows for the node's heads (roofline prices it)."""
        assert self.db is not None and self.gpu_key is not None
        if CAUSAL_CONV_TAG in tags:
            if not self.db.has(self.gpu_key, "linear_attention"):
                return None
            return 0.0, "in-delta-rule"
        decode = params.get("q_len") == 1.0 and kind == "linear_attention"
        heads = (params.get("heads"), params.get("k_heads"), params.get("head_dim"))
        x = params.get("batch", 1.0) * (1.0 if decode else params.get("q_len", 1.0))
        total = 0.0
        for variant in (("decode", "conv_decode") if decode else ("prefill", "conv_prefill")):
            curve = self._gdn_curve(variant, heads)
            if curve is None:
                return None
            xs, ys = curve
            if x >= xs[-1]:
                total += float(ys[-1] * x / xs[-1])
            else:
                total += float(np.exp(np.interp(np.log(max(x, xs[0])), np.log(xs),
                                                np.log(ys))))
        if kind == "linear_attention_bwd":
            return total * ATTENTION_BWD_FLOP_RATIO, "fwd-scaled"
        return total, "interp"

    def _sparse_attention_hit(self, node: Node, params: dict[str, float], b: float, s: float,
                              c: float) -> float | None:
        """DeepSeek Sparse Attention time from SGLang's measured GLM-5 kernels.

        The indexer (``sparse_indexer``) is the logits kernel over all ``kv_len`` keys plus the
        top-k, which runs only where a query has more than ``topk`` keys (the measured top-k
        rows are 0 ms otherwise: every key is kept). The sparse MLA (``attention`` with a
        ``topk`` param; ``kv_len`` already ``min(c, topk)``) of a prefill is the ``attn`` rows
        at the node's keys. Those rows are timed at GLM-5's 64 MLA heads (TP 1); fewer heads per
        rank cost the same (ASSUMED: FlashMLA's sparse kernels work on 64-head blocks, SGLang
        pads a TP rank's heads up to them, FlashMLA README / SGLang ``nsa_backend.py``), more
        scale in proportion. The indexer is replicated (all its heads on every rank).

        None (the caller's profile -> predictor -> roofline path) without rows, and for the
        decode sparse MLA: the ``attn`` rows time the prefill kernel (``flash_mla_sparse_fwd``
        with the heads padded to 128, aiconfigurator collector ``_bench_glm5_dsa_attn``), while
        SGLang decodes with FlashMLA's decode kernel (``flashmla_kv``), priced as the MLA decode
        attention it is over the ``min(c, topk)`` kept keys. Check against aiconfigurator's
        whole-module GLM-5-FP8 decode rows (``dsa_generation_module``, TP 8, H200, fp8 KV): the
        module grows by 21.9 us from 1 to 8,192 cached tokens at batch 4 and by 37.3 us from 1
        to 4,096 at batch 64; indexer + sparse MLA priced so grow by 19.3 and 55.8 us (with the
        ``attn`` rows: -2.3 and 16.1 us, on a 75 us offset that the module does not show)."""
        rows, q, kv = params.get("batch", 1.0), params.get("q_len", 1.0), params.get("kv_len", 1.0)
        decode = q <= 1.0
        if str(node.kind) == "sparse_indexer":
            if not self._dsa_curve("logits", decode):
                return None
            if decode:
                # SGLang decodes with DeepGEMM's paged logits kernel (``fp8_paged_mqa_logits``,
                # split over the SMs by ``get_paged_mqa_logits_metadata``); the measured decode
                # rows time the prefill kernel (``fp8_mqa_logits``, aiconfigurator collector
                # ``glm5_dsa_sparse_modules._bench_glm5_mqa``), whose time grows with one
                # query's keys whatever the batch (64 us at 4,097 keys for 4 and 64 sequences
                # on H200). The node's roofline (it reads b x c fp8 keys) stands in instead.
                t = self._roofline(node, b, s, c)[0]
            else:
                t = self._dsa_time("logits", rows, q, kv) or 0.0
            if kv > params.get("topk", 0.0):
                t += self._dsa_time("topk", rows, q, kv) or 0.0
            return t
        if decode:
            return None  # see the docstring
        attn = self._dsa_time("attn", rows, q, kv)
        if attn is None:
            return None
        return attn * max(params.get("heads", DSA_ROW_HEADS), DSA_ROW_HEADS) / DSA_ROW_HEADS

    def _dsa_time(self, variant: str, b: float, q: float, kv: float) -> float | None:
        """Seconds of one DSA kernel: decode (``q`` 1) rows of ``b`` sequences, prefill rows of
        one sequence of ``q`` new tokens times ``b``; linear in the outer coordinate (batch or
        new tokens; in proportion beyond the last row) and in the keys (beyond the last row,
        along the last two rows' slope)."""
        decode = q <= 1.0
        curves = self._dsa_curve(variant, decode)
        if not curves:
            return None
        xs = sorted(curves)
        x = b if decode else q

        def at(xv: float) -> float:
            keys, secs = curves[xv]
            if kv >= keys[-1] and keys.size > 1:
                slope = max(float((secs[-1] - secs[-2]) / (keys[-1] - keys[-2])), 0.0)
                return float(secs[-1] + slope * (kv - keys[-1]))
            return float(np.interp(kv, keys, secs))

        if x >= xs[-1]:
            t = at(xs[-1]) * x / xs[-1]
        elif x <= xs[0]:
            t = at(xs[0])
        else:
            hi = int(np.searchsorted(xs, x))
            x0, x1 = xs[hi - 1], xs[hi]
            w = (x - x0) / (x1 - x0)
            t = (1 - w) * at(x0) + w * at(x1)
        return t if decode else t * b

    def _dsa_curve(self, variant: str, decode: bool
                   ) -> dict[float, tuple[np.ndarray, np.ndarray]]:
        """Outer coordinate (decode: batch; prefill: new tokens, batch-1 rows) -> (keys,
        seconds) sorted, of one ``sparse_attention`` variant on this GPU ({} without rows)."""
        key = (variant, decode)
        if key in self._dsa_curves:
            return self._dsa_curves[key]
        assert self.db is not None and self.gpu_key is not None
        tbl = self.db.table(self.gpu_key, "sparse_attention")
        out: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        if tbl is not None:
            cols = tbl.select(variant=variant, dtype="fp8").columns
            ok = (cols["q_len"] == 1.0) if decode else ((cols["q_len"] > 1.0)
                                                        & (cols["batch"] == 1.0))
            outer = cols["batch" if decode else "q_len"][ok]
            keys, secs = cols["kv_len"][ok], cols["latency_s"][ok]
            for xv in np.unique(outer):
                m = outer == xv
                order = np.argsort(keys[m])
                out[float(xv)] = (keys[m][order], secs[m][order])
        self._dsa_curves[key] = out
        return out

    def _gdn_curve(self, variant: str, heads: tuple[float | None, ...]
                   ) -> tuple[np.ndarray, np.ndarray] | None:
        """(tokens or sequences, seconds) of one Gated DeltaNet kernel at these heads, sorted."""
        key = (variant, heads)
        if key in self._gdn_curves:
            return self._gdn_curves[key]
        assert self.db is not None and self.gpu_key is not None
        tbl = self.db.table(self.gpu_key, "linear_attention")
        curve = None
        if tbl is not None:
            cols = tbl.select(variant=variant, dtype="bf16").columns
            ok = ((cols["heads"] == heads[0]) & (cols["kv_heads"] == heads[1])
                  & (cols["head_dim"] == heads[2]))
            ok &= (cols["q_len"] == 1.0) if variant.endswith("decode") else (cols["batch"] == 1.0)
            x = cols["batch" if variant.endswith("decode") else "q_len"][ok]
            if x.size:
                order = np.argsort(x)
                curve = (x[order], cols["latency_s"][ok][order])
        self._gdn_curves[key] = curve
        return curve

    def _kv8_rows(self, tags: frozenset[str], kind: str, params: dict[str, float]
                  ) -> str | None:
        """For an attention node over an 8-bit KV cache (``KV_CACHE_TAG``): the family of its
        engine's measured fp8-cache rows on this GPU; else "" for a decode (the caller prices
        it at ``KV8_FALLBACK_SCALE`` of its context) and None for a prompt (its bf16 price) and
        for other nodes."""
        if not any(t.startswith(KV_CACHE_TAG) and t[len(KV_CACHE_TAG):] in KV8_DTYPES
                   for t in tags):
            return None
        engine = next((t[len(ATTN_ENGINE_TAG):] for t in tags
                       if t.startswith(ATTN_ENGINE_TAG)), "")
        base = _family(kind, params)
        family = f"{base}.{engine}"
        if (kind == "attention" and engine and base in (*KV8_DECODE_FAMILIES, "prefill")
                and self.store is not None and self.gpu_key is not None
                and (self.use_profile or self.use_predictor)
                and self.store.available(self.gpu_key, "attention", family, "fp8")):
            return family
        # A prompt's attention without rows keeps the bf16 price (its reads are the chunk's
        # own keys and values, not a long cache).
        return "" if base in KV8_DECODE_FAMILIES else None

    def _gemm_rows(self, tags: frozenset[str], fam: str, dtype: str) -> tuple[str, str]:
        """(variant, dtype) of the rows pricing a dense GEMM: for a block-scaled fp8 GEMM
        (``gemm_rows:<engine>``) the engine's measured ``fp8_block`` rows, else another
        engine's, else the per-tensor fp8 rows the node's dtype names."""
        want = next((t[len(GEMM_ROWS_TAG):] for t in tags if t.startswith(GEMM_ROWS_TAG)), "")
        if not want or self.store is None or self.gpu_key is None:
            return fam, dtype
        if want not in self._gemm_rows_engine:  # one index scan per engine, not per node
            self._gemm_rows_engine[want] = next(
                (e for e in (want, *(e for e in BLOCK_FP8_GEMM_ENGINES if e != want))
                 if self.store.available(self.gpu_key, "gemm", e, "fp8_block")), None)
        engine = self._gemm_rows_engine[want]
        return (engine, "fp8_block") if engine else (fam, dtype)

    def _profile_hit(self, kind: str, fam: str, dtype: str, params: dict[str, float]
                     ) -> float | None:
        assert self.db is not None and self.gpu_key is not None
        if kind not in ("gemm", "attention", "norm") or kind not in SHAPE_KEYS:
            return None  # elementwise/grouped rows are not keyed like IR nodes
        if not self.db.has(self.gpu_key, kind):
            return None
        variant = fam if kind in ("attention", "gemm") else ("rmsnorm" if kind == "norm" else "")
        if kind == "attention":
            if params.get("v_head_dim", params.get("head_dim")) != params.get("head_dim"):
                return None
            if fam == "prefill" and (params.get("q_len") != params.get("kv_len")
                                     or params.get("causal", 1.0) != 1.0):
                return None
        return self.db.exact(self.gpu_key, kind, variant, dtype, params)

    @staticmethod
    def _grouped_gemm_from_ffn(ffn_secs: np.ndarray, cols: dict[str, np.ndarray],
                               nodes: Sequence[Node], b: float, s: float, c: float
                               ) -> np.ndarray:
        """Node seconds = node FLOPs / (FFN FLOPs / FFN seconds) at the node's shape."""
        from charon_search.cost.predictor import shape_flops_bytes

        ffn_flops, _ = shape_flops_bytes("grouped_gemm", cols, len(nodes))
        node_flops = np.array([float(nd.flops(b, s, c)) for nd in nodes])
        node_flops = np.where(node_flops > 0, node_flops, ffn_flops / 3)
        return ffn_secs * node_flops / np.maximum(ffn_flops, 1.0)

    def _roofline(self, node: Node, b: float, s: float, c: float) -> tuple[float, str, str]:
        if self.roofline is None:
            raise RuntimeError("no roofline backend registered (charon_search.cost.roofline)")
        res = self.roofline.cost(node, ShapePoint(b=b, s=s, c=c), self.gpu)
        if res is None:
            return 0.0, "roofline", "uncovered"
        return res.duration_s, "roofline", res.detail


@COST_BACKENDS.register("profile")
class ProfileCostBackend(CostBackend):
    """Exact profile hits only (None for shapes not measured)."""

    name = "profile"
    _use_predictor = False

    def __init__(self, db: ProfileDB | None = None) -> None:
        self.db = db
        self._model: FusedCostModel | None = None

    def prepare(self, cluster: ClusterSpec) -> None:
        self._model = FusedCostModel(cluster, db=self.db, use_predictor=self._use_predictor)

    def _for(self, gpu: GpuSpec) -> FusedCostModel:
        """The fused model for ``gpu`` (a one-GPU cluster when ``prepare`` was not called)."""
        if self._model is None or self._model.gpu is not gpu:
            from charon_search.hardware.spec import ClusterSpec as _Cluster
            from charon_search.hardware.spec import TopologyTier

            tier = TopologyTier(name="node", num_devices=1, bandwidth_bytes_per_s=1.0,
                                latency_s=0.0)
            self.prepare(_Cluster(name=f"_{gpu.name}", gpu=gpu, num_gpus=1, gpus_per_node=1,
                                  tiers=(tier,)))
        assert self._model is not None
        return self._model

    def cost(self, node: Node, point: ShapePoint, gpu: GpuSpec) -> NodeCost | None:
        model = self._for(gpu)
        if node.is_comm or model.gpu_key is None:
            return None
        params = {k: float(v(point.b, point.s, point.c)) for k, v in node.params.items()}
        hit = model._profile_hit(str(node.kind), _family(str(node.kind), params, node.role),
                                 _db_dtype(node.dtype, "" if node.role == Role.MOE_ROUTER
                                           else str(node.kind)), params)
        return None if hit is None else NodeCost(duration_s=hit, provenance="profile",
                                                 detail="exact")


@COST_BACKENDS.register("predictor")
class PredictorCostBackend(ProfileCostBackend):
    """Profile hit, else the trained predictor (None where neither covers the node)."""

    name = "predictor"
    _use_predictor = True

    def cost(self, node: Node, point: ShapePoint, gpu: GpuSpec) -> NodeCost | None:
        model = self._for(gpu)
        if node.is_comm or model.gpu_key is None:
            return None
        res = model.cost(node, point)
        return res if res is not None and res.provenance != "roofline" else None


_DEFAULT: dict[str, FusedCostModel] = {}
_DEFAULT_LOCK = threading.Lock()


def default_cost_model(cluster: ClusterSpec) -> FusedCostModel:
    """The shipped-DB fused model for ``cluster``, cached per cluster name and GPU."""
    key = f"{cluster.name}|{cluster.gpu.name}"
    with _DEFAULT_LOCK:
        model = _DEFAULT.get(key)
        if model is None:
            model = FusedCostModel(cluster)
            _DEFAULT[key] = model
        return model
