"""``GpuSpec.sustained_clock_ratio``: compute-bound kernels slow down, memory-bound ones don't."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from charon_search.errors import ConfigError
from charon_search.hardware import load_cluster
from charon_search.hardware.loader import gpu_from_dict, read_yaml, spec_dirs
from charon_search.ir import OpKind
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block
from charon_search.sim.costing import COMPUTE_BOUND_KINDS, GraphCoster


def _costs(ratio: float) -> tuple[np.ndarray, list]:
    cl = load_cluster("h100-sxm-8gpu")
    cl = dataclasses.replace(cl, gpu=dataclasses.replace(cl.gpu, sustained_clock_ratio=ratio))
    from charon_search.cost.roofline import RooflineCostBackend

    class Roof:  # deterministic: roofline only
        def __init__(self) -> None:
            self.backend = RooflineCostBackend()

        def cost_graph(self, graph, b, s, c=None):
            from charon_search.cost.base import ShapePoint
            out = []
            for n in graph.nodes:
                r = None if n.is_comm else self.backend.cost(n, ShapePoint(b, s, c or s), cl.gpu)
                out.append(np.nan if r is None else r.duration_s)
            return np.array(out)

    g = parallelize_block(synthetic_block("dense"), PassContext()).forward
    coster = GraphCoster(cl, Roof(), strides={"tp": 1})
    return coster.cost(g, 2, 512).durations_s, list(g.nodes)


def test_sustained_clock_divides_only_compute_bound_kernels() -> None:
    full, nodes = _costs(1.0)
    slow, _ = _costs(0.8)
    kinds = {n.kind for n in nodes}
    assert OpKind.GEMM in kinds and OpKind.ATTENTION in kinds
    for n, a, b in zip(nodes, full, slow, strict=True):
        if n.kind in COMPUTE_BOUND_KINDS:
            assert b == pytest.approx(a / 0.8)
        else:
            assert b == pytest.approx(a)


def test_a100_sustained_clock_is_the_published_hpl_clock() -> None:
    gpu = load_cluster("dgx-a100-superpod").gpu
    assert gpu.sustained_clock_ratio == pytest.approx(1305 / 1410, abs=5e-4)
    assert "1,305 MHz" in gpu.sources["sustained_clock_ratio"]


def test_sustained_clock_ratio_must_be_a_ratio() -> None:
    raw = dict(read_yaml(spec_dirs()[-1] / "gpus" / "a100-sxm-80gb.yaml"))
    with pytest.raises(ConfigError, match="sustained_clock_ratio"):
        gpu_from_dict({**raw, "sustained_clock_ratio": 1.3})
