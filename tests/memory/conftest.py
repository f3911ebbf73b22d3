"""Fixtures of the memory tests: a hand-built GPT-3 block profile and a GPT-3-like spec."""

from __future__ import annotations

import pytest

from charon_search.catalog.spec import ModelSpec
from charon_search.memory import ModelMemoryProfile

from .gpt_graph import gpt_block

#: GPT-3 175B shape (Brown et al., arXiv 2005.14165, Table 2.1): h = 12288, a = 96, L = 96.
GPT3_H, GPT3_A = 12288, 96


def gpt_spec(h: int = GPT3_H, a: int = GPT3_A, layers: int = 96, vocab: int = 51200) -> ModelSpec:
    return ModelSpec(
        name=f"test-gpt-{h}x{layers}", hf_config={"model_type": "gpt2"}, model_type="gpt2",
        num_layers=layers, hidden_size=h, num_attention_heads=a, num_key_value_heads=a,
        head_dim=h // a, intermediate_size=4 * h, vocab_size=vocab, gated_mlp=False,
        attention="mha", layer_types=("dense",) * layers,
    )


@pytest.fixture(scope="session")
def gpt3_block():
    return gpt_block(GPT3_H, GPT3_A)


@pytest.fixture(scope="session")
def gpt3_profile(gpt3_block) -> ModelMemoryProfile:
    spec = gpt_spec()
    return ModelMemoryProfile.from_blocks(spec, {"dense": gpt3_block}, attn_impl="eager")
