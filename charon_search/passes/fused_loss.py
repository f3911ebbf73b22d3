"""A fused cross-entropy kernel (pass ``fused_loss``, on with ``Layout.loss_kernel = "fused"``).

The traced HF model computes its loss with ``nn.CrossEntropyLoss`` under autocast: the bf16
logits are cast to fp32 (``_to_copy``), ``_log_softmax`` reads that copy three times (ATen's
multi-pass kernel for rows longer than shared memory, ``frontend._convert``) and writes the
fp32 log-probabilities, which ``nll_loss_forward`` indexes; the backward zero-fills an fp32
gradient (``nll_loss_backward``), ``_log_softmax_backward_data`` reads it and the saved
log-probabilities, and a cast writes the bf16 gradient the LM head's GEMMs read. About 52 bytes
move per logit.

Frameworks that fuse the loss run one kernel per direction on the bf16 logits instead:

* llm-foundry's MPT (``ComposerMPTCausalLM``: ``loss_fn`` defaults to ``fused_crossentropy``,
  flash-attn's ``CrossEntropyLoss``; its CUDA ``xentropy`` forward reduces each row twice, for
  the max and for the sum of exponentials, and its backward reads the logits once and writes
  the gradient);
* the loss compiled with the model by Inductor (torchtitan from 2025, ``build_cross_entropy_
  loss``: ``torch.compile(loss_fn)``): a looped row reduction (max, then the sum of
  exponentials) upcasting on load, and a backward kernel that recomputes the softmax from the
  saved per-row log-sum-exp.

The pass takes the block's loss ops (``Role.LOSS``: the casts, softmax and NLL ops on the
logits, not the label shift on the integer targets) and prices them as one kernel per
direction. Forward: reads the logits twice and the labels once, writes a per-row fp32
log-sum-exp and the loss. Backward: reads the logits once (saved by the forward, outside the
backward graph) and the log-sum-exp, writes the gradient at the logits' dtype. The last loss op
carries the price; the others become zero-cost joins (``pass:fused_loss``) that keep the data
flow. The memory model counts the same kernels (``memory.report.LOSS_IMPLS["fused"]``).
"""

from __future__ import annotations

from charon_search.ir import DTYPE_BYTES, Node, OpGraph, OpKind, Phase, Poly, Role
from charon_search.passes._rewrite import fold_region
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before
from charon_search.passes.fusion import external_tensors

__all__ = ["FusedLossPass", "loss_region"]

JOIN_TARGET = "pass:fused_loss"
#: Passes over the logits of the fused forward (max, then sum of exponentials).
FORWARD_PASSES = 2
#: Bytes of the per-row log-sum-exp the forward saves for the backward.
LSE_BYTES = DTYPE_BYTES["fp32"]
_INT_DTYPES = frozenset({"int64", "int32", "int8", "uint8", "bool"})


def loss_region(graph: OpGraph) -> list[Node]:
    """The loss ops of ``graph`` on the logits: ``Role.LOSS`` compute nodes that write a
    floating-point tensor (the label shift on the integer targets stays its own kernel)."""
    return [n for n in graph.nodes
            if n.role == Role.LOSS and not n.is_comm and n.kind != OpKind.OTHER
            and any(graph.tensors[t].dtype not in _INT_DTYPES for t in n.outputs)]


def _rows(graph: OpGraph, t: int) -> Poly:
    """Rows of 2-D-or-more tensor ``t`` (all dimensions but the last)."""
    out = Poly.const(1)
    for d in graph.tensors[t].shape[:-1]:
        out = out * d
    return out


#: A training shape (micro-batch 1, 4096 tokens) at which tensor sizes are compared.
_REF = (1.0, 4096.0, 4096.0)


def _largest(graph: OpGraph, tensors: list[int]) -> int:
    """The tensor of ``tensors`` with the most bytes at ``_REF``."""
    return max(tensors, key=lambda t: graph.tensors[t].nbytes(*_REF))


def _per_row(graph: OpGraph, tensors: list[int], rows: Poly) -> list[int]:
    """The tensors of ``tensors`` with at most one element per row (labels, the loss and its
    gradient): what the fused kernels read besides the logits."""
    return [t for t in tensors if graph.tensors[t].numel(*_REF) <= rows(*_REF)]


def _fused(graph: OpGraph, region: list[Node]) -> dict[int, Node]:
    ext_in, ext_out = external_tensors(graph, region)
    carrier = region[-1]
    if carrier.phase == Phase.FORWARD:
        logits = _largest(graph, ext_in)
        rows = _rows(graph, logits)
        reads = FORWARD_PASSES * graph.tensors[logits].nbytes + sum(
            (graph.tensors[t].nbytes for t in _per_row(graph, ext_in, rows)), Poly())
        writes = rows * LSE_BYTES + sum(
            (graph.tensors[t].nbytes for t in carrier.outputs), Poly())
    else:
        grad = _largest(graph, ext_out)  # the logits' gradient the LM head GEMMs read
        rows = _rows(graph, grad)
        # the saved fp32 log-probabilities of the traced backward are not read: the kernel
        # recomputes the softmax from the logits and the log-sum-exp
        reads = graph.tensors[grad].nbytes + rows * LSE_BYTES + sum(
            (graph.tensors[t].nbytes for t in _per_row(graph, ext_in, rows)), Poly())
        writes = graph.tensors[grad].nbytes
    return fold_region(
        region, carrier, join_target=JOIN_TARGET, tag="fused_loss",
        name=f"fused_cross_entropy_{carrier.name}", kind=OpKind.SOFTMAX,
        flops=sum((m.flops for m in region), Poly()), bytes_read=reads, bytes_written=writes,
        params={"rows": rows}, target="pass:fusion")


@PASSES.register("fused_loss")
class FusedLossPass(Pass):
    name = "fused_loss"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.loss_kernel == "fused" and ctx.phase == "train"

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        region = loss_region(graph)
        if not region:
            return PassResult(graph, False)
        replace = _fused(graph, region)
        return PassResult(graph.with_nodes([replace.get(n.id, n) for n in graph.nodes]), True)


# The TP pass shards the loss ops over the vocabulary (Role.LOSS) and the FSDP / recompute
# passes place their work around them: the fused kernels exist before.
for _after in ("fp8", "tp", "ep", "cp", "recompute", "fsdp", "grad_accum"):
    must_run_before("fused_loss", _after)
