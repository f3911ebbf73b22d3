"""ZeRO-3 / FSDP inside the block graphs: per-layer parameter all-gather before the forward and
again before the backward, and a reduce-scatter of the gradients after the backward.

The all-gather has no data dependency, so the engine starts it as soon as the ``dp`` stream is
free, i.e. prefetched during the previous layer (``fsdp_prefetch``); without prefetch the
simulator chains it behind the previous layer (see ``sim.layer``). Message sizes: the gathered
bf16 parameters of the layer's TP/EP shard, and its fp32 gradients (torchtitan's default
``reduce_dtype=float32``). With HSDP the group is ``hsdp_shard`` ranks and the replica
all-reduce is issued once per step by the step simulator.

DDP and ZeRO-1/2 gradient traffic is once per step (after the last micro-batch), so it lives in
the step simulator (``sim.step``), not in the per-micro-batch block graphs. What does run per
micro-batch there is Megatron-LM's unfused gradient accumulation (``grad_accum`` pass,
``Layout.grad_accum_hook``): every backward adds each parameter's gradient into the gradient
buffer the step's all-reduce later reads.
"""

from __future__ import annotations

from charon_search.ir import DTYPE_BYTES, Node, OpGraph, OpKind, Phase, Poly
from charon_search.layout import shard_groups
from charon_search.passes._rewrite import GraphBuilder, gemm_kind
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before
from charon_search.passes.params import local_param_tensors, local_params

__all__ = ["FullyShardedPass", "GradAccumulationPass", "gradient_predivide_factor"]

#: The dtype gradients are computed in (the half-precision compute dtype: FSDP1's
#: ``param_dtype`` bf16, Megatron's fp16/bf16 ``param.grad``), 2 bytes per element.
GRAD_COMPUTE_DTYPE = "bf16"
#: Passes that rewrite a block before the data-parallel passes see its gradients.
_BEFORE_DP = ("tp", "cp", "ep", "recompute", "fusion", "fp8")


def _is_weight_grad(n: Node) -> bool:
    """A backward node that writes parameter gradients: a weight-gradient GEMM, or a grouped
    expert GEMM (its gradients are folded into it)."""
    return n.kind == OpKind.GROUPED_GEMM or (n.kind == OpKind.GEMM and gemm_kind(n) == "wgrad")


def _stream_node(gb: GraphBuilder, name: str, kind: OpKind, reads: tuple[int, ...],
                 numel: Poly, read_b: float, write_b: float, dtype: str, *, target: str,
                 role: str, tag: str, flops: Poly) -> int:
    """Append a bandwidth-bound backward kernel over ``numel`` gradient elements reading
    ``reads``; returns its output tensor."""
    out = gb.new_tensor(shape=(numel,), dtype=dtype)
    gb.nodes.append(Node(
        id=gb.fresh_id(), name=gb.unique_name(name), kind=kind, target=target, role=role,
        phase=Phase.BACKWARD, inputs=gb.mapped(reads), outputs=(out,), flops=flops,
        bytes_read=numel * read_b, bytes_written=numel * write_b, params={"numel": numel},
        dtype=dtype, tags=frozenset({tag})))
    return out


