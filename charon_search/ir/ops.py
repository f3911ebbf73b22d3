"""The op-kind vocabulary of the IR and the shape parameters each kind carries.

Every traced ATen op maps to one ``OpKind``; cost backends key on the kind. ``Node.params``
holds the kind's shape parameters (symbolic ``Poly`` values) under the names listed in
``PARAMS_BY_KIND``, so backends never parse tensor shapes themselves.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ATTENTION_BWD_FLOP_RATIO", "CAUSAL_CONV_TAG", "COMM_KINDS", "COMPUTE_KINDS",
           "DSA_SCALE_BLOCK", "DSA_SCALE_BYTES", "PARAMS_BY_KIND",
           "SPARSE_TOPK_PARAM", "OpKind", "Phase", "Role"]

#: FLOPs of a fused attention backward over its forward's matmul FLOPs: the backward runs
#: the matmuls for dV, dP, dQ and dK plus the recomputed scores P (5 matmuls against the
#: forward's 2), FlashAttention-2 paper (Dao, arXiv 2307.08691, sec. 3.1: "the backward pass
#: ... 2.5x the FLOPs of the forward pass"). One constant for the frontend, the passes and the
#: cost models (``ATTENTION_BWD`` nodes, and the price of a backward without measured rows).
ATTENTION_BWD_FLOP_RATIO = 2.5


class OpKind(StrEnum):
    GEMM = "gemm"
    """Dense matmul ``[m, k] x [k, n]`` (linear layers, including their backward GEMMs)."""
    BATCHED_GEMM = "bgemm"
    """Batched matmul ``batch x [m, k] x [k, n]`` (unfused attention scores, MLA absorb)."""
    ATTENTION = "attention"
    """Fused scaled-dot-product / flash attention forward (prefill, decode, training)."""
    ATTENTION_BWD = "attention_bwd"
    """Fused attention backward."""
    LINEAR_ATTENTION = "linear_attention"
    """Gated DeltaNet core (chunked in prefill and training, recurrent in decode): cost linear in
    the tokens, plus one ``d_k x d_v`` fp32 state per value head and sequence."""
    LINEAR_ATTENTION_BWD = "linear_attention_bwd"
    """Gated DeltaNet core backward."""
    SPARSE_INDEXER = "sparse_indexer"
    """DeepSeek Sparse Attention lightning indexer: per (query, key) pair the ReLU'd dot
    products of ``heads`` indexer query heads with one key head, head-weighted and summed
    (DeepGEMM ``fp8_mqa_logits`` / ``fp8_paged_mqa_logits``), then the top-``topk`` keys per
    query (SGLang ``fast_topk_transform_fused``). Inference only."""
    NORM = "norm"
    """RMSNorm / LayerNorm (forward or backward)."""
    ELEMENTWISE = "elementwise"
    """Pointwise ops: activations, residual adds, RoPE arithmetic, casts, dropout."""
    SOFTMAX = "softmax"
    REDUCTION = "reduction"
    """Sums / means over a dim that are not part of a norm (e.g. bias gradients)."""
    EMBEDDING = "embedding"
    """Embedding lookup (forward) or its scatter-add backward."""
    MOE_ROUTING = "moe_routing"
    """Router top-k, token sort / scatter / gather around the experts."""
    GROUPED_GEMM = "grouped_gemm"
    """Expert GEMMs: ``tokens * top_k`` rows spread over ``num_experts`` weight matrices."""
    COPY = "copy"
    """Materialising copies (contiguous, cat, index) that move bytes without arithmetic."""
    OPTIMIZER = "optimizer"
    """Optimizer step over a parameter shard (memory bound)."""
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"
    OTHER = "other"


class Phase(StrEnum):
    FORWARD = "fwd"
    BACKWARD = "bwd"
    RECOMPUTE = "recompute"
    OPTIMIZER = "optimizer"


class Role(StrEnum):
    """What an op does in the architecture, independent of HF module names.

    The frontend sets it from the module path (forward and backward ops alike); TP/SP/CP/EP
    passes, recompute and the memory model key on it.
    """

    EMBED = "embed"
    """Token (and position) embedding."""
    ATTN_NORM = "attn.norm"
    """Pre-attention norm (input_layernorm / ln_1)."""
    ATTN_QKV = "attn.qkv"
    """Q/K/V projections (column parallel), including MLA down/up projections."""
    ATTN_QK_NORM = "attn.qk_norm"
    """Per-head q/k norms (Qwen3)."""
    ATTN_ROPE = "attn.rope"
    ATTN_CORE = "attn.core"
    """Scores, softmax, context: the part selective recompute recomputes."""
    ATTN_INDEXER = "attn.indexer"
    """DeepSeek Sparse Attention's lightning indexer (projections, key norm, RoPE, logits and
    top-k): replicated on every TP rank, as SGLang and vLLM run it (``ReplicatedLinear``
    projections, all indexer heads on each rank: SGLang ``nsa/nsa_indexer.py``)."""
    ATTN_OUT = "attn.out"
    """Output projection (row parallel)."""
    MLP_NORM = "mlp.norm"
    """Pre-MLP norm (post_attention_layernorm / ln_2)."""
    MLP_IN = "mlp.in"
    """Gate/up (or fc1) projection (column parallel)."""
    MLP_ACT = "mlp.act"
    """Activation (SiLU·gate, GELU)."""
    MLP_OUT = "mlp.out"
    """Down (or fc2) projection (row parallel)."""
    MOE_ROUTER = "moe.router"
    """Router GEMM, top-k, softmax/sigmoid scoring."""
    MOE_DISPATCH = "moe.dispatch"
    """Token permutation to experts (and the EP all-to-all once EP is applied)."""
    MOE_EXPERT = "moe.expert"
    """Routed expert grouped GEMMs and their activation."""
    MOE_COMBINE = "moe.combine"
    """Un-permutation and weighted sum of expert outputs (and the EP all-to-all)."""
    MOE_SHARED = "moe.shared"
    """Shared experts (a dense MLP inside the MoE block)."""
    RESIDUAL = "residual"
    """Residual adds between sub-blocks."""
    FINAL_NORM = "final_norm"
    LM_HEAD = "lm_head"
    """Output projection to the vocabulary (column parallel over vocab)."""
    LOSS = "loss"
    """Cross-entropy over the logits."""
    COMM = "comm"
    """Communication inserted by a pass."""
    OPTIMIZER = "optimizer"
    OTHER = ""


COMM_KINDS = frozenset(
    {OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.ALL_TO_ALL,
     OpKind.SEND_RECV}
)
COMPUTE_KINDS = frozenset(k for k in OpKind if k not in COMM_KINDS)

#: Tag of a Gated DeltaNet layer's causal-convolution node: ``cost.selector`` charges its
#: measured time to the layer's delta-rule node (``LINEAR_ATTENTION``).
CAUSAL_CONV_TAG = "causal_conv1d"

#: Tag of an ``EMBEDDING`` lookup (and its gradient) in a table that is not the vocabulary:
#: learned position embeddings (GPT-2's ``wpe``, OPT's ``embed_positions``). Megatron keeps
#: them as a plain ``torch.nn.Embedding`` on every TP rank (``language_model.Embedding``:
#: ``position_embeddings``), beside the vocab-parallel word embeddings.
POSITION_TABLE_TAG = "position_table"

#: Param of an ``ATTENTION`` node that attends only the top-``topk`` keys of each query
#: (DeepSeek Sparse Attention): the node costs ``min(kv_len, topk)`` keys per query
#: (``Node.attended_c``), its FLOPs and bytes are traced linear in ``c``.
SPARSE_TOPK_PARAM = "topk"

#: DeepSeek Sparse Attention's fp8 caches (the indexer keys, an fp8 latent) carry one fp32
#: scale (``DSA_SCALE_BYTES``) per ``DSA_SCALE_BLOCK`` fp8 values. The indexer key cache holds
#: per token and layer one ``index_head_dim`` (128) key so: ``index_head_dim + index_head_dim
#: // quant_block_size * 4`` = 132 bytes (SGLang ``NSATokenToKVPool.index_k_with_scale_buffer``,
#: ``python/sglang/srt/mem_cache/memory_pool.py``; TensorRT-LLM's DSA cache manager sizes it the
#: same way).
DSA_SCALE_BYTES = 4
DSA_SCALE_BLOCK = 128

#: Shape parameters per kind (keys of ``Node.params``). All values are ``Poly``.
PARAMS_BY_KIND: dict[OpKind, tuple[str, ...]] = {
    OpKind.GEMM: ("m", "n", "k"),
    OpKind.BATCHED_GEMM: ("batch", "m", "n", "k"),
    # causal is 1 or 0; v_head_dim differs from head_dim for MLA.
    OpKind.ATTENTION: ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim",
                       "v_head_dim", "causal"),
    OpKind.ATTENTION_BWD: ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim",
                           "v_head_dim", "causal"),
    # heads / k_heads: value and query-key heads; state is 1 when the op reads a recurrent state.
    OpKind.LINEAR_ATTENTION: ("batch", "heads", "k_heads", "q_len", "head_dim", "v_head_dim",
                              "state"),
    OpKind.LINEAR_ATTENTION_BWD: ("batch", "heads", "k_heads", "q_len", "head_dim",
                                  "v_head_dim", "state"),
    # heads / head_dim: the indexer's query heads and head dim (one key head); topk: keys kept.
    OpKind.SPARSE_INDEXER: ("batch", "heads", "q_len", "kv_len", "head_dim", "topk"),
    OpKind.NORM: ("rows", "cols"),
    OpKind.SOFTMAX: ("rows", "cols"),
    OpKind.ELEMENTWISE: ("numel",),
    OpKind.REDUCTION: ("numel",),
    OpKind.EMBEDDING: ("tokens", "hidden", "vocab"),
    OpKind.MOE_ROUTING: ("tokens", "num_experts", "top_k"),
    # tokens is the routed row count before top-k duplication; rows = tokens * top_k.
    OpKind.GROUPED_GEMM: ("tokens", "top_k", "num_experts", "n", "k"),
    OpKind.COPY: ("numel",),
    OpKind.OPTIMIZER: ("numel",),
    # Collectives: message bytes per rank (the full buffer of an all-reduce, the gathered
    # output of an all-gather, the input of a reduce-scatter) and the group size.
    OpKind.ALL_REDUCE: ("bytes", "group_size"),
    OpKind.ALL_GATHER: ("bytes", "group_size"),
    OpKind.REDUCE_SCATTER: ("bytes", "group_size"),
    OpKind.ALL_TO_ALL: ("bytes", "group_size"),
    OpKind.SEND_RECV: ("bytes", "group_size"),
    OpKind.OTHER: (),
}
