"""The memory model on graphs traced by the frontend (engineer A's ``trace_model``)."""

from __future__ import annotations

import json

import pytest

from charon_search.catalog import load_model
from charon_search.layout import Layout
from charon_search.memory import (
    ShardingPoint,
    kv_cache_capacity,
    memory_report,
    model_profile,
)
from charon_search.testing import toy_cluster


@pytest.fixture(scope="module")
def gpt3_traced(tmp_path_factory):
    """gpt-175b's config (h = 12288, a = 96, dropout 0.1) with a fused GeLU (``gelu``: saves
    only its input, like Megatron's bias-GeLU fusion) rather than HF's python ``gelu_new``
    (which saves four ffn-wide intermediates), traced with eager attention: the block
    Korthikanti et al. account for. LayerNorm's per-row mean/rstd are the only extra saved
    tensors (2 x 2 x s*b bytes, < 0.01 % of the total)."""
    cfg = json.loads(json.dumps(load_model("gpt-175b").hf_config))
    cfg["activation_function"] = "gelu"
    path = tmp_path_factory.mktemp("gpt") / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(path)
    return spec, model_profile(spec, phase="train", attn_impl="eager")


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "sp", "selective"), [
    (1, False, False), (8, True, False), (8, False, False), (8, True, True), (1, False, True),
])
def test_traced_gpt3_block_matches_korthikanti(gpt3_traced, tp, sp, selective) -> None:
    spec, prof = gpt3_traced
    h, a, s, b = spec.hidden_size, spec.num_attention_heads, 2048, 1
    ev = prof.blocks[spec.block_types[0]].evaluate(
        ShardingPoint(b=b, s=s, c=s, tp=tp, sequence_parallel=sp))
    got = ev["selective_saved"] if selective else ev["saved"]
    scores = 0 if selective else 5 * a * s / (h * tp)
    if sp or tp == 1:
        want = s * b * h * (34 / tp + scores)
    else:  # TP alone: norms, their inputs and the residual dropout masks stay whole
        want = s * b * h * (10 + 24 / tp + scores)
    assert got == pytest.approx(want, rel=0.05)


def test_mpt_block_saves_flash_attention_activations() -> None:
    """MPT's HF attention is eager-only (ALiBi); traced with ``sdpa`` its core is one fused
    kernel, as llm-foundry ran it (``attn_impl: triton``), so the block saves no s x c matrix.
    MPT-13B (h = 5120, a = 40, no dropout, LayerNorm, 4h GeLU MLP) keeps per layer, in units of
    s*b*h bytes (bf16): norm inputs 2 + 2, QKV-GEMM input 2, q/k/v 6, attention output 2,
    MLP-up input 2, GeLU input 8, down-proj input 8 = 32 (Korthikanti et al. 2022's 34 less the
    two dropout masks), plus the kernel's fp32 log-sum-exp (4 a s b bytes).
    Eager (the Megatron-era unfused chain) adds the score matrices: far more at s = 2048."""
    spec = load_model("mpt-13b")
    h, a, s, b = spec.hidden_size, spec.num_attention_heads, 2048, 2
    point = ShardingPoint(b=b, s=s, c=s, tp=1, sequence_parallel=False)
    fused = model_profile(spec, phase="train", attn_impl="sdpa").blocks["dense"].evaluate(point)
    assert fused["saved"] == pytest.approx(32 * s * b * h + 4 * a * s * b, rel=1e-3)
    eager = model_profile(spec, phase="train", attn_impl="eager").blocks["dense"].evaluate(point)
    assert eager["saved"] > fused["saved"] + 2 * a * s * s * b  # at least one bf16 score matrix
    # The 64-GPU llm-foundry run (mbs 2, FSDP) fits in 80 GB with the fused kernel.
    layout = Layout(dp=64, zero_stage=3, micro_batch_size=2, global_batch_size=128, seq_len=s,
                    attention_kernel="flash_triton")
    assert memory_report(spec, layout, "dgx-h100-ib400").fits


def test_debug_llama_end_to_end(tmp_path) -> None:
    spec = load_model("debug-llama")
    base = {"micro_batch_size": 2, "global_batch_size": 8, "seq_len": 256}
    one = memory_report(spec, Layout(**base, dp=4), toy_cluster())
    assert one.fits
    st = one.stages[0]
    # Traced weights: DDP, mixed Adam -> 16 B/param of the model's exact count.
    assert st.params_bytes + st.grads_bytes + st.optimizer_bytes == pytest.approx(
        16 * spec.num_params, rel=0.01)
    assert st.activations_bytes > 0
    # Doubling the micro-batch roughly doubles activations (linear in b with flash attention).
    two = memory_report(spec, Layout(**{**base, "micro_batch_size": 4}, dp=2), toy_cluster())
    ratio = two.stages[0].activations_bytes / st.activations_bytes
    assert 1.8 < ratio < 2.2
    # Selective (attention) recompute never keeps more than none; full keeps least.
    acts = [memory_report(spec, Layout(**base, dp=4, recompute=r), toy_cluster())
            .stages[0].activations_bytes for r in ("none", "selective", "full")]
    assert acts[0] >= acts[1] > acts[2]


def test_debug_llama_kv_capacity() -> None:
    spec = load_model("debug-llama")
    cap = kv_cache_capacity(spec, toy_cluster(), tp=1, max_batched_tokens=2048)
    assert cap.activation_bytes > 0 and cap.cuda_graph_pool_bytes > 0
    assert cap.kv_bytes_per_token == (2 * spec.num_layers * spec.num_key_value_heads
                                      * spec.head_dim * 2)
    assert cap.num_blocks > 0


def test_memory_cli_json(tmp_path, capsys) -> None:
    from charon_search.cli import main

    out = tmp_path / "mem.json"
    rc = main(["memory", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus", "8",
               "--tp", "2", "--pp", "2", "--mbs", "1", "--gbs", "8", "--seq", "512",
               "--zero", "1", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [st["stage"] for st in data["stages"]] == [0, 1]
    assert data["fits"] is True and data["reason"] is None
    assert data["device_memory_bytes"] == 85018877624  # 79.18 GiB
    assert "peak reserved" in capsys.readouterr().out
    rc = main(["memory", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus", "8",
               "--tp", "3"])
    assert rc == 2


def test_debug_moe_experts_shard_over_ep() -> None:
    spec = load_model("debug-moe")
    prof = model_profile(spec)
    counts = {"embedding": 1, "lm_head": 1,
              **{t: spec.num_layers_of(t) for t in spec.block_types}}
    # Weight groups found from the traced consumers add up to the exact parameter count.
    assert sum(prof.params[n].total * c for n, c in counts.items()) == spec.num_params
    experts = prof.params["moe"].expert * spec.num_layers_of("moe")
    assert experts > 0
    base = {"micro_batch_size": 1, "global_batch_size": 4, "seq_len": 128, "dp": 4}
    p1 = memory_report(spec, Layout(**base), toy_cluster()).stages[0].params_bytes
    p2 = memory_report(spec, Layout(**base, ep=2), toy_cluster()).stages[0].params_bytes
    assert p1 - p2 == pytest.approx(2 * experts / 2)