@PASSES.register("fsdp")
class FullyShardedPass(Pass):
    name = "fsdp"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.zero_stage == 3 and ctx.phase == "train" and ctx.dp * ctx.cp > 1

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        backward = graph.meta.get("direction") == "backward"
        fwd = graph.meta.get("forward_graph", graph) if backward else graph
        lp = local_params(fwd, tp=ctx.tp, ep=ctx.ep)
        if lp.numel <= 0:
            return PassResult(graph, False)
        # Dense weights over dp·cp ranks, routed experts over the expert-data-parallel group
        # (``layout.shard_groups``, the memory model's rule). The ``axis:`` tag names the mesh
        # axis whose rank spacing prices each collective.
        dense, expert = shard_groups(dp=ctx.dp, cp=ctx.cp, ep=ctx.ep, hsdp_shard=ctx.hsdp_shard)
        shards = [(lp.dense_numel, dense, "dpcp"), (lp.expert_numel, expert, "edp")]
        shards = [(numel, group, axis) for numel, group, axis in shards
                  if numel > 0 and group > 1]
        if not shards:
            return PassResult(graph, False)
        gb = GraphBuilder(graph)
        gathers = tuple(gb.add_comm(
            OpKind.ALL_GATHER, group="dp", group_size=group,
            nbytes=numel * DTYPE_BYTES[ctx.param_gather_dtype], reads=(), like=None,
            phase=Phase.BACKWARD if backward else Phase.FORWARD, module_path="",
            name="fsdp_all_gather_bwd" if backward else "fsdp_all_gather", rewire=False,
            tags=("fsdp", f"axis:{axis}")) for numel, group, axis in shards)
        params = set(graph.param_tensors) | set(fwd.param_tensors)
        grads: list[int] = []
        for n in graph.nodes:
            if any(t in params for t in n.inputs):
                n = n.replace(inputs=(*n.inputs, *gathers))
            added = gb.add(n)
            if backward and _is_weight_grad(n):
                grads.extend(added.outputs)
        if backward:
            for numel, group, axis in shards:
                reads = tuple(grads)
                if ctx.fsdp_flat_grad:
                    reads = _flat_grad_kernels(gb, reads, numel, ctx.grad_reduce_dtype,
                                               ctx.dp * ctx.cp)
                gb.add_comm(OpKind.REDUCE_SCATTER, group="dp", group_size=group,
                            nbytes=numel * DTYPE_BYTES[ctx.grad_reduce_dtype],
                            reads=reads, like=None, phase=Phase.BACKWARD,
                            name="fsdp_reduce_scatter", rewire=False,
                            tags=("fsdp", f"axis:{axis}"))
                # FSDP2 reduce-scatters on its own stream, so the next layer's all-gather
                # (prefetch) does not queue behind this layer's gradients.
                gb.nodes[-1] = gb.nodes[-1].replace(stream="comm_dp_rs")
        return PassResult(gb.finish(), True)


def gradient_predivide_factor(world_size: int) -> float:
    """PyTorch FSDP1's gradient pre-divide factor for ``world_size`` data-parallel ranks
    (``DefaultState._get_gradient_predivide_factor``: the largest power of two ``f`` dividing
    the world size with ``f * f <= world_size``, at least 2 for two ranks or more); FSDP1
    divides the unsharded gradient by it before the reduce-scatter and the shard by
    ``world_size / f`` after it."""
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return float(factor)


def _flat_grad_kernels(gb: GraphBuilder, grads: tuple[int, ...], numel: float,
                       reduce_dtype: str, dp_world: int) -> tuple[int, ...]:
    """FSDP1's memory-bound passes over one unit's unsharded gradient before its reduce-scatter
    (``Layout.fsdp_flat_grad``); returns the tensor the reduce-scatter reads.

    1. The unit's parameters are views of its ``FlatParameter`` (``torch.split``), so autograd's
       split backward concatenates their gradients into the flat gradient (read and write the
       compute dtype).
    2. ``_post_backward_hook``: ``flat_param.grad.to(reduce_dtype)`` when the reduce dtype is not
       the compute dtype (Composer ``DEFAULT``: bf16 -> fp32).
    3. ``_reduce_grad``: ``_div_if_needed(padded_unsharded_grad, predivide_factor)``, an in-place
       division in the reduce dtype (the factor is above 1 for two ranks or more).

    FSDP1 issues 2 and 3 on its post-backward stream; they compete with the next layer's
    backward kernels for the SMs and HBM, and are costed on the compute stream (serialized
    with them), an upper bound on their exposed time. All three are streaming passes, costed
    as copies (the roofline's HBM rate: streaming copy/add at 0.88-0.92 of peak measured on
    an H200, ``cluster_specs/measurements``)."""
    pb = DTYPE_BYTES[GRAD_COMPUTE_DTYPE]
    rb = DTYPE_BYTES[reduce_dtype]
    steps = [("fsdp_grad_flatten", pb, pb, GRAD_COMPUTE_DTYPE)]
    if reduce_dtype != GRAD_COMPUTE_DTYPE:
        steps.append(("fsdp_grad_cast", pb, rb, reduce_dtype))
    if gradient_predivide_factor(dp_world) > 1:
        steps.append(("fsdp_grad_predivide", rb, rb, reduce_dtype))
    n = Poly.const(numel)
    reads = grads
    for name, read_b, write_b, dtype in steps:
        reads = (_stream_node(gb, name, OpKind.COPY, reads, n, read_b, write_b, dtype,
                              target="pass:fsdp", role="fsdp.grad", tag="fsdp",
                              flops=Poly.const(0.0)),)
    return reads


