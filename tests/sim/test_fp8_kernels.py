"""fp8 GEMM kernel family: cuBLASLt = CUTLASS row x measured ratio (``sim.fp8_kernels``)."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.errors import ConfigError
from charon_search.hardware import load_cluster
from charon_search.ir import OpKind
from charon_search.layout import Layout
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block
from charon_search.sim.costing import GraphCoster
from charon_search.sim.fp8_kernels import cublaslt_over_cutlass, cublaslt_ratio_table


def test_ratio_is_the_measured_row_at_a_measured_shape() -> None:
    # data/kernels/fp8_gemm_cublaslt_over_cutlass.csv rows (aiconfigurator-core H100 SXM:
    # TRT-LLM cublas_scaled_mm over vLLM CUTLASS, both with the static input cast)
    assert cublaslt_over_cutlass("h100-sxm-80gb", 16384, 4096, 4096) == pytest.approx(0.9416)
    assert cublaslt_over_cutlass("h100-sxm-80gb", 16384, 4096, 512) == pytest.approx(0.5208)


def test_ratio_takes_the_nearest_shape_and_clips_m_to_the_measured_range() -> None:
    at = cublaslt_over_cutlass("h100-sxm-80gb", 32768, 4096, 4096)
    assert cublaslt_over_cutlass("h100-sxm-80gb", 98304, 4096, 4096) == at
    assert cublaslt_over_cutlass("h100-sxm-80gb", 16000, 4100, 4000) == pytest.approx(0.9416)


def test_no_ratio_without_both_tables() -> None:
    assert cublaslt_over_cutlass("a100-sxm-80gb", 16384, 4096, 4096) is None
    assert set(cublaslt_ratio_table()) == {"h100-sxm-80gb", "h200-sxm-141gb"}


def test_layout_and_coster_check_the_kernel_family() -> None:
    assert Layout().fp8_gemm_kernel == "cutlass"
    with pytest.raises(ConfigError, match="fp8_gemm_kernel"):
        Layout(fp8_gemm_kernel="deepgemm")
    with pytest.raises(ConfigError, match="fp8_gemm_kernel"):
        GraphCoster(None, None, strides={}, fp8_gemm_kernel="deepgemm")


class _Flat:
    """Every compute node ``ms`` milliseconds from "measured rows" of one GPU (stand-in)."""

    provenance = "profile"

    def __init__(self, ms: float, gpu_key: str | None) -> None:
        self.ms, self.gpu_key = ms, gpu_key

    def cost_graph(self, graph, b, s, c=None):
        return np.array([np.nan if n.is_comm else self.ms * 1e-3 for n in graph.nodes])


def _fp8_gemms(kernel: str, gpu_key: str | None) -> list[tuple]:
    cl = load_cluster("h100-sxm-8gpu")
    pb = parallelize_block(synthetic_block("dense"), PassContext(precision="fp8"))
    cg = GraphCoster(cl, _Flat(5.0, gpu_key), strides={"tp": 1},
                     fp8_gemm_kernel=kernel).cost(pb.forward, 8, 4096)
    return [(n, d) for n, d in zip(pb.forward.nodes, cg.durations_s, strict=True)
            if n.kind == OpKind.GEMM and n.dtype == "fp8"]


def test_cublaslt_scales_measured_fp8_rows_by_the_ratio_before_the_cast_comes_off() -> None:
    cut = _fp8_gemms("cutlass", "h100-sxm-80gb")
    cub = _fp8_gemms("cublaslt", "h100-sxm-80gb")
    gpu = load_cluster("h100-sxm-8gpu").gpu
    bw = gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency
    clock_ms = 5.0e-3 / gpu.sustained_clock_ratio
    for (n, d_cut), (_, d_cub) in zip(cut, cub, strict=True):
        m, nn, k = (float(n.params[x](8, 4096)) for x in ("m", "n", "k"))
        cast_s = m * k * 3 / bw
        r = cublaslt_over_cutlass("h100-sxm-80gb", m, nn, k)
        assert d_cut == pytest.approx(clock_ms - cast_s)
        assert d_cub == pytest.approx(clock_ms * r - cast_s)
    # no ratio for a GPU without both tables: the rows stay as they are
    assert [d for _, d in _fp8_gemms("cublaslt", "a100-sxm-80gb")] == pytest.approx(
        [d for _, d in _fp8_gemms("cutlass", "a100-sxm-80gb")])
