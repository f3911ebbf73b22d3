"""Fusion, FP8, async-TP and MoE-overlap passes; the pass manager's ordering and errors."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.errors import ConfigError, PassError
from charon_search.ir import Node, OpGraph, OpKind, Phase, Poly, Role, TensorSpec, sym
from charon_search.passes import (
    PASSES,
    Pass,
    PassContext,
    PassManager,
    PassResult,
    parallelize_block,
)
from charon_search.passes.base import _topo_order
from charon_search.passes.synthetic import synthetic_block
from charon_search.sim.costing import CostedGraph
from charon_search.sim.layer import layer_cost

B, S = 2, 128
bs = sym("b") * sym("s")


def _rope_graph() -> OpGraph:
    t = {i: TensorSpec(id=i, shape=(sym("b"), sym("s"), Poly.const(64)), dtype="bf16")
         for i in range(5)}
    nodes = tuple(Node(id=i, name=f"rope{i}", kind=OpKind.ELEMENTWISE, role=Role.ATTN_ROPE,
                       inputs=(i,), outputs=(i + 1,), flops=bs * 64,
                       bytes_read=bs * 128, bytes_written=bs * 128,
                       params={"numel": bs * 64}) for i in range(4))
    return OpGraph(name="g", nodes=nodes, tensors=t, inputs=(0,), outputs=(4,))


def test_fusion_merges_run_and_keeps_only_external_bytes() -> None:
    g = PassManager(passes=["fusion"], debug=True).run(_rope_graph(), PassContext())
    assert len(g.nodes) == 1
    assert g.total_flops(B, S) == pytest.approx(4 * B * S * 64)
    assert g.total_bytes(B, S) == pytest.approx(2 * B * S * 64 * 2)  # read input, write output


def test_fp8_quantizes_gemm_inputs() -> None:
    blk = synthetic_block("dense")
    pb = parallelize_block(blk, PassContext(precision="fp8", debug=True))
    gemms = [n for n in pb.forward.nodes if n.kind == OpKind.GEMM]
    assert all(n.dtype == "fp8" for n in gemms)
    q = [n for n in pb.forward.nodes if "fp8" in n.tags and n.kind == OpKind.ELEMENTWISE]
    assert len(q) == 4  # one per distinct activation: norm1 (q/k/v), attn out, norm2, act
    assert sum(n.flops(B, S) for n in gemms) == pytest.approx(
        sum(n.flops(B, S) for n in blk.forward.nodes if n.kind == OpKind.GEMM))


def _engine_time(graph: OpGraph, comm_s: float) -> float:
    dur = np.array([comm_s if n.is_comm else n.flops(B, S) / 1e12 for n in graph.nodes])
    cg = CostedGraph(graph=graph, durations_s=dur, provenance=("x",) * len(dur),
                     tiers=tuple("t" if n.is_comm else "" for n in graph.nodes))
    return layer_cost(cg).first.duration_s


def test_async_tp_keeps_bytes_and_hides_comm() -> None:
    blk = synthetic_block("dense")
    base = parallelize_block(blk, PassContext(tp=4, sequence_parallel=True, debug=True))
    asy = parallelize_block(blk, PassContext(tp=4, sequence_parallel=True, async_tp=True,
                                             debug=True))
    def vol(g: OpGraph) -> float:
        return sum(n.params["bytes"](B, S) for n in g.nodes if n.is_comm)
    assert vol(asy.forward) == pytest.approx(vol(base.forward))
    assert asy.forward.total_flops(B, S) == pytest.approx(base.forward.total_flops(B, S))
    comm_s = 2e-6
    chunked = [n for n in asy.forward.nodes if n.is_comm]
    t_base = _engine_time(base.forward, comm_s)
    # chunk durations scale with their bytes
    dur_fn = {n.name: comm_s * n.params["bytes"](B, S) / (B * S * 256 * 2) for n in chunked}
    dur = np.array([dur_fn.get(n.name, 0.0) if n.is_comm else n.flops(B, S) / 1e12
                    for n in asy.forward.nodes])
    cg = CostedGraph(graph=asy.forward, durations_s=dur, provenance=("x",) * len(dur),
                     tiers=tuple("t" if n.is_comm else "" for n in asy.forward.nodes))
    assert layer_cost(cg).first.duration_s < t_base


def test_async_tp_pipelines_an_all_gather_read_by_several_gemms() -> None:
    """q, k and v (and gate and up) read one sequence-parallel all-gather. PyTorch's async TP
    (``fused_all_gather_matmul`` with a list of weights) runs every GEMM on gathered chunk c
    while chunk c + 1 is in flight, so only the first chunk of the all-gather is exposed."""
    tp = 4
    blk = synthetic_block("dense")
    asy = parallelize_block(blk, PassContext(tp=tp, sequence_parallel=True, async_tp=True,
                                             debug=True))
    g = asy.forward
    ag_chunks = [i for i, n in enumerate(g.nodes)
                 if n.kind == OpKind.ALL_GATHER and n.group == "tp" and "async_tp" in n.tags]
    assert len(ag_chunks) == 2 * tp  # attention input and MLP input, tp chunks each
    first = g.nodes[ag_chunks[0]]
    readers = [n for n in g.nodes if first.outputs[0] in n.inputs and n.kind == OpKind.GEMM]
    assert len(readers) == 3  # q, k, v chunk 0
    comm_s, gemm_s = 1e-3, 2e-3  # per chunk; every GEMM chunk longer than a comm chunk
    dur = np.array([comm_s if n.is_comm else gemm_s if n.kind == OpKind.GEMM else 0.0
                    for n in g.nodes])
    cg = CostedGraph(graph=g, durations_s=dur, provenance=("x",) * len(dur),
                     tiers=tuple("t" if n.is_comm else "" for n in g.nodes))
    lc = layer_cost(cg)
    start = {t.name: s for t, s in zip(lc.tasks, lc.timeline.start_s, strict=True)}
    end = {t.name: e for t, e in zip(lc.tasks, lc.timeline.end_s, strict=True)}
    # the first GEMM on chunk 0 starts when chunk 0 lands, not when the whole gather has
    assert start[readers[0].name] == pytest.approx(end[first.name])


def test_moe_overlap_preserves_flops_and_helps() -> None:
    blk = synthetic_block("moe")
    base = parallelize_block(blk, PassContext(ep=4, dp=4, debug=True))
    ovl = parallelize_block(blk, PassContext(ep=4, dp=4, moe_a2a_overlap=True, debug=True))
    assert ovl.forward.total_flops(B, S) == pytest.approx(base.forward.total_flops(B, S))
    assert _engine_time(ovl.forward, 1e-6) < _engine_time(base.forward, 2e-6)


def test_ordering_constraints_respected() -> None:
    assert _topo_order(["recompute", "cp", "tp", "fusion"]).index("tp") < \
        _topo_order(["recompute", "cp", "tp", "fusion"]).index("cp")
    order = _topo_order(["fsdp", "recompute", "ep", "tp", "fp8", "fusion"])
    assert order.index("fusion") < order.index("fp8") < order.index("tp") < order.index("ep")
    assert order.index("recompute") < order.index("fsdp")


def test_unknown_pass_is_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown pass"):
        PassManager(passes=["nope"])


class _BreakGraph(Pass):
    name = "break_test"

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        bad = graph.nodes[0].replace(inputs=(999,))
        return PassResult(graph.with_nodes((bad, *graph.nodes[1:])), True)


def test_debug_check_names_pass_and_predecessors() -> None:
    if "break_test" not in PASSES:
        PASSES.add("break_test", _BreakGraph)
    pm = PassManager(passes=["fusion", "break_test"], debug=True)
    with pytest.raises(PassError, match=r"break_test.*fusion"):
        pm.run(_rope_graph(), PassContext())
    _ = Phase


@pytest.mark.parametrize("name", sorted(n for n in PASSES.names() if n != "break_test"))
@pytest.mark.parametrize("kind", ["dense", "moe", "embedding", "lm_head"])
def test_every_pass_keeps_graphs_well_formed(name: str, kind: str) -> None:
    """Contract: each registered pass, enabled, yields graphs that pass ``ir.check``."""
    ctx = PassContext(tp=2, cp=2, ep=2, dp=4, sequence_parallel=True, zero_stage=3,
                      recompute="selective", precision="fp8", async_tp=True,
                      moe_a2a_overlap=True, debug=True)
    needs = {"recompute": ["tp", "recompute"], "fsdp": ["tp", "fsdp"],
             "async_tp": ["tp", "async_tp"], "moe_overlap": ["ep", "moe_overlap"]}
    pb = parallelize_block(synthetic_block(kind), ctx, needs.get(name, [name]))
    for g in (pb.forward, pb.backward):
        from charon_search.ir import check
        check(g)
        assert g.total_flops(B, S) > 0 or kind == "embedding"


def _wgrad_first(blk, mods=("mlp.down_proj", "self_attn.o_proj")):
    """The block with each row linear's weight-gradient GEMM moved before its dgrad (the order
    an aten trace of ``mm`` may give)."""
    import dataclasses

    nodes = list(blk.backward.nodes)
    for mod in mods:
        d = next(i for i, n in enumerate(nodes) if n.name == f"{mod}.dgrad")
        w = next(i for i, n in enumerate(nodes) if n.name == f"{mod}.wgrad")
        nodes.insert(d, nodes.pop(w))
    return dataclasses.replace(blk, backward=blk.backward.with_nodes(nodes))


@pytest.mark.parametrize("async_tp", [False, True])
def test_sp_row_linear_wgrad_reads_the_gathered_output_gradient(async_tp: bool) -> None:
    """Under SP a row linear's output gradient arrives sequence-sharded; its dgrad and its
    wgrad both read the one all-gathered copy, the dgrad first (Megatron's linear backward,
    autograd's mm backward), whatever order the trace gave. With async TP the gather is
    pipelined with the dgrad and the wgrad reads the whole gathered tensor after it."""
    tp = 4
    blk = _wgrad_first(synthetic_block("dense"))
    g = parallelize_block(blk, PassContext(tp=tp, sequence_parallel=True, async_tp=async_tp,
                                           debug=True)).backward
    producer = {t: n for n in g.nodes for t in n.outputs}
    pos = {n.name: i for i, n in enumerate(g.nodes)}
    for mod in ("mlp.down_proj", "self_attn.o_proj"):
        wgrad = g.nodes[pos[f"{mod}.wgrad"]]
        dgrad_parts = [n for n in g.nodes if n.name.startswith(f"{mod}.dgrad")
                       and n.kind == OpKind.GEMM]
        assert len(dgrad_parts) == (tp if async_tp else 1)
        assert max(pos[n.name] for n in dgrad_parts) < pos[wgrad.name]
        grad = next(producer[t] for t in wgrad.inputs
                    if t in producer and producer[t].group == "tp")
        if async_tp:  # the join of the gather's chunks
            chunks = [producer[t] for t in grad.inputs]
            assert len(chunks) == tp and all(c.kind == OpKind.ALL_GATHER for c in chunks)
            assert all(c.outputs[0] in p.inputs for c, p in zip(chunks, dgrad_parts,
                                                                strict=True))
        else:
            assert grad.kind == OpKind.ALL_GATHER
            assert grad.outputs[0] in dgrad_parts[0].inputs
    gathers = [n for n in g.nodes if n.kind == OpKind.ALL_GATHER and n.group == "tp"]
    assert len(gathers) == 2 * (tp if async_tp else 1)  # one gather per row linear


@pytest.mark.parametrize("async_tp", [False, True])
def test_sp_fp8_row_wgrad_transposes_the_gathered_fp8_gradient(async_tp: bool) -> None:
    """Per-tensor fp8 under SP (torchao's float8 TP): the output gradient is cast on the
    shard, gathered once in fp8, the dgrad reads the gathered copy and the wgrad a transpose of
    that gathered tensor, after the dgrad, whatever order the trace gave (the two GEMMs read
    two different casts of one gradient). With async TP the gather is pipelined with the dgrad
    and the transpose reads the whole gathered tensor."""
    tp = 4
    blk = _wgrad_first(synthetic_block("dense"))
    g = parallelize_block(blk, PassContext(tp=tp, sequence_parallel=True, precision="fp8",
                                           fp8_recipe="tensorwise", async_tp=async_tp,
                                           debug=True)).backward
    producer = {t: n for n in g.nodes for t in n.outputs}
    pos = {n.name: i for i, n in enumerate(g.nodes)}
    for mod in ("mlp.down_proj", "self_attn.o_proj"):
        wgrad = g.nodes[pos[f"{mod}.wgrad"]]
        transpose = next(producer[t] for t in wgrad.inputs
                         if producer.get(t) is not None and producer[t].name.startswith(
                             "fp8_transpose"))
        dgrads = [n for n in g.nodes if n.name.startswith(f"{mod}.dgrad")
                  and n.kind == OpKind.GEMM]
        assert len(dgrads) == (tp if async_tp else 1)
        assert max(pos[n.name] for n in dgrads) < pos[transpose.name] < pos[wgrad.name]
        (src,) = transpose.inputs
        gathered = producer[src]
        if async_tp:
            gathered = producer[gathered.inputs[0]]  # the join's first chunk
        assert gathered.kind == OpKind.ALL_GATHER and gathered.group == "tp"
        cast = producer[gathered.inputs[0]]
        assert cast.name.startswith("fp8_quantize") and not cast.name.startswith(
            "fp8_quantize_t")


def test_sp_shared_expert_down_wgrad_reads_the_gathered_gradient() -> None:
    """A shared expert's down-projection is row-parallel (Megatron's SharedExpertMLP): under SP
    its wgrad reads the gathered output gradient after its dgrad, like ``mlp.out``; the
    gate/up wgrad (whose gradient is the activation's backward) stays where it is."""
    mods = ("mlp.shared_experts.down", "self_attn.o_proj")
    blk = _wgrad_first(synthetic_block("moe"), mods)
    g = parallelize_block(blk, PassContext(tp=2, sequence_parallel=True, debug=True)).backward
    producer = {t: n for n in g.nodes for t in n.outputs}
    pos = {n.name: i for i, n in enumerate(g.nodes)}
    for mod in mods:
        wgrad, dgrad = g.nodes[pos[f"{mod}.wgrad"]], g.nodes[pos[f"{mod}.dgrad"]]
        assert pos[dgrad.name] < pos[wgrad.name]
        gathered = [t for t in wgrad.inputs if producer.get(t) is not None
                    and producer[t].kind == OpKind.ALL_GATHER]
        assert gathered and gathered[0] in dgrad.inputs
    up = "mlp.shared_experts.gate_up"
    assert pos[f"{up}.dgrad"] < pos[f"{up}.wgrad"]
