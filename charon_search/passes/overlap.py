"""Communication-overlap optimisations as graph rewrites (each on/off, so the search can weigh
the hidden communication against the overlap slowdown the engine charges).

* ``async_tp`` - async tensor parallelism (PyTorch async-TP / Megatron TP comm overlap): a GEMM
  next to its TP collective is split into ``tp`` chunks pipelined with ``tp`` collective chunks
  (all-gather chunk i feeds GEMM chunk i; GEMM chunk i feeds reduce-scatter chunk i), so all but
  one chunk of the collective runs under GEMM work. A zero-cost join restores the full tensor.
  An all-gather read by several GEMMs (q, k and v; gate and up) pipelines with all of them,
  chunk c of each running on gathered chunk c (``torch.ops.symm_mem.fused_all_gather_matmul``
  takes a list of weights); a weight-gradient GEMM, which contracts over the gathered tokens,
  is not split: it reads the whole gathered tensor after the pipelined GEMMs (a row linear's
  output gradient feeds its dgrad, pipelined, and its wgrad). Under ``sp_wgrad_regather``
  (Megatron-Core with Transformer Engine's userbuffers, defaults ``tp_comm_bulk_dgrad`` /
  ``tp_comm_bulk_wgrad`` on and ``tp_comm_overlap_rs_dgrad`` off) a dgrad GEMM is not split
  with its reduce-scatter: the re-gather of the saved input runs whole under the dgrad and the
  reduce-scatter under the wgrad GEMM, as ``passes.tensor_parallel`` lays them out.
* ``moe_overlap`` - DeepSeek-style two-micro-batch overlap: the block runs as two half
  micro-batches whose ops are interleaved at the expert-parallel all-to-all boundaries, so one
  half's dispatch/combine overlaps the other half's attention / expert compute.

FSDP prefetch is a simulator switch (``Layout.fsdp_prefetch``, see ``sim.layer``) and DualPipe's
bidirectional overlap is applied by the pipeline executor (``pair_overlap``).
"""

from __future__ import annotations

from charon_search.ir import Node, OpGraph, OpKind, sym
from charon_search.passes._rewrite import GraphBuilder, gemm_kind, subs_node
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before

__all__ = ["AsyncTensorParallelPass", "MoEOverlapPass"]

_CHUNKABLE = (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.ALL_REDUCE)


def _chunk(node: Node, k: int, i: int, gb: GraphBuilder, inputs: tuple[int, ...]) -> Node:
    outs = tuple(gb.new_tensor(gb.tensors[t]) for t in node.outputs)
    params = {n: (v / k if n in ("m", "bytes") else v) for n, v in node.params.items()}
    return node.replace(
        id=gb.fresh_id(), name=gb.unique_name(f"{node.name}_chunk{i}"), inputs=inputs,
        outputs=outs, flops=node.flops / k, bytes_read=node.bytes_read / k,
        bytes_written=node.bytes_written / k, params=params, tags=node.tags | {"async_tp"})


def _join(node: Node, parts: list[Node], gb: GraphBuilder) -> None:
    for idx, t in enumerate(node.outputs):
        gb.nodes.append(Node(
            id=gb.fresh_id(), name=gb.unique_name(f"{node.name}_join{idx}"), kind=OpKind.OTHER,
            target="pass:async_tp", module_path=node.module_path, role=node.role,
            phase=node.phase, inputs=tuple(p.outputs[idx] for p in parts), outputs=(t,),
            stream=node.stream, group="" if not node.is_comm else node.group))