for _before in _BEFORE_DP:
    must_run_before(_before, "fsdp")


@PASSES.register("grad_accum")
class GradAccumulationPass(Pass):
    """Megatron-LM DDP's per-micro-batch gradient accumulation (``Layout.grad_accum_hook``).

    Megatron-LM's ``DistributedDataParallel`` (``megatron/model/distributed.py``, 2021)
    registers a hook on every parameter's gradient accumulator: ``param.main_grad.add_(
    param.grad.data)`` then ``param.grad = None``, so each micro-batch's backward runs one
    elementwise add per parameter tensor over the rank's whole parameter shard, reading the
    fresh half-precision gradient and the buffer (``grad_reduce_dtype``: fp16 for an fp16 run
    without ``--accumulate-allreduce-grads-in-fp32``, fp32 with it or under bf16) and writing
    the buffer. Added to each layer's backward graph as one elementwise node per parameter
    tensor after the layer's weight gradients; ``--gradient-accumulation-fusion`` (2022) moved
    it into the weight-gradient GEMMs. The hook still adds the gradients no such GEMM writes
    (``Layout.embedding_grad_hook``: the embedding tables' dense gradient, norm weights, linear
    biases, router weights): the same nodes over those tensors only.
    """

    name = "grad_accum"

    def enabled(self, ctx: PassContext) -> bool:
        # Megatron's buffer holds unsharded gradients (DDP, ZeRO-1's distributed optimizer);
        # sharded gradients (ZeRO-2/3) accumulate on their shard, which is not modelled.
        return (ctx.phase == "train" and (ctx.grad_accum_hook or ctx.embedding_grad_hook)
                and ctx.zero_stage <= 1)

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        if graph.meta.get("direction") != "backward":
            return PassResult(graph, False)
        fwd = graph.meta.get("forward_graph", graph)
        # Fused accumulation: only the tensors whose gradient no weight-gradient GEMM adds
        # itself (biases, norm weights, embedding tables, router weights).
        unfused = not ctx.grad_accum_hook
        sizes = [numel for numel, _, fused in local_param_tensors(fwd, tp=ctx.tp, ep=ctx.ep)
                 if numel > 0 and not (unfused and fused)]
        if not sizes:
            return PassResult(graph, False)
        gb = GraphBuilder(graph)
        grads: list[int] = []
        for n in graph.nodes:
            added = gb.add(n)
            if _is_weight_grad(n) or (unfused and n.phase == Phase.BACKWARD
                                      and n.kind in (OpKind.EMBEDDING, OpKind.NORM)):
                grads.extend(added.outputs)
        acc = DTYPE_BYTES[ctx.grad_reduce_dtype]
        for numel in sizes:  # the hook's add_ runs once per parameter tensor
            n_ = Poly.const(numel)
            _stream_node(gb, "grad_accumulate", OpKind.ELEMENTWISE, tuple(grads), n_,
                         DTYPE_BYTES[GRAD_COMPUTE_DTYPE] + acc, acc, ctx.grad_reduce_dtype,
                         target="pass:grad_accum", role="dp.grad", tag="grad_accum", flops=n_)
        return PassResult(gb.finish(), True)


for _before in _BEFORE_DP:
    must_run_before(_before, "grad_accum")
