"""Megatron-Core's fused MLA RoPE kernels (pass ``mla_rope``, on with ``Layout.mla_rope_fusion``).

A traced HF multi-latent-attention layer builds its query and key with plain tensor ops: RoPE on
the query's and the shared key's positional slices (rotate-half products), then
``new_empty`` + ``copy`` + ``slice_scatter`` to assemble the per-head key from ``k_nope`` and the
broadcast ``k_pe``. Autograd turns that into a chain of ``new_empty_strided`` / ``copy`` /
``clone`` / ``zeros_like`` / ``slice_scatter`` / ``cat`` kernels and separate RoPE backward ops,
each a full pass over the query or key.

Megatron-Core's ``MLASelfAttention`` runs two Triton kernels instead when ``apply_rope_fusion``
is set (its default; ``--no-rope-fusion`` turns it off):
``fused_apply_mla_rope_for_q`` (RoPE on the query's positional slice) and
``fused_apply_mla_rope_for_kv`` (splits ``kv`` into key and value and appends the roped
``k_pos_emb`` to the key), each with one fused backward kernel
(``megatron/core/fusions/fused_mla_yarn_rope_apply.py``, used by
``megatron/core/transformer/multi_latent_attention.py``).

The pass takes, for each MLA attention node (one of a module with the MLA down-projection
``kv_a_proj_with_mqa``; GLM-5's MLA has equal query/key and value head sizes, 256),
the tensor-op region between the projections and the attention (forward: the ancestors of the
attention's inputs up to the GEMMs and norms; backward: the ops fed only by the attention
backward's gradients and by each other, down to the projections' gradient GEMMs) and prices it
as one kernel that reads the region's external inputs and writes its external outputs, the rule
``passes.fusion`` applies to a fused RoPE or norm. The region's last op that hands a tensor out
carries that price; the others become zero-cost joins (``pass:mla_rope``) that keep the data
flow. Megatron's query kernel works in place on the positional slice, so the region's full
query read and write overstate it a little.
"""

from __future__ import annotations

from charon_search.ir import Node, OpGraph, OpKind, Poly
from charon_search.passes._rewrite import fold_region
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before
from charon_search.passes.fusion import external_tensors
from charon_search.passes.tensor_parallel import is_replicated_gemm

__all__ = ["MLARopeFusionPass", "mla_rope_region"]

#: Kinds of the tensor ops the fused kernels replace.
_REGION_KINDS = frozenset({OpKind.COPY, OpKind.ELEMENTWISE, OpKind.REDUCTION})
_ATTENTION_KINDS = frozenset({OpKind.ATTENTION, OpKind.ATTENTION_BWD})
JOIN_TARGET = "pass:mla_rope"


def _mla_modules(graph: OpGraph) -> frozenset[str]:
    """Module paths of the graph's MLA attention modules: those with the MLA key/value
    down-projection (``kv_a_proj_with_mqa``, the GEMM the TP pass keeps replicated)."""
    return frozenset(n.module_path.rpartition(".")[0] for n in graph.nodes
                     if n.kind == OpKind.GEMM and is_replicated_gemm(n)
                     and n.module_path.endswith("kv_a_proj_with_mqa"))


def _is_mla(node: Node, mla_modules: frozenset[str] = frozenset()) -> bool:
    """An attention node of multi-latent attention: its module has the MLA down-projection
    (``mla_modules``), or its value head size differs from the query's. The head sizes alone
    miss GLM-5 (query/key 192 + 64 = value 256)."""
    if node.kind not in _ATTENTION_KINDS:
        return False
    if node.module_path in mla_modules:
        return True
    p = node.params
    return "v_head_dim" in p and "head_dim" in p and p["v_head_dim"] != p["head_dim"]


def _in_region(node: Node) -> bool:
    return (node.kind in _REGION_KINDS and not node.is_comm
            and not node.target.startswith("pass:fp8"))


def mla_rope_region(graph: OpGraph, attn: Node) -> list[Node]:
    """The query/key assembly ops of MLA attention node ``attn`` (module docstring), in graph
    order: ancestors of its inputs through tensor ops and, for a backward node, the tensor ops
    fed only by its gradients and by each other."""
    producer, index = graph.producer, graph.node_index
    region: set[int] = set()
    stack = list(attn.inputs)
    while stack:
        t = stack.pop()
        nid = producer.get(t)
        if nid is None or nid in region:
            continue
        n = graph.node(nid)
        if _in_region(n):
            region.add(nid)
            stack.extend(n.inputs)
    if attn.kind == OpKind.ATTENTION_BWD:
        reach = set(attn.outputs)
        for n in graph.nodes[index[attn.id] + 1:]:
            if not _in_region(n) or not any(t in reach for t in n.inputs):
                continue
            # fed by the gradients and the region only (or by tensors from outside the graph:
            # saved activations, the RoPE tables), not by another op of this graph
            if any(t not in reach and t in producer for t in n.inputs):
                continue
            region.add(n.id)
            reach.update(n.outputs)
    return [n for n in graph.nodes if n.id in region]


def _fused(graph: OpGraph, region: list[Node]) -> dict[int, Node]:
    """Replacement nodes for ``region``: one carrier with the fused kernel's bytes, joins."""
    ext_in, ext_out = external_tensors(graph, region)
    handed_out = set(ext_out)
    # The last op that hands a tensor out: by then the region's inputs all exist (the forward's
    # key assembly comes after the kv up-projection it reads).
    carrier = next((n for n in reversed(region) if handed_out.intersection(n.outputs)),
                   region[-1])
    return fold_region(
        region, carrier, join_target=JOIN_TARGET, tag="mla_rope",
        name=f"fused_mla_rope_{carrier.name}", kind=OpKind.COPY,
        flops=sum((m.flops for m in region), Poly()),
        bytes_read=sum((graph.tensors[t].nbytes for t in ext_in), Poly()),
        bytes_written=sum((graph.tensors[t].nbytes for t in ext_out), Poly()),
        params={"numel": sum((graph.tensors[t].numel for t in ext_out), Poly())},
        target="pass:fusion")


@PASSES.register("mla_rope")
class MLARopeFusionPass(Pass):
    name = "mla_rope"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.mla_rope_fusion

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        replace: dict[int, Node] = {}
        mla = _mla_modules(graph)
        for attn in graph.nodes:
            if not _is_mla(attn, mla):
                continue
            region = [n for n in mla_rope_region(graph, attn) if n.id not in replace]
            if region:
                replace.update(_fused(graph, region))
        if not replace:
            return PassResult(graph, False)
        return PassResult(graph.with_nodes([replace.get(n.id, n) for n in graph.nodes]), True)


must_run_before("fusion", "mla_rope")
# eager_attention replaces the attention nodes the region is found from (Megatron's unfused
# core attention still runs the fused RoPE kernels).
for _after in ("eager_attention", "fp8", "tp", "ep", "cp", "recompute"):
    must_run_before("mla_rope", _after)
