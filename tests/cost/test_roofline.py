"""Roofline backend: closed forms on H100 numbers, contract suite, vectorized path agrees."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.cost.base import COST_BACKENDS, ShapePoint
from charon_search.cost.roofline import RooflineCostBackend, roofline_times
from charon_search.hardware import load_gpu
from charon_search.ir import Node, OpGraph, OpKind, Poly, TensorSpec, poly_params, sym
from charon_search.testing import CostBackendContract, comm_node, gemm_node

H100 = load_gpu("h100-sxm-80gb")  # bf16 989.5 TFLOP/s, fp32 67, HBM 3.35 TB/s, eff 0.7/0.88


class TestRooflineContract(CostBackendContract):
    backend_factory = RooflineCostBackend
    covers_all_compute = True


def test_registered() -> None:
    assert COST_BACKENDS.get("roofline") is RooflineCostBackend


def test_compute_bound_gemm_closed_form() -> None:
    cost = RooflineCostBackend().cost(gemm_node(8192, 8192, 8192), ShapePoint(1, 1, 1), H100)
    assert cost is not None
    assert cost.provenance == "roofline" and cost.detail == "compute"
    # 2·8192³ FLOP / (989.5e12 · 0.7) + 4 µs = 1.5874 ms + 4 µs
    assert cost.duration_s == pytest.approx(2 * 8192**3 / (989.5e12 * 0.7) + 4e-6, rel=1e-12)
    assert cost.duration_s == pytest.approx(1.5914e-3, rel=1e-3)


def test_fp8_gemm_uses_fp8_peak() -> None:
    cost = RooflineCostBackend().cost(gemm_node(8192, 8192, 8192, dtype="fp8"),
                                      ShapePoint(1, 1, 1), H100)
    assert cost is not None
    # FP8 has its own efficiency on Hopper (compute_efficiency_by_dtype: fp8 0.63).
    assert H100.compute_efficiency_by_dtype["fp8"] == 0.63
    assert cost.duration_s == pytest.approx(2 * 8192**3 / (1979e12 * 0.63) + 4e-6, rel=1e-12)


def test_memory_bound_elementwise_closed_form() -> None:
    n = 2**30  # bf16: read 2 GiB, write 2 GiB
    node = Node(id=0, name="add", kind=OpKind.ELEMENTWISE, flops=sym("b") * n,
                bytes_read=sym("b") * 2 * n, bytes_written=sym("b") * 2 * n,
                params=poly_params(numel=sym("b") * n))
    cost = RooflineCostBackend().cost(node, ShapePoint(2, 1, 1), H100)
    assert cost is not None and cost.detail == "memory"
    assert cost.duration_s == pytest.approx(2 * 4 * n / (3.35e12 * 0.88) + 4e-6, rel=1e-12)


def test_vector_kinds_use_cuda_core_rate() -> None:
    # A norm with an (artificially) huge FLOP count is bounded by the fp32 CUDA-core rate.
    node = Node(id=0, name="norm", kind=OpKind.NORM, flops=sym("b") * 1e12,
                params=poly_params(rows=1, cols=1))
    cost = RooflineCostBackend().cost(node, ShapePoint(1, 1, 1), H100)
    assert cost is not None
    assert cost.duration_s == pytest.approx(1e12 / (67e12 * 0.7) + 4e-6, rel=1e-12)


def test_fp4_is_weight_only_at_bf16_rate_on_hopper() -> None:
    """Hopper has no FP4 tensor cores: a 4-bit GEMM there is weight-only (W4A16) and runs at
    the bf16 peak and efficiency, 2·4096^3 / (989.5e12·0.7) + 4 us = 202.4 us (not the fp8
    peak at 0.7, 103.2 us, which made it faster than fp8's 114.2 us)."""
    a = RooflineCostBackend().cost(gemm_node(4096, 4096, 4096, dtype="fp4"),
                                   ShapePoint(1, 1, 1), H100)
    b = RooflineCostBackend().cost(gemm_node(4096, 4096, 4096, dtype="bf16"),
                                   ShapePoint(1, 1, 1), H100)
    assert a is not None and b is not None
    assert a.duration_s == pytest.approx(202.4e-6, rel=1e-3)
    assert a.duration_s == pytest.approx(b.duration_s, rel=1e-12)


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


# Measured on one H200 SXM with benchmarks/bench_roofline_gpu.py, torch 2.11.0+cu130, 2026-11-29
# (cluster_specs/measurements/h200-roofline-2026-11-29.json): seconds per call.
H200_MEASURED_S = {
    ("gemm", 8192, 8192, 8192): 1387.2e-6,
    ("gemm", 4096, 28672, 8192): 2956.8e-6,
    ("gemm", 4096, 8192, 28672): 2833.8e-6,
    ("gemm", 16384, 8192, 8192): 3051.3e-6,
    ("gemm", 4096, 4096, 4096): 226.0e-6,
    ("gemm", 512, 8192, 8192): 111.3e-6,
    ("gemm", 64, 8192, 8192): 38.3e-6,  # memory-bound (weights)
    ("gemm", 1, 8192, 8192): 37.5e-6,  # GEMV
    ("gemm_fp8", 8192, 8192, 8192): 762.2e-6,
    ("gemm_fp8", 4096, 28672, 8192): 1460.6e-6,
    ("gemm_fp8", 4096, 4096, 4096): 128.3e-6,
    ("copy", 2**30): 1007.0e-6,  # 2 GiB bf16 read + 2 GiB written
    ("add", 2**30): 1466.8e-6,  # 4 GiB read + 2 GiB written
}


@pytest.mark.validation
@pytest.mark.parametrize("key", list(H200_MEASURED_S), ids=lambda k: "_".join(map(str, k)))
def test_h200_roofline_within_20_percent_of_measurement(key: tuple) -> None:
    gpu = load_gpu("h200-sxm-141gb")
    if key[0] == "gemm":
        node = gemm_node(*key[1:])
    elif key[0] == "gemm_fp8":
        node = gemm_node(*key[1:], dtype="fp8")
    else:
        numel = key[1]
        reads = 1 if key[0] == "copy" else 2
        node = Node(id=0, name=key[0], kind=OpKind.ELEMENTWISE, flops=Poly.const(numel),
                    bytes_read=Poly.const(2 * numel * reads), bytes_written=Poly.const(2 * numel),
                    params=poly_params(numel=numel))
    cost = RooflineCostBackend().cost(node, ShapePoint(1, 1, 1), gpu)
    assert cost is not None
    assert cost.duration_s == pytest.approx(H200_MEASURED_S[key], rel=0.20)


def test_vectorized_cache_sees_a_rebuilt_gpu() -> None:
    """Calibration rebuilds the GPU spec with another efficiency under the same name: the
    vectorized path must not reuse the old per-node constants."""
    import dataclasses

    graph = OpGraph(name="g", nodes=(gemm_node(8192, 8192, 8192).replace(inputs=(0,),
                                                                         outputs=(1,)),),
                    tensors={i: TensorSpec(id=i, shape=(8192, 8192), dtype="bf16")
                             for i in range(2)}, inputs=(0,), outputs=(1,))
    slow = dataclasses.replace(H100, compute_efficiency=0.35)
    t_fast = roofline_times(graph, H100, 1, 1)[0]
    t_slow = roofline_times(graph, slow, 1, 1)[0]
    assert t_slow - 4e-6 == pytest.approx(2 * (t_fast - 4e-6), rel=1e-12)
