"""Active parameters: what one token uses, against the model cards' figures."""

from __future__ import annotations

import pytest

from charon_search.catalog import load_model


@pytest.mark.parametrize(("name", "published"), [
    ("deepseek-v3", 37e9),       # DeepSeek-V3 report: 671 B total, 37 B activated
    ("qwen3-235b-a22b", 22e9),   # the "A22B" of its name
    ("qwen3-30b-a3b", 3.3e9),    # Qwen3 model card: 3.3 B activated
    ("mixtral-8x7b", 12.9e9),    # Mistral AI: 12.9 B active
])
def test_active_params_match_the_model_cards(name: str, published: float) -> None:
    spec = load_model(name)
    per_expert = 3 * spec.hidden_size * spec.moe_intermediate_size
    moe_layers = sum(1 for t in spec.layer_types if t.startswith("moe")) or spec.num_layers
    idle = spec.num_experts - spec.num_experts_per_token
    assert spec.num_active_params == spec.num_params - moe_layers * idle * per_expert
    assert spec.num_active_params == pytest.approx(published, rel=0.02)


def test_a_dense_model_uses_every_parameter() -> None:
    spec = load_model("llama-3.1-8b")
    assert spec.num_active_params == spec.num_params == 8_030_261_248
