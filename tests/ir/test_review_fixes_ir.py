"""Closed-form checks of the IR review's fixes: the serving-graph cache key (H1), weight-only
quantized GEMM bytes (H2), the ``trace`` CLI's step totals (H3, M5, M6), the eager-attention
fusion's causal discount (M1), fp8 grouped GEMMs (M4) and the build-error message (L4)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from charon_search.catalog import load_model
from charon_search.errors import ConfigError
from charon_search.frontend import trace_model
from charon_search.ir import OpKind
from charon_search.serving._graphs import serving_graphs

_LLAMA = Path(__file__).parents[2] / "charon_search/catalog/configs/llama-3.1-8b.json"


def _hf_llama() -> dict:
    return {k: v for k, v in json.loads(_LLAMA.read_text()).items()
            if not k.startswith("_charon")}


# --------------------------------------------------------------------------------------- H1
def test_serving_graphs_follow_an_edited_config_at_the_same_path(tmp_path):
    """Two configs at one path (one model name, 32 layers, hidden 4096) that differ only in
    ``intermediate_size`` get their own serving graphs in one process. Dense GEMM FLOPs of a
    prefill layer at 1,024 tokens: 2 x 1024 x (4096 x (4096 + 2 x 1024) [q, k, v] + 4096 x 4096
    [o] + 3 x 4096 x I [gate, up, down]) = 446.7 GFLOP at I = 14,336 and 807.5 GFLOP at 28,672
    (the stale cache returned 446.7 for both)."""
    path = tmp_path / "config.json"

    def gemm_gflop(intermediate: int) -> float:
        path.write_text(json.dumps({**_hf_llama(), "intermediate_size": intermediate}))
        spec = load_model(str(path))
        prefill, _ = serving_graphs(spec, tp=1, pp=1, ep=1, dp_attention=False,
                                    precision="bf16")
        return sum(n.flops(1, 1024, 1024) for n in prefill["dense"].nodes
                   if n.kind == OpKind.GEMM) / 1e9

    def closed(i: int) -> float:
        return 2 * 1024 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * i) / 1e9

    assert gemm_gflop(14336) == pytest.approx(closed(14336)) == pytest.approx(446.7, abs=0.05)
    assert gemm_gflop(28672) == pytest.approx(closed(28672)) == pytest.approx(807.5, abs=0.05)


def test_serving_graphs_follow_the_checkpoint_quantization():
    """``_charon_checkpoints`` (left out of ``config_hash``) sets the quantized bytes: Kimi-K2.5's
    int4 experts store 0.5 + 2/32 = 0.5625 bytes a weight in groups of 32; the same model and
    name with groups of 128 store 0.5 + 2/128 = 0.515625."""
    kimi = load_model("kimi-k2.5")
    cfg = json.loads(json.dumps(dict(kimi.hf_config), default=str))
    qc = cfg["_charon_checkpoints"]["int4"]["quantization_config"]
    for group in qc["config_groups"].values():
        group["weights"]["group_size"] = 128
    g128 = dataclasses.replace(kimi, hf_config=cfg)
    assert g128.name == kimi.name

    def weight_bytes(spec) -> set[float]:
        _, decode = serving_graphs(spec, tp=8, pp=1, ep=1, dp_attention=False,
                                   precision="int4", fused_kernels=False)
        return {float(n.params["weight_bytes"](1, 1, 1)) for n in decode["moe"].nodes
                if n.kind == OpKind.GROUPED_GEMM}

    assert weight_bytes(kimi) == {0.5625}
    assert weight_bytes(g128) == {0.515625}


# --------------------------------------------------------------------------------------- H2
def _expert_gate_up(model: str, precision: str, s: int):
    prefill, _ = serving_graphs(load_model(model), tp=1, pp=1, ep=1, dp_attention=False,
                                precision=precision, fused_kernels=False)
    return next(n for n in prefill["moe"].nodes
                if n.kind == OpKind.GROUPED_GEMM and n.role == "moe.expert")


def test_w4a16_experts_read_bf16_activations_and_scaled_4bit_weights():
    """Weight-only (W4A16) experts: only the weights shrink, to the checkpoint's bytes with
    scales; the activations stay bf16.

    Kimi-K2.5 int4 (groups of 32: 0.5625 B), prefill of 4,096 tokens, gate_up: weights
    384 x (2 x 2048) x 7168 x 2 B = 22,548.6 MB in bf16 -> x 0.5625 / 2; activations
    4096 x 8 x 7168 x 2 B = 469.8 MB -> 22548.6 x 0.28125 + 469.8 = 6,811.5 MB (was 5,754.6,
    every byte x 0.25). gpt-oss-120b MXFP4 (0.53125 B), 8,192 tokens: weights
    128 x (2 x 2880) x 2880 x 2 B = 4,246.7 MB, activations 8192 x 4 x 2880 x 2 B = 188.7 MB
    -> 4246.7 x 0.265625 + 188.7 = 1,316.8 MB (was 1,108.9)."""
    kimi = _expert_gate_up("kimi-k2.5", "int4", 4096)
    w, a = 384 * 4096 * 7168 * 2, 4096 * 8 * 7168 * 2
    assert kimi.bytes_read(1, 4096, 4096) == pytest.approx(w * 0.5625 / 2 + a)
    assert kimi.bytes_read(1, 4096, 4096) / 1e6 == pytest.approx(6811.5, abs=0.1)
    oss = _expert_gate_up("gpt-oss-120b", "fp4", 8192)
    w, a = 128 * 5760 * 2880 * 2, 8192 * 4 * 2880 * 2
    assert oss.bytes_read(1, 8192, 8192) == pytest.approx(w * 0.53125 / 2 + a)
    assert oss.bytes_read(1, 8192, 8192) / 1e6 == pytest.approx(1316.8, abs=0.1)


def test_w4a16_experts_compute_at_the_bf16_rate_and_keep_their_measured_rows():
    """A W4A16 kernel dequantizes to bf16 and runs bf16 MMAs: on a B200 the roofline peak of
    gpt-oss's MXFP4 experts is the bf16 2.25e15 FLOP/s, not the FP4 9e15 it used; the node still
    names its measured MoE rows (``moe_dtype:w4a16_mxfp4``)."""
    from charon_search.cost.roofline import node_peak_flops_per_s
    from charon_search.hardware import load_gpu

    node = _expert_gate_up("gpt-oss-120b", "fp4", 8192)
    b200 = load_gpu("b200-sxm-180gb")
    assert node.dtype == "bf16" and "moe_dtype:w4a16_mxfp4" in node.tags
    assert node_peak_flops_per_s(node, b200) == b200.peak_flops("bf16") == 2.25e15


def test_w8a8_fp8_experts_still_halve_every_read():
    """fp8 (W8A8) reads fp8 weights (1 B with block scales) and fp8 activations: Mixtral's
    gate_up at 1,024 tokens reads (8 x 28672 x 4096 + 2048 x 4096) x 1 B = 947.9 MB."""
    node = _expert_gate_up("mixtral-8x7b", "fp8", 1024)
    assert node.dtype == "fp8"
    assert node.bytes_read(1, 1024, 1024) == pytest.approx(
        (8 * 28672 * 4096 + 2048 * 4096) * 1.0, rel=1e-6)


# ---------------------------------------------------------------------------- H3, M5, M6
def _trace_totals(tmp_path, *argv: str) -> dict:
    from charon_search.cli import main

    out = tmp_path / "t.json"
    assert main(["trace", *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_trace_decode_reads_the_experts_the_token_reaches(tmp_path):
    """DeepSeek-V3 decode, b = 1, c = 4,096: one token's 8 of 256 experts. A MoE layer's gate_up
    reads 256 x 4096 x 7168 x 2 B = 15.03 GB of weights as traced; the step total reads the
    share 1 - e^(-1 x 8 / 256) = 0.03077 (7.88 experts) of them, the cost predictor's rule. The
    whole step then moves about the active parameters' bytes: 2 x 37.55e9 = 75.1 GB less
    58 layers x 0.12 idle-expected experts (0.6 GB) and the embedding table (1.9 GB), plus the
    latent KV (0.3 GB) and activations: 74.3 GB, not the 1.34 TB of every expert."""
    from charon_search.cli.trace_cmd import _step_graphs

    spec = load_model("deepseek-v3")
    doc = _trace_totals(tmp_path, "deepseek-v3", "--phase", "decode", "--seq", "4096")
    assert doc["traced_totals"]["bytes"] > 1.3e12
    assert doc["totals"]["bytes"] == pytest.approx(2 * spec.num_active_params, rel=0.02)
    touched = 1 - math.exp(-8 / 256)
    graphs = dict((g.name, g) for _, g in _step_graphs(trace_model(spec, "decode"), spec,
                                                       1, 1, 4096))
    traced = trace_model(spec, "decode").blocks["moe"].forward
    gate_up = next(n for n in traced.nodes if n.kind == OpKind.GROUPED_GEMM)
    fixed = graphs[traced.name].node(gate_up.id)
    weights = 256 * 4096 * 7168 * 2
    assert fixed.bytes_read(1, 1, 4096) == pytest.approx(
        gate_up.bytes_read(1, 1, 4096) - weights * (1 - touched))


def test_trace_prefill_counts_sliding_layers_at_their_window(tmp_path):
    """gpt-oss-120b prefill, s = c = 8,192 (64 heads, head_dim 64, window 128, 18 of 36 layers
    sliding). As traced every layer's attention is 2 x 64 x 8192 x 8192 x 128 = 1.0995e12 FLOP;
    a sliding layer's is 2 x 64 x 8192 x 128 x 128 = 1.718e10 and a full layer's causal half
    5.498e11. The total drops by 18 x (1.0995e12 - 1.718e10) + 18 x 5.498e11 = 29.38 TFLOP,
    from 114.22 to 84.84."""
    from charon_search.cli.trace_cmd import _step_graphs

    spec = load_model("gpt-oss-120b")
    tm = trace_model(spec, "prefill")
    full, window = 2 * 64 * 8192 * 8192 * 128, 2 * 64 * 8192 * 128 * 128
    per_layer: dict[float, int] = {}
    for count, g in _step_graphs(tm, spec, 1, 8192, 8192):
        for n in g.nodes:
            if n.kind == OpKind.ATTENTION:
                f = round(float(n.flops(1, 8192, 8192)))
                per_layer[f] = per_layer.get(f, 0) + count
    assert per_layer == {window: 18, full // 2: 18}
    doc = _trace_totals(tmp_path, "gpt-oss-120b", "--phase", "prefill", "--seq", "8192")
    drop = 18 * (full - window) + 18 * full / 2
    # (+ 0.27 GFLOP of RoPE tables, precomputed in the totals)
    assert doc["traced_totals"]["flops"] - doc["totals"]["flops"] == pytest.approx(drop,
                                                                                    rel=1e-4)
    assert doc["totals"]["flops"] / 1e12 == pytest.approx(84.84, abs=0.01)


def test_trace_decode_embedding_reads_the_looked_up_rows(tmp_path):
    """llama-3.1-8b decode, b = 8: the lookup reads 8 rows x 4096 x 2 B plus 8 int64 ids =
    65,600 B, not the 128,256 x 4096 x 2 B = 1.05 GB table, as traced (``frontend._convert``)
    and in the step graphs."""
    from charon_search.cli.trace_cmd import _step_graphs

    spec = load_model("llama-3.1-8b")
    tm = trace_model(spec, "decode")
    emb = tm.blocks["embedding"].forward
    fixed = dict((g.name, g) for _, g in _step_graphs(tm, spec, 8, 1, 4096))[emb.name]
    lookup = next(n for n in fixed.nodes if n.kind == OpKind.EMBEDDING)
    assert lookup.bytes_read(8, 1, 4096) == 8 * 4096 * 2 + 8 * 8
    assert next(n for n in emb.nodes if n.kind == OpKind.EMBEDDING).bytes_read(
        8, 1, 4096) == 8 * 4096 * 2 + 8 * 8


# --------------------------------------------------------------------------------------- M1
def _fused_attention(phase: str):
    from charon_search.passes.base import PassContext
    from charon_search.passes.parallelize import parallelize_block

    blk = trace_model("llama-3.1-8b", phase, attn_impl="eager").blocks["dense"]
    pb = parallelize_block(blk, PassContext(phase=phase), passes=["fusion"])
    return [n for g in (pb.forward, pb.backward) if g is not None for n in g.nodes
            if n.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD)]


def test_fused_eager_decode_attention_keeps_its_flops():
    """A decode step's one query per sequence sees every cached key: nothing is masked.
    llama-3.1-8b, b = 8, c = 4,096: 2 x 8 x 32 heads x 1 x 4096 x (128 + 128) = 5.369e8 FLOP,
    ``causal=0``, as the SDPA decode node (it was halved to 2.684e8, ``causal=1``)."""
    (node,) = _fused_attention("decode")
    assert node.flops(8, 1, 4096) == 2 * 8 * 32 * 1 * 4096 * 256 == pytest.approx(5.369e8,
                                                                                   rel=1e-4)
    assert node.params["causal"].const_value() == 0


def test_fused_eager_training_attention_keeps_the_causal_half():
    """Training, s = 4,096 (a square causal block): forward 4 x 32 x 4096^2 x 128 / 2 =
    137.44 GFLOP, backward 2.5x = 343.6 GFLOP, ``causal=1``; unchanged by the decode fix."""
    fwd, bwd = _fused_attention("train")
    half = 4 * 32 * 4096 * 4096 * 128 / 2
    assert fwd.flops(1, 4096, 4096) == pytest.approx(half)
    assert bwd.flops(1, 4096, 4096) == pytest.approx(2.5 * half)
    assert fwd.params["causal"].const_value() == bwd.params["causal"].const_value() == 1


# --------------------------------------------------------------------------------------- M4
def test_fp8_grouped_gemms_halve_their_reads_and_quantize_dy_per_layout():
    """fp8 training of Mixtral, s = 4,096: the experts' gate_up reads X [2 x 4096, 4096] and
    W [8, 28672, 4096] (+ 8 int32 offsets): (8192 x 4096 + 8 x 28672 x 4096) x 2 B = 1.946e9 B in
    bf16, half (0.973e9) in fp8, as a dense GEMM. The weight-gradient grouped GEMM reads its
    own transposed fp8 copies (``fp8_quantize_t_*``); its dY is not the dgrad's copy."""
    from charon_search.passes.base import PassContext
    from charon_search.passes.parallelize import parallelize_block

    blk = trace_model("mixtral-8x7b", "train").blocks["moe"]
    bf16 = parallelize_block(blk, PassContext(phase="train"), passes=["fusion"])
    fp8 = parallelize_block(blk, PassContext(phase="train", precision="fp8"),
                            passes=["fusion", "fp8"])

    def grouped(pb, name):
        return next(n for g in (pb.forward, pb.backward) for n in g.nodes if n.name == name)

    read = (8192 * 4096 + 8 * 28672 * 4096) * 2
    assert grouped(bf16, "_grouped_mm").bytes_read(1, 4096, 4096) == pytest.approx(read + 32)
    assert grouped(fp8, "_grouped_mm").bytes_read(1, 4096, 4096) == pytest.approx(
        (read + 32) / 2)
    assert grouped(fp8, "_grouped_mm").bytes_read(1, 4096, 4096) == pytest.approx(0.973e9,
                                                                                   rel=1e-3)
    bwd = fp8.backward
    producer = {t: n for n in bwd.nodes for t in n.outputs}
    wgrad, dgrad = grouped(fp8, "_grouped_mm_2"), grouped(fp8, "_grouped_mm_3")
    wgrad_q = {producer[t].name for t in wgrad.inputs if t in producer}
    dgrad_q = {producer[t].name for t in dgrad.inputs if t in producer}
    assert wgrad_q and all(q.startswith("fp8_quantize_t_") for q in wgrad_q)
    assert dgrad_q and not wgrad_q & dgrad_q


# --------------------------------------------------------------------------------------- L4
def test_a_config_transformers_cannot_build_is_not_called_an_eager_failure(tmp_path):
    """A config that no attention implementation builds (``rope_theta: "abc"``) is reported
    without naming the eager path the parameter count happens to build."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_hf_llama(), "rope_theta": "abc"}))
    with pytest.raises(ConfigError, match="transformers cannot build it") as err:
        trace_model(str(path), "prefill")
    assert "eager" not in str(err.value)
