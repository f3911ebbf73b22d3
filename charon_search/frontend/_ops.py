"""ATen op -> ``OpKind`` mapping and per-op FLOP formulas over ``Poly`` shapes.

FLOP formulas follow ``torch.utils.flop_counter`` (mm/addmm/bmm: 2·m·n·k; SDPA forward:
2·b·h·s·c·(d + d_v), i.e. 4·b·h·s·c·d when d_v = d; SDPA backward: 2.5 × forward).
NB: like ``flop_counter`` we do not discount causal attention: the full ``s × c`` product is
counted and the node carries ``causal=1`` so a cost model can halve it if it wants.
Pointwise ops count one FLOP per output element (``flop_counter`` counts none); reductions one
per input element; softmax five per element. Casts, copies and creations count zero.
"""

from __future__ import annotations

from charon_search.ir import OpKind

__all__ = [
    "ATTENTION_BWD_OPS",
    "ATTENTION_FWD_OPS",
    "CREATION_OPS",
    "VIEW_OPS",
    "classify",
]

#: Ops whose output aliases their (first) input: dropped, their outputs rewired to the base.
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand",
    "unsqueeze", "squeeze", "detach", "alias", "slice", "select", "as_strided", "split",
    "split_with_sizes", "unbind", "chunk", "view_as_real", "view_as_complex", "diagonal",
    "unfold", "narrow", "expand_as", "view_as", "lift_fresh", "_conj", "unsafe_split",
    "unsafe_split_with_sizes", "movedim", "numpy_T", "squeeze_", "unsqueeze_", "t_",
})

ATTENTION_FWD_OPS = frozenset({
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
    "_efficient_attention_forward", "scaled_dot_product_attention",
})
ATTENTION_BWD_OPS = frozenset({
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable_backward", "_flash_attention_backward",
    "_efficient_attention_backward",
})

#: ``charon::`` stand-ins of the Gated DeltaNet kernels (``frontend._linear_attn``).
LINEAR_ATTENTION_FWD_OPS = frozenset({"gated_delta_rule"})
LINEAR_ATTENTION_BWD_OPS = frozenset({"gated_delta_rule_backward"})
#: ``charon::`` stand-ins of DeepSeek Sparse Attention's kernels (``frontend._dsa``): the
#: lightning indexer (logits + top-k) and the sparse MLA over the selected keys.
SPARSE_INDEXER_OPS = frozenset({"dsa_indexer"})
SPARSE_ATTENTION_OPS = frozenset({"sparse_mla"})
#: Depthwise causal convolutions (elementwise-like: ``2 x width`` FLOPs per output element).
CAUSAL_CONV_OPS = frozenset({"causal_conv1d", "causal_conv1d_backward"})

GEMM_OPS = frozenset({"mm", "addmm", "linear", "_addmm_activation"})
BGEMM_OPS = frozenset({"bmm", "baddbmm"})
GROUPED_OPS = frozenset({"_grouped_mm", "grouped_mm", "_scaled_grouped_mm"})
NORM_OPS = frozenset({
    "native_layer_norm", "native_layer_norm_backward", "layer_norm", "rms_norm",
    "_fused_rms_norm", "_fused_rms_norm_backward", "native_group_norm",
})
SOFTMAX_OPS = frozenset({
    "_softmax", "softmax", "_log_softmax", "log_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data",
})
EMBEDDING_OPS = frozenset({"embedding", "embedding_dense_backward", "embedding_backward"})
ROUTING_OPS = frozenset({
    "topk", "sort", "argsort", "histc", "bincount", "cumsum", "scatter", "scatter_add",
    "scatter_reduce", "gather", "index_add", "one_hot", "nonzero", "unique", "index_put",
    "masked_scatter", "_unique2", "searchsorted",
})
COPY_OPS = frozenset({
    "clone", "cat", "index", "_unsafe_index", "index_select", "contiguous", "copy",
    "slice_scatter", "select_scatter", "constant_pad_nd", "slice_backward", "select_backward",
    "stack", "repeat", "repeat_interleave", "gather", "scatter", "index_put", "index_add",
    "scatter_add", "roll", "flip", "_index_put_impl", "new_empty_strided", "as_strided_scatter",
    "diagonal_backward", "index_copy", "masked_select", "split_with_sizes_copy", "unbind_copy",
    "pad", "narrow_copy",
})
CAST_OPS = frozenset({"_to_copy", "to", "type_as", "_to_dtype"})
REDUCTION_OPS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean", "norm",
    "linalg_vector_norm", "any", "all", "argmax", "argmin", "logsumexp", "nll_loss_forward",
    "nll_loss2d_forward",
})
CREATION_OPS = frozenset({
    "arange", "full", "zeros", "ones", "empty", "scalar_tensor", "ones_like", "zeros_like",
    "full_like", "empty_like", "new_ones", "new_zeros", "new_full", "new_empty", "randint",
    "rand", "randn", "empty_strided", "rand_like", "randn_like", "_tensor_constant", "tensor",
    "bernoulli", "eye", "linspace", "tril_indices", "triu_indices",
})


def op_base(target: object) -> str:
    """``aten.mm.default`` -> ``mm``; strips the trailing ``_`` of in-place variants."""
    name = getattr(target, "_opname", None)
    if name is None:
        name = str(target).split(".")[1] if str(target).startswith("aten.") else str(target)
    if name.endswith("_") and not name.startswith("_") and name not in VIEW_OPS:
        name = name[:-1]
    return name


def classify(base: str, *, in_moe: bool) -> OpKind:
    """The ``OpKind`` of an ATen op by its base name."""
    if base in GEMM_OPS:
        return OpKind.GEMM
    if base in BGEMM_OPS:
        return OpKind.BATCHED_GEMM
    if base in GROUPED_OPS:
        return OpKind.GROUPED_GEMM
    if base in ATTENTION_FWD_OPS or base in SPARSE_ATTENTION_OPS:
        return OpKind.ATTENTION
    if base in SPARSE_INDEXER_OPS:
        return OpKind.SPARSE_INDEXER
    if base in ATTENTION_BWD_OPS:
        return OpKind.ATTENTION_BWD
    if base in LINEAR_ATTENTION_FWD_OPS:
        return OpKind.LINEAR_ATTENTION
    if base in LINEAR_ATTENTION_BWD_OPS:
        return OpKind.LINEAR_ATTENTION_BWD
    if base in NORM_OPS:
        return OpKind.NORM
    if base in SOFTMAX_OPS:
        return OpKind.SOFTMAX
    if base in EMBEDDING_OPS:
        return OpKind.EMBEDDING
    if in_moe and base in ROUTING_OPS:
        return OpKind.MOE_ROUTING
    if base in COPY_OPS:
        return OpKind.COPY
    if base in ROUTING_OPS:
        return OpKind.COPY if base not in ("topk", "sort", "argsort", "cumsum") else \
            OpKind.REDUCTION
    if base in REDUCTION_OPS or base.startswith(("nll_loss", "_fused_cross_entropy")):
        return OpKind.REDUCTION
    return OpKind.ELEMENTWISE
