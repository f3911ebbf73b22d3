"""Shared stand-ins of the training tests: a FLOP/byte roofline cost model and a synthetic
8-layer dense model with its traced blocks (no torch)."""

from __future__ import annotations

import numpy as np

from charon_search.catalog.spec import ModelSpec
from charon_search.passes.synthetic import synthetic_model


class FlopsCostModel:
    """Compute nodes at 100 TFLOP/s or 1 TB/s, whichever is slower (test stand-in)."""

    provenance = "roofline"

    def cost_graph(self, graph, b, s, c=None):
        ev = graph.evaluate(b, s, c)
        return np.maximum(ev.flops / 100e12, ev.bytes / 1e12)


SPEC = ModelSpec(name="synthetic", hf_config={}, model_type="llama", num_layers=8,
                 hidden_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                 intermediate_size=512, vocab_size=1024, layer_types=("dense",) * 8)
TRACED = synthetic_model(SPEC, layer_types=("dense",))
