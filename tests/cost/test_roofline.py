"""Roofline backend: closed forms on H100 numbers, contract suite, vectorized path agrees."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.cost.base import COST_BACKENDS, ShapePoint
from charon_search.cost.roofline import RooflineCostBackend, roofline_times
from charon_search.hardware import load_gpu
from charon_search.ir import Node, OpGraph, OpKind, TensorSpec, poly_params, sym
from charon_search.testing import CostBackendContract, comm_node, gemm_node

H100 = load_gpu("h100-sxm-80gb")  # bf16 989.5 TFLOP/s, fp32 67, HBM 3.35 TB/s, eff 0.8/0.8


class TestRooflineContract(CostBackendContract):
    backend_factory = RooflineCostBackend
    covers_all_compute = True


def test_registered() -> None:
    assert COST_BACKENDS.get("roofline") is RooflineCostBackend


def test_compute_bound_gemm_closed_form() -> None:
    cost = RooflineCostBackend().cost(gemm_node(8192, 8192, 8192), ShapePoint(1, 1, 1), H100)
    assert cost is not None
    assert cost.provenance == "roofline" and cost.detail == "compute"
    # 2·8192³ FLOP / (989.5e12 · 0.8) + 4 µs = 1.3891 ms + 4 µs
    assert cost.duration_s == pytest.approx(2 * 8192**3 / (989.5e12 * 0.8) + 4e-6, rel=1e-12)
    assert cost.duration_s == pytest.approx(1.3931e-3, rel=1e-3)


def test_fp8_gemm_uses_fp8_peak() -> None:
    cost = RooflineCostBackend().cost(gemm_node(8192, 8192, 8192, dtype="fp8"),
                                      ShapePoint(1, 1, 1), H100)
    assert cost is not None
    assert cost.duration_s == pytest.approx(2 * 8192**3 / (1979e12 * 0.8) + 4e-6, rel=1e-12)


def test_memory_bound_elementwise_closed_form() -> None:
    n = 2**30  # bf16: read 2 GiB, write 2 GiB
    node = Node(id=0, name="add", kind=OpKind.ELEMENTWISE, flops=sym("b") * n,
                bytes_read=sym("b") * 2 * n, bytes_written=sym("b") * 2 * n,
                params=poly_params(numel=sym("b") * n))
    cost = RooflineCostBackend().cost(node, ShapePoint(2, 1, 1), H100)
    assert cost is not None and cost.detail == "memory"
    assert cost.duration_s == pytest.approx(2 * 4 * n / (3.35e12 * 0.8) + 4e-6, rel=1e-12)


def test_vector_kinds_use_cuda_core_rate() -> None:
    # A norm with an (artificially) huge FLOP count is bounded by the fp32 CUDA-core rate.
    node = Node(id=0, name="norm", kind=OpKind.NORM, flops=sym("b") * 1e12,
                params=poly_params(rows=1, cols=1))
    cost = RooflineCostBackend().cost(node, ShapePoint(1, 1, 1), H100)
    assert cost is not None
    assert cost.duration_s == pytest.approx(1e12 / (67e12 * 0.8) + 4e-6, rel=1e-12)


def test_fp4_falls_back_to_fp8_on_hopper() -> None:
    a = RooflineCostBackend().cost(gemm_node(4096, 4096, 4096, dtype="fp4"),
                                   ShapePoint(1, 1, 1), H100)
    b = RooflineCostBackend().cost(gemm_node(4096, 4096, 4096, dtype="fp8"),
                                   ShapePoint(1, 1, 1), H100)
    assert a is not None and b is not None
    assert a.duration_s < b.duration_s * 1.01  # fp4 reads fewer bytes; same peak


def test_vectorized_matches_per_node() -> None:
    b, s = sym("b"), sym("s")
    tokens = b * s
    tensors = {i: TensorSpec(id=i, shape=(tokens, 4096), dtype="bf16") for i in range(5)}
    nodes = (
        gemm_node(tokens, 4096, 4096, node_id=0).replace(inputs=(0,), outputs=(1,)),
        Node(id=1, name="act", kind=OpKind.ELEMENTWISE, inputs=(1,), outputs=(2,),
             flops=tokens * 4096, bytes_read=tokens * 8192, bytes_written=tokens * 8192,
             params=poly_params(numel=tokens * 4096)),
        comm_node(OpKind.ALL_REDUCE, tokens * 8192, 8, node_id=2).replace(inputs=(2,),
                                                                           outputs=(3,)),
        gemm_node(tokens, 4096, 4096, dtype="fp8", node_id=3).replace(inputs=(3,),
                                                                      outputs=(4,)),
    )
    graph = OpGraph(name="g", nodes=nodes, tensors=tensors, inputs=(0,), outputs=(4,))
    backend = RooflineCostBackend()
    for bb, ss in ((1, 1), (2, 4096), (8, 128)):
        vec = roofline_times(graph, H100, bb, ss)
        point = ShapePoint(bb, ss, ss)
        expected = [0.0 if n.is_comm else backend.cost(n, point, H100).duration_s  # type: ignore[union-attr]
                    for n in graph.nodes]
        np.testing.assert_allclose(vec, expected, rtol=1e-12)
        assert vec[2] == 0.0
    # Cached constants are per GPU.
    a100 = load_gpu("a100-sxm-80gb")
    assert roofline_times(graph, a100, 2, 4096)[0] > roofline_times(graph, H100, 2, 4096)[0]
