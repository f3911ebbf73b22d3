"""fp8 GEMMs priced from measured rows that contain the input cast (``sim.costing``)."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.hardware import load_cluster
from charon_search.ir import DTYPE_BYTES, OpKind
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block
from charon_search.sim.costing import MEASURED_FP8_GEMM_QUANT_PROVENANCE, GraphCoster


class _Flat:
    """Every compute node ``ms`` milliseconds, with a fixed provenance (test stand-in)."""

    def __init__(self, provenance: str, ms: float) -> None:
        self.provenance, self.ms = provenance, ms

    def cost_graph(self, graph, b, s, c=None):
        return np.array([np.nan if n.is_comm else self.ms * 1e-3 for n in graph.nodes])


def _fp8_gemm_ms(provenance: str, ms: float, b: int = 8, s: int = 4096) -> list[tuple]:
    cl = load_cluster("h100-sxm-8gpu")
    pb = parallelize_block(synthetic_block("dense"), PassContext(precision="fp8", debug=True))
    cg = GraphCoster(cl, _Flat(provenance, ms), strides={"tp": 1}).cost(pb.forward, b, s)
    clock = cl.gpu.sustained_clock_ratio
    return [(n, d * 1e3, ms / clock) for n, d in zip(pb.forward.nodes, cg.durations_s,
                                                      strict=True)
            if n.kind == OpKind.GEMM and n.dtype == "fp8"]


def test_measured_rows_lose_their_static_input_cast() -> None:
    # aiconfigurator collector/vllm/collect_gemm.py: RowParallelLinear.forward on a bf16 input
    # with Fp8Config(activation_scheme="static") -> one bf16 read + one fp8 write of m x k
    assert MEASURED_FP8_GEMM_QUANT_PROVENANCE == {"profile", "predictor"}
    gpu = load_cluster("h100-sxm-8gpu").gpu
    bw = gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency
    rows = _fp8_gemm_ms("profile", 5.0)
    assert len(rows) == 7
    for n, got, raw in rows:
        m, k = n.params["m"](8, 4096), n.params["k"](8, 4096)
        cast_ms = m * k * (DTYPE_BYTES["bf16"] + DTYPE_BYTES["fp8"]) / bw * 1e3
        assert got == pytest.approx(raw - cast_ms)


def test_roofline_prices_are_unchanged_and_the_gemm_roofline_is_a_floor() -> None:
    for _n, got, raw in _fp8_gemm_ms("roofline", 5.0):
        assert got == pytest.approx(raw)
    gpu = load_cluster("h100-sxm-8gpu").gpu
    for n, got, _raw in _fp8_gemm_ms("predictor", 1e-6):
        # a row faster than its own cast: the GEMM's roofline time remains
        peak = gpu.peak_flops("fp8") * gpu.compute_efficiency_by_dtype.get(
            "fp8", gpu.compute_efficiency)
        assert got * 1e-3 >= n.flops(8, 4096) / peak * 0.999
