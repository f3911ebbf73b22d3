"""Predicted elementwise times follow the node's own bytes per element (issue 8)."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.hardware import load_cluster
from charon_search.ir import OpKind
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block
from charon_search.sim.costing import MEASURED_ELEMENTWISE_BYTES_PER_ELEMENT, GraphCoster


class _Flat:
    """Every compute node ``ms`` milliseconds, with a fixed provenance (test stand-in)."""

    def __init__(self, provenance: str, ms: float) -> None:
        self.provenance, self.ms = provenance, ms

    def cost_graph(self, graph, b, s, c=None):
        return np.array([np.nan if n.is_comm else self.ms * 1e-3 for n in graph.nodes])


def _elementwise(provenance: str, ms: float, recipe: str) -> list[tuple]:
    cl = load_cluster("h100-sxm-8gpu")
    ctx = PassContext(precision="fp8", fp8_recipe=recipe, debug=True)
    pb = parallelize_block(synthetic_block("dense"), ctx)
    cg = GraphCoster(cl, _Flat(provenance, ms), strides={"tp": 1}).cost(pb.backward, 8, 4096)
    return [(n, d * 1e3) for n, d in zip(pb.backward.nodes, cg.durations_s, strict=True)
            if n.kind == OpKind.ELEMENTWISE]


def test_casts_outside_the_measured_range_scale_with_their_bytes() -> None:
    # the rows the predictor learned from move 4 B (RoPE) or 6 B (add, SiLU-and-mul) per element
    assert MEASURED_ELEMENTWISE_BYTES_PER_ELEMENT == (4.0, 6.0)
    launch_ms = load_cluster("h100-sxm-8gpu").gpu.launch_overhead_s * 1e3
    rows = _elementwise("predictor", 1.0, "delayed")
    casts = [(n, got) for n, got in rows if n.name.startswith("fp8_quantize")]
    assert casts
    for n, got in casts:
        bpe = float(n.bytes(8, 4096)) / float(n.params["numel"](8, 4096))
        # delayed recipe: 2 B read + 1 B write; the fused transposed copy only writes 1 B
        assert bpe in (3.0, 1.0)
        assert got == pytest.approx(launch_ms + (1.0 - launch_ms) * bpe / 4.0)
    # bf16 elementwise ops in the measured range keep the predicted time
    plain = [got for n, got in rows if n.target != "pass:fp8"
             and 4.0 <= float(n.bytes(8, 4096)) / float(n.params["numel"](8, 4096)) <= 6.0]
    assert plain and all(got == pytest.approx(1.0) for got in plain)


def test_roofline_elementwise_times_are_not_rescaled() -> None:
    # the roofline already prices the node's own bytes
    for _n, got in _elementwise("roofline", 1.0, "delayed"):
        assert got == pytest.approx(1.0)


def test_ops_above_the_measured_range_keep_the_predicted_time() -> None:
    """The selector passes a node's bytes to the predictor, whose time already grows with them
    above 6 B per element (10 B costs 10/6 of 6 B): no second rescale there. An fp32 gradient
    buffer add (2 B read + 4 B read + 4 B written = 10 B/elem) keeps the predicted time."""
    cl = load_cluster("dgx-a100-superpod")
    ctx = PassContext(grad_accum_hook=True, grad_reduce_dtype="fp32", debug=True)
    pb = parallelize_block(synthetic_block("dense"), ctx)
    cg = GraphCoster(cl, _Flat("predictor", 1.0), strides={"tp": 1}).cost(pb.backward, 8, 4096)
    acc = [(n, d * 1e3) for n, d in zip(pb.backward.nodes, cg.durations_s, strict=True)
           if "grad_accum" in n.tags]
    assert len(acc) == len(pb.forward.param_tensors)  # one add_ per parameter tensor
    for n, got in acc:
        assert float(n.bytes(8, 4096)) / float(n.params["numel"](8, 4096)) == 10.0
        assert got == pytest.approx(1.0)
