"""Expert parallelism: experts sharded over ``ep`` ranks, tokens moved by all-to-alls.

Each EP rank keeps ``num_experts / ep`` experts and, with balanced routing, receives as many
routed rows (``tokens * top_k``) as it sends, so its expert FLOPs equal the unsharded per-rank
FLOPs. Routing is never perfectly balanced: ``expert_load_imbalance`` (max/mean tokens per
expert) is written into the grouped GEMMs' ``load_imbalance`` param, and the simulator scales
their duration by it (the slowest rank gates the all-to-all that follows).

A dispatch all-to-all is inserted on the activation rows entering the expert region (role
``moe.expert``) and a combine all-to-all on the expert outputs leaving it, in the forward and
the backward graph (2 + 2 per MoE layer). Only activation rows are dispatched, and only tensors
computed from a grouped GEMM's output and read by token-sized work are combined (not what
only reduces into a fixed-size table, such as a bias gradient). The per-expert row counts are
exchanged once, at the first grouped GEMM that reads them without new activation rows (the
second one, whose exchange a serving engine's fused expert FFN folds into its dispatch,
``serving._fusion``). What else crosses the region's border is data an EP rank has itself
(gpt-oss's per-row expert biases, gathered from a parameter by expert id; routing indices),
which the engines' MoE kernels never send.

Message bytes are the routed rows times the hidden size, at the activation's dtype; with
``PassContext.ep_dispatch_bytes`` the dispatches (the backward's carries the gradients into
the experts) move that many bytes per value instead:
fp8 values plus one fp32 scale per ``FP8_DISPATCH_BLOCK`` for a training layout's
``ep_dispatch_fp8``, NVFP4 values with their scales for TensorRT-LLM's quantized dispatch.
"""

from __future__ import annotations

from charon_search.ir import DTYPE_BYTES, INDEX_DTYPES, Node, OpGraph, OpKind, Poly, Role
from charon_search.passes._rewrite import GraphBuilder
from charon_search.passes.base import (
    FP8_DISPATCH_BLOCK,
    PASSES,
    Pass,
    PassContext,
    PassResult,
    must_run_before,
)

__all__ = ["FP8_DISPATCH_BLOCK", "ExpertParallelPass"]


