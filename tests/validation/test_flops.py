"""FLOP conventions against the closed forms of SCHEMA.md and the sources' own numbers."""

from __future__ import annotations

import pytest

from charon_search.validation.flops import (
    ArchFacts,
    convention_peak_flops_per_s,
    hardware_flops_per_step,
    megatron_core_flops,
    model_flops_per_step,
)


def gpt(l=24, h=2304, V=51200, heads=24, params=1.7e9):  # noqa: E741 - the papers' symbols
    return ArchFacts(num_layers=l, hidden_size=h, vocab_size=V, num_attention_heads=heads,
                     num_key_value_heads=heads, head_dim=h // heads, intermediate_size=4 * h,
                     gated_mlp=False, params=params)


def test_sc21_closed_form_and_table1_row():
    a, B, s = gpt(), 512, 2048
    l, h, V = 24, 2304, 51200  # noqa: E741
    expected = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert hardware_flops_per_step("megatron-sc21", a, B, s, "full") == pytest.approx(expected)
    # SC21 Table 1, 1.7B row: 137 TFLOP/s per GPU is 44 % of the A100's 312.
    peak = convention_peak_flops_per_s("megatron-sc21", "a100-sxm-80gb", "fp16")
    assert 137e12 / peak == pytest.approx(0.44, abs=0.005)


def test_megatron_core_equals_megatron_2022_for_gpt():
    # Megatron-Core's formula reduces to Korthikanti's 72·B·s·l·h²(1 + s/6h + V/12lh) for an MHA
    # GPT block with a 4h non-gated MLP.
    a, B, s = gpt(l=48, h=6144, heads=64), 4, 2048
    assert megatron_core_flops(a, B, s) == pytest.approx(
        model_flops_per_step("megatron-2022", a, B, s), rel=1e-12)


def test_megatron_2022_selective_reproduces_table5_hfu_over_mfu():
    # Korthikanti et al. Table 5: 22B MFU 41.5 % / HFU 43.7 %, 530B MFU 56 % / HFU 57 %.
    for a, mfu, hfu in ((gpt(l=48, h=6144, heads=64), 0.415, 0.437),
                        (gpt(l=105, h=20480, heads=128), 0.56, 0.57)):
        ratio = (hardware_flops_per_step("megatron-2022", a, 4, 2048, "selective")
                 / model_flops_per_step("megatron-2022", a, 4, 2048))
        assert ratio == pytest.approx(hfu / mfu, abs=0.006)
        full = (hardware_flops_per_step("megatron-2022", a, 4, 2048, "full")
                / model_flops_per_step("megatron-2022", a, 4, 2048))
        assert 1.30 < full < 1.34  # one extra forward: about 4/3


def test_llm_foundry_matches_published_mfu(by_id):
    # llm-foundry MPT-1B on 8 H100: 45455 tokens/s/GPU at 41.82 % MFU (BF16 peak 989).
    r = by_id["llmfoundry_h100_80gb_mpt1b_8gpu_seq2048"]
    m = r.model
    a = ArchFacts(num_layers=m["num_layers"], hidden_size=m["hidden_size"],
                  vocab_size=m["vocab_size"], num_attention_heads=m["num_attention_heads"],
                  num_key_value_heads=m["num_attention_heads"],
                  head_dim=m["hidden_size"] // m["num_attention_heads"],
                  intermediate_size=4 * m["hidden_size"], gated_mlp=False, params=m["params"])
    s = r.config["seq_len"]
    flops_per_token = model_flops_per_step("llm-foundry", a, 1, s) / s
    peak = convention_peak_flops_per_s("llm-foundry", "h100-sxm-80gb", "bf16")
    assert r.measured["tokens_per_s_per_gpu"] * flops_per_token / peak == pytest.approx(
        r.measured["mfu"], rel=0.01)
    assert convention_peak_flops_per_s("llm-foundry", "h100-sxm-80gb", "fp8") == 1979e12


def test_palm_and_llama3_six_n_plus_attention():
    a = gpt(l=10, h=1000, heads=10, params=1e9)
    assert model_flops_per_step("palm", a, 2, 100) == pytest.approx(
        2 * 100 * (6e9 + 12 * 10 * 1000 * 100))
    assert model_flops_per_step("llama3", a, 2, 100) == model_flops_per_step("palm", a, 2, 100)


def test_unstated_convention_is_unexpressible():
    from charon_search.validation import Unexpressible

    with pytest.raises(Unexpressible, match="unstated"):
        model_flops_per_step("unstated", gpt(), 1, 1)
