"""A fused cross-entropy kernel (pass ``fused_loss``, on with ``Layout.loss_kernel = "fused"``).

The traced HF model computes its loss with ``nn.CrossEntropyLoss`` under autocast: the bf16
logits are cast to fp32 (``_to_copy``), ``_log_softmax`` reads that copy three times (ATen's
multi-pass kernel for rows longer than shared memory, ``frontend._convert``) and writes the
fp32 log-probabilities, which ``nll_loss_forward`` indexes; the backward zero-fills an fp32
gradient (``nll_loss_backward``), ``_log_softmax_backward_data`` reads it twice and the saved
log-probabilities once, and a cast writes the bf16 gradient the LM head's GEMMs read. About 48
bytes move per logit (22 forward, 26 backward).

Frameworks that fuse the loss run one kernel per direction on the bf16 logits instead:

* llm-foundry's MPT (``ComposerMPTCausalLM``: ``loss_fn`` defaults to ``fused_crossentropy``,
  flash-attn's ``CrossEntropyLoss``; llm-foundry kept flash-attn 1.0.x's CUDA ``xentropy``
  kernel, whose forward reduces each row twice, for the maximum and for the sum of
  exponentials, and whose backward reads the logits once and writes the gradient);
* the loss compiled with the model by Inductor (torchtitan from 2025, ``build_cross_entropy_
  loss``: ``torch.compile(loss_fn)``): a looped row reduction (maximum, then the sum of
  exponentials) upcasting on load, and a backward kernel that recomputes the softmax from the
  saved per-row log-sum-exp.

Kernels with an online softmax (flash-attn 2's Triton cross entropy, Inductor's
``online_softmax``) read the logits once forward: 2 of the 8 bytes per logit counted here.

The pass takes the block's cross-entropy ops: the ``Role.LOSS`` ops on the logits' chain (in
the forward, those fed by the LM head's output and by each other; in the backward, those the LM
head's gradient GEMMs read from, back to the loss), not the label shift on the integer targets,
and only when they are more than one kernel (a graph whose loss is one op already is left
alone). It prices them as one kernel per direction. Forward: reads the logits twice and the
labels once, writes a per-row fp32 log-sum-exp and the loss. Backward: reads the logits once
(saved by the forward) and the log-sum-exp, writes the gradient at the logits' dtype. The op
that writes the loss (forward) or the logits' gradient (backward) carries the price; the others
become zero-cost joins (``pass:fused_loss``) that keep the data flow, so the backward graph
still lists the traced fp32 log-probabilities as its input (the kernel's bytes do not read
them). The memory model counts the same kernels (``memory.report.LOSS_IMPLS["fused"]``).
"""

from __future__ import annotations

from charon_search.ir import DTYPE_BYTES, INDEX_DTYPES, Node, OpGraph, OpKind, Phase, Poly, Role
from charon_search.passes._rewrite import fold_region
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before
from charon_search.passes.fusion import external_tensors

__all__ = ["FusedLossPass", "loss_region"]

JOIN_TARGET = "pass:fused_loss"
#: Passes over the logits of the fused forward (max, then sum of exponentials).
FORWARD_PASSES = 2
#: Bytes of the per-row log-sum-exp the forward saves for the backward.
LSE_BYTES = DTYPE_BYTES["fp32"]


def _float(graph: OpGraph, n: Node) -> bool:
    return any(graph.tensors[t].dtype not in INDEX_DTYPES for t in n.outputs)


def _is_loss_op(graph: OpGraph, n: Node) -> bool:
    return (n.role == Role.LOSS and not n.is_comm and n.kind != OpKind.OTHER
            and _float(graph, n))


def loss_region(graph: OpGraph) -> list[Node]:
    """The cross-entropy ops of ``graph``, in graph order (module docstring): forward, the
    ``Role.LOSS`` ops reached from the LM head's outputs through each other; backward, those
    the LM head's GEMMs read from, back through each other. Other ops the frontend tags as loss
    (label shifts on integer targets, gradient sums after the LM head) are not included."""
    head = [n for n in graph.nodes if n.role == Role.LM_HEAD]
    if not head:
        return []
    region: set[int] = set()
    if head[0].phase == Phase.FORWARD:
        reach = {t for n in head for t in n.outputs}
        for n in graph.nodes:
            if _is_loss_op(graph, n) and reach.intersection(n.inputs):
                region.add(n.id)
                reach.update(n.outputs)
    else:
        need = {t for n in head for t in n.inputs}
        for n in reversed(graph.nodes):
            if _is_loss_op(graph, n) and need.intersection(n.outputs):
                region.add(n.id)
                need.update(n.inputs)
    return [n for n in graph.nodes if n.id in region]


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
    if region[0].phase == Phase.FORWARD:
        logits = _largest(graph, ext_in)
        rows = _rows(graph, logits)
        per_row = _per_row(graph, ext_out, rows)  # the loss (and its total weight)
        carrier = next(n for n in reversed(region) if set(per_row) & set(n.outputs))
        reads = FORWARD_PASSES * graph.tensors[logits].nbytes + sum(
            (graph.tensors[t].nbytes for t in _per_row(graph, ext_in, rows)), Poly())
        writes = rows * LSE_BYTES + sum((graph.tensors[t].nbytes for t in per_row), Poly())
    else:
        logits = _largest(graph, ext_out)  # the logits' gradient the LM head GEMMs read
        rows = _rows(graph, logits)
        carrier = next(n for n in region if logits in n.outputs)
        # the saved fp32 log-probabilities of the traced backward are not read: the kernel
        # recomputes the softmax from the logits and the log-sum-exp
        reads = graph.tensors[logits].nbytes + rows * LSE_BYTES + sum(
            (graph.tensors[t].nbytes for t in _per_row(graph, ext_in, rows)), Poly())
        writes = graph.tensors[logits].nbytes
    return fold_region(
        region, carrier, join_target=JOIN_TARGET, tag="fused_loss",
        name=f"fused_cross_entropy_{carrier.name}", kind=OpKind.SOFTMAX,
        flops=sum((m.flops for m in region), Poly()), bytes_read=reads, bytes_written=writes,
        params={"rows": rows, "cols": graph.tensors[logits].shape[-1]}, target="pass:fusion")


@PASSES.register("fused_loss")
class FusedLossPass(Pass):
    name = "fused_loss"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.loss_kernel == "fused" and ctx.phase == "train"

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        region = loss_region(graph)
        if len(region) < 2:  # no loss here, or one kernel already
            return PassResult(graph, False)
        replace = _fused(graph, region)
        return PassResult(graph.with_nodes([replace.get(n.id, n) for n in graph.nodes]), True)


# The TP pass shards the loss ops over the vocabulary (Role.LOSS) and the FSDP / recompute
# passes place their work around them: the fused kernels exist before.
for _after in ("fp8", "tp", "ep", "cp", "recompute", "fsdp", "grad_accum"):
    must_run_before("fused_loss", _after)