@PASSES.register("async_tp")
class AsyncTensorParallelPass(Pass):
    name = "async_tp"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.async_tp and ctx.tp > 1

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        k = ctx.tp
        nodes = graph.nodes
        producer = {t: i for i, n in enumerate(nodes) for t in n.outputs}
        consumers = graph.consumers
        pairs: dict[int, int] = {}  # RS/AR index -> the GEMM producing its input
        gathers: dict[int, list[int]] = {}  # AG index -> the GEMMs consuming its output
        for i, n in enumerate(nodes):
            if n.group != "tp" or n.kind not in _CHUNKABLE or len(n.inputs) != 1:
                continue
            if n.kind == OpKind.ALL_GATHER:
                users = sorted(graph.node_index[c] for c in consumers.get(n.outputs[0], ()))

                def splits_with_gather(j: int, i: int = i, n: Node = n) -> bool:
                    # A GEMM over the gathered tokens (not a wgrad, which contracts over them)
                    # whose other inputs exist before the gather starts.
                    g = nodes[j]
                    return (g.kind == OpKind.GEMM and gemm_kind(g) != "wgrad"
                            and all(producer.get(t, -1) < i for t in g.inputs
                                    if t != n.outputs[0]))

                # A wgrad reading the gathered tensor too (a row linear's output gradient:
                # dgrad and wgrad), or the fp8 transpose the wgrad reads, takes it whole after
                # the pipelined GEMMs, as the fused op returns it (``fused_all_gather_matmul``'s
                # gathered output).
                split = [j for j in users if splits_with_gather(j)]
                if split and all(j in split or nodes[j].target == "pass:fp8"
                                 or (nodes[j].kind == OpKind.GEMM
                                     and gemm_kind(nodes[j]) == "wgrad")
                                 for j in users):
                    gathers[i] = split
            else:
                j = producer.get(n.inputs[0])
                if j is not None and nodes[j].kind == OpKind.GEMM and len(
                        consumers.get(n.inputs[0], ())) == 1:
                    if ctx.sp_wgrad_regather and gemm_kind(nodes[j]) == "dgrad":
                        # Megatron-Core / Transformer Engine bulk overlap (defaults
                        # tp_comm_bulk_dgrad / tp_comm_bulk_wgrad, tp_comm_overlap_rs_dgrad
                        # False): the dgrad's reduce-scatter runs whole under the wgrad GEMM,
                        # as without async TP; the re-gather runs under the dgrad.
                        continue
                    pairs[i] = j
        if not pairs and not gathers:
            return PassResult(graph, False)
        partner = {g: c for c, g in pairs.items()}
        gb = GraphBuilder(graph)
        done: set[int] = set()
        for i, n in enumerate(nodes):
            if i in done:
                continue
            if i in gathers:  # AG chunk c -> chunk c of every GEMM reading the gathered tensor
                comm_parts = [_chunk(n, k, c, gb, gb.mapped(n.inputs)) for c in range(k)]
                gb.nodes.extend(comm_parts)
                gemms = [nodes[j] for j in gathers[i]]
                parts: list[list[Node]] = [[] for _ in gemms]
                for c in range(k):
                    for g, gp in zip(gemms, parts, strict=True):
                        a = gb.mapped(g.inputs)
                        gp.append(_chunk(g, k, c, gb, tuple(
                            comm_parts[c].outputs[0] if t == n.outputs[0] else m
                            for t, m in zip(g.inputs, a, strict=True))))
                        gb.nodes.append(gp[-1])
                for g, gp in zip(gemms, parts, strict=True):
                    _join(g, gp, gb)
                # After the GEMM chunks: a join is a compute-stream task, and one placed before
                # them would hold the stream until the whole all-gather had landed.
                _join(n, comm_parts, gb)
                done.update(gathers[i])
                continue
            if i in partner:
                c_node = nodes[partner[i]]  # GEMM chunk i -> RS/AR chunk i
                gemm_parts = [_chunk(n, k, c, gb, gb.mapped(n.inputs)) for c in range(k)]
                gb.nodes.extend(gemm_parts)
                comm_parts = [_chunk(c_node, k, c, gb, (gemm_parts[c].outputs[0],))
                              for c in range(k)]
                gb.nodes.extend(comm_parts)
                _join(n, gemm_parts, gb)
                _join(c_node, comm_parts, gb)
                done.add(partner[i])
                continue
            gb.add(n)
        return PassResult(gb.finish(), True)


@PASSES.register("moe_overlap")
class MoEOverlapPass(Pass):
    name = "moe_overlap"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.moe_a2a_overlap and ctx.ep > 1

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        cuts = [i for i, n in enumerate(graph.nodes)
                if n.group == "ep" and n.kind == OpKind.ALL_TO_ALL]
        if not cuts:
            return PassResult(graph, False)
        half = {"b": sym("b") / 2}
        segments: list[list[Node]] = []
        prev = 0
        for c in cuts:
            segments.append(list(graph.nodes[prev:c + 1]))
            prev = c + 1
        segments.append(list(graph.nodes[prev:]))
        gb = GraphBuilder(graph)
        # Copy B: fresh ids and tensors for everything the graph produces.
        remap: dict[int, int] = {}
        copy_b: list[list[Node]] = []
        for seg in segments:
            out = []
            for n in seg:
                outs = []
                for t in n.outputs:
                    remap[t] = gb.new_tensor(gb.tensors[t])
                    outs.append(remap[t])
                out.append(subs_node(n, **half).replace(
                    id=gb.fresh_id(), name=gb.unique_name(f"{n.name}_mb1"),
                    inputs=tuple(remap.get(t, t) for t in n.inputs), outputs=tuple(outs),
                    tags=n.tags | {"moe_overlap"}))
            copy_b.append(out)
        for seg_a, seg_b in zip(segments, copy_b, strict=True):
            for n in seg_a:
                gb.add(subs_node(n, **half).replace(tags=n.tags | {"moe_overlap"}))
            gb.nodes.extend(seg_b)
        final = tuple(graph.outputs) + tuple(remap[t] for t in graph.outputs if t in remap)
        return PassResult(gb.finish(outputs=final), True)


for _before in ("tp", "ep", "cp", "recompute", "fsdp"):
    must_run_before(_before, "async_tp")
    must_run_before(_before, "moe_overlap")
