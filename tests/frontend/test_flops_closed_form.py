"""Whole-model training FLOPs of traced Llama-3.1 models against the closed form.

Convention (stated so a person can check it): for one training step on T = b·s tokens,

    FLOPs = 6 · N' · T + 3.5 · L · 4 · b · s² · (heads · head_dim)

* N' = parameters that take part in matmuls = all parameters minus the input embedding table
  (a lookup, no FLOPs); forward 2·N'·T, backward 4·N'·T (Kaplan et al. 2020, arXiv:2001.08361).
* attention per layer forward: Q·Kᵀ and P·V, 2 · 2 · b · s · s · (heads · head_dim), counted over
  the full s × s square (like ``torch.utils.flop_counter``, causal masking not discounted);
  backward 2.5 × forward (``flop_counter``'s SDPA backward), hence 3.5 × forward in total.

The trace also counts norms, RoPE, SiLU, softmax/cross-entropy and residual adds (one FLOP per
element), which the closed form ignores: hence a 2 % tolerance.
"""

from __future__ import annotations

import pytest

from charon_search.catalog import load_model
from charon_search.frontend import trace_model


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b"])
def test_training_flops_match_6NT_plus_attention(name: str) -> None:
    spec = load_model(name)
    tm = trace_model(spec, "train")
    b, s = 1, 4096
    tokens = b * s
    n_matmul = spec.num_params - spec.vocab_size * spec.hidden_size
    attn_fwd = spec.num_layers * 4 * b * s * s * spec.num_attention_heads * spec.head_dim
    closed = 6 * n_matmul * tokens + 3.5 * attn_fwd
    traced = tm.total_flops(b, s)
    assert traced == pytest.approx(closed, rel=0.02)
    # The block-level view agrees: one layer's forward GEMMs = 2·T·(layer linear params).
    dense = tm.blocks["dense"]
    layer_linear = dense.num_params - 2 * spec.hidden_size  # minus the two RMSNorm weights
    fwd = dense.forward.evaluate(b, s)
    gemm = sum(f for f, n in zip(fwd.flops, dense.forward.nodes, strict=True)
               if n.kind == "gemm")
    assert gemm == pytest.approx(2 * tokens * layer_linear, rel=1e-12)