@PASSES.register("ep")
class ExpertParallelPass(Pass):
    name = "ep"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.ep > 1

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        expert = [n for n in graph.nodes if n.role == Role.MOE_EXPERT]
        if not expert:
            return PassResult(graph, False)
        ep = ctx.ep
        # Under SP the routed tokens are already the tp-th sequence shard.
        token_frac = 1.0 / ctx.tp if (ctx.sequence_parallel and ctx.tp > 1) else 1.0
        params = set(graph.param_tensors)
        in_region = {t for n in expert for t in n.outputs}
        # The backward sums gradient contributions of expert ops (gpt-oss's clamped SwiGLU
        # branches) in adds traced with the residual role; an add of expert tensors only is
        # part of the experts' computation, not a border to send across.
        region = {n.id for n in expert}
        for n in graph.nodes:
            if (n.role == Role.RESIDUAL and n.kind == OpKind.ELEMENTWISE
                    and all(t in in_region for t in n.inputs if t not in params)):
                region.add(n.id)
                in_region.update(n.outputs)
        expert = [n for n in graph.nodes if n.id in region]
        consumers = graph.consumers
        produced = graph.producer
        node_of = {n.id: n for n in graph.nodes}
        gb = GraphBuilder(graph)
        dispatched: set[int] = set()
        from_gemm: set[int] = set()  # region tensors computed from a grouped GEMM's output
        counted = False  # the per-expert row counts are exchanged once per MoE layer
        for node in graph.nodes:
            if node.id in region:
                entering = [t for t in node.inputs if t not in params and t not in in_region
                            and t in produced and t not in dispatched]
                rows = [t for t in entering if self._token_rows(gb, t)
                        and not self._expert_side(node_of[produced[t]], params)]
                counts = [t for t in entering if self._counts(gb, t)]
                send: int | None = None
                if rows:
                    send = max(rows, key=lambda x: gb.tensors[x].numel(1, 1, 1))
                elif counts and not counted and node.kind == OpKind.GROUPED_GEMM:
                    send, counted = counts[0], True
                if node.kind == OpKind.GROUPED_GEMM or any(t in from_gemm for t in node.inputs):
                    from_gemm.update(node.outputs)
                if send is not None:
                    t = send
                    dispatched.add(t)
                    nbytes = (gb.tensors[t].numel * ctx.ep_dispatch_bytes
                              if ctx.ep_dispatch_bytes else self._routed_bytes(gb, t, expert))
                    gb.add_comm(OpKind.ALL_TO_ALL, group="ep", group_size=ep,
                                nbytes=nbytes * token_frac,
                                reads=(t,), like=t, phase=node.phase,
                                module_path=node.module_path, name=f"ep_dispatch_{node.name}")
                new = self._shard(node, ep, ctx.expert_load_imbalance)
                added = gb.add(new)
                for t, orig in zip(added.outputs, node.outputs, strict=True):
                    # Consumers that only reduce into a fixed-size table (a bias gradient) run
                    # on the rank that owns the experts; the rows leave for token-sized work.
                    leaving = [c for c in consumers.get(orig, ()) if c not in region
                               and any(self._grows(gb, o) for o in node_of[c].outputs)]
                    if leaving and orig in from_gemm:
                        gb.add_comm(OpKind.ALL_TO_ALL, group="ep", group_size=ep,
                                    nbytes=self._routed_bytes(gb, t, expert) * token_frac,
                                    reads=(t,), like=t, phase=node.phase,
                                    module_path=node.module_path,
                                    name=f"ep_combine_{node.name}")
            else:
                gb.add(node)
        return PassResult(gb.finish(meta={"ep": ep}), True)

    @staticmethod
    def _expert_side(producer: Node, params: set[int]) -> bool:
        """Whether ``producer`` gathers a parameter's rows (``bias[expert_ids]``): data the
        rank that owns the experts holds itself, not activation rows to send it."""
        return (producer.kind not in (OpKind.GEMM, OpKind.GROUPED_GEMM)
                and any(t in params for t in producer.inputs))

    @staticmethod
    def _grows(gb: GraphBuilder, t: int) -> bool:
        """Whether ``t``'s element count grows with the tokens."""
        numel = gb.tensors[t].numel
        return float(numel(2, 2, 2)) > float(numel(1, 1, 1))

    @staticmethod
    def _token_rows(gb: GraphBuilder, t: int) -> bool:
        """Whether ``t`` is activation rows: values (not indices) whose count grows with the
        tokens (not a fixed-size table such as per-expert offsets)."""
        return (gb.tensors[t].dtype not in INDEX_DTYPES
                and ExpertParallelPass._grows(gb, t))

    @staticmethod
    def _counts(gb: GraphBuilder, t: int) -> bool:
        """Whether ``t`` is a fixed-size integer table (rows per expert: the exchange that
        sizes the dispatch)."""
        return (gb.tensors[t].dtype in INDEX_DTYPES
                and not ExpertParallelPass._grows(gb, t))

    @staticmethod
    def _routed_bytes(gb: GraphBuilder, t: int, expert: list[Node]) -> Poly:
        """Bytes of the routed activation ``t`` (tokens * top_k rows of hidden values)."""
        return gb.tensors[t].nbytes

    @staticmethod
    def _shard(node: Node, ep: int, imbalance: float) -> Node:
        if node.kind != OpKind.GROUPED_GEMM:
            return node
        p = dict(node.params)
        p["num_experts"] = p["num_experts"] / ep
        p["load_imbalance"] = Poly.const(imbalance)
        # Expert weights: ep-th of them are read (forward, dgrad) or their gradients written
        # (wgrad) per rank. Weights are read at the GEMM's dtype (an fp8 grouped GEMM of
        # ``passes.fusion.FP8Pass`` reads fp8 copies); gradients are written in bf16.
        w = node.params["num_experts"] * node.params["n"] * node.params["k"]
        keep = 1 - 1 / ep
        saved = w * DTYPE_BYTES.get(node.dtype, 2) * keep
        br, bw = node.bytes_read - saved, node.bytes_written
        if br(1, 1, 1) < 0:
            br = node.bytes_read
            if (bw - w * 2 * keep)(1, 1, 1) >= 0:
                bw = bw - w * 2 * keep
        return node.replace(params=p, bytes_read=br, bytes_written=bw)


must_run_before("tp", "ep")
