"""Gated DeltaNet (linear attention) layers: traced as one delta-rule node and one causal
convolution, priced from the measured kernel rows, holding a fixed-size state instead of KV.

Numbers checked against closed forms of the tiny ``debug-hybrid`` config (4 value heads and 2
key heads of 16 dims, conv width 4; three Gated DeltaNet layers, one full-attention layer) and
of Qwen3.5-397B-A17B's ``config.json`` (60 layers, 45 of them Gated DeltaNet with 64 value and
16 key heads of 128 dims; 15 full-attention layers with 2 KV heads of 256 dims).
"""

from __future__ import annotations

import pytest

from charon_search.catalog import load_model
from charon_search.frontend import trace_model
from charon_search.frontend._linear_attn import GDN_CHUNK
from charon_search.ir import OpKind

HV, HK, DK, DV, WIDTH = 4, 2, 16, 16, 4  # debug-hybrid's Gated DeltaNet shapes


def _node(graph, kind=None, tag=None):
    hits = [n for n in graph.nodes
            if (kind is None or n.kind == kind) and (tag is None or tag in n.tags)]
    assert len(hits) == 1, [n.name for n in hits]
    return hits[0]


def test_hybrid_spec_layer_types_and_kv_layers() -> None:
    spec = load_model("debug-hybrid")
    assert spec.layer_types == ("moe_linear", "moe_linear", "moe_linear", "moe")
    assert spec.num_kv_layers == 1
    assert spec.extra["linear_attention"] == {"k_heads": HK, "v_heads": HV, "k_head_dim": DK,
                                              "v_head_dim": DV, "conv_kernel": WIDTH}
    q35 = load_model("qwen3.5-397b-a17b")
    assert q35.num_layers == 60 and q35.num_kv_layers == 15
    assert q35.num_experts == 512 and q35.num_experts_per_token == 10
    assert q35.num_shared_experts == 1
    # 396.3e9 parameters of the language model (the release's 397B adds the vision tower).
    assert q35.num_params == pytest.approx(396.35e9, rel=1e-3)


def test_prefill_delta_rule_flops_and_final_state() -> None:
    g = trace_model(load_model("debug-hybrid"), "prefill").blocks["moe_linear"].forward
    node = _node(g, OpKind.LINEAR_ATTENTION)
    b, s = 2.0, 256.0
    per_token_head = 6 * DK * DV + 2 * GDN_CHUNK * (2 * DK + DV)
    assert node.flops(b, s, s) == b * s * HV * per_token_head
    # Writes its output (bf16) and each sequence's final fp32 state.
    assert node.bytes_written(b, s, s) == b * s * HV * DV * 2 + b * HV * DK * DV * 4
    conv = _node(g, tag="causal_conv1d")
    channels = 2 * HK * DK + HV * DV
    assert conv.flops(b, s, s) == 2 * WIDTH * b * s * channels


def test_decode_reads_and_writes_the_state_whatever_the_context() -> None:
    g = trace_model(load_model("debug-hybrid"), "decode").blocks["moe_linear"].forward
    node = _node(g, OpKind.LINEAR_ATTENTION)
    b = 8.0
    state = b * HV * DK * DV * 4
    assert node.flops(b, 1, 100) == node.flops(b, 1, 4000) == b * HV * 7 * DK * DV
    qkv_in = b * (2 * HK * DK + HV * DV) * 2 + b * 2 * HV * 4  # q, k, v (bf16), g, beta (fp32)
    assert node.bytes_read(b, 1, 4000) == pytest.approx(state + qkv_in, rel=0.05)
    assert node.bytes_written(b, 1, 4000) == b * HV * DV * 2 + state


def test_training_backward_is_2_5x_forward() -> None:
    blk = trace_model(load_model("debug-hybrid"), "train").blocks["moe_linear"]
    fwd = _node(blk.forward, OpKind.LINEAR_ATTENTION)
    bwd = _node(blk.backward, OpKind.LINEAR_ATTENTION_BWD)
    assert bwd.flops(2, 512, 512) == 2.5 * fwd.flops(2, 512, 512)


def test_tensor_parallel_splits_the_heads() -> None:
    from charon_search.passes import parallelize_inference

    traced = trace_model(load_model("debug-hybrid"), "prefill")
    one = _node(traced.blocks["moe_linear"].forward, OpKind.LINEAR_ATTENTION)
    two = _node(parallelize_inference(traced, tp=2, ep=1)["moe_linear"],
                OpKind.LINEAR_ATTENTION)
    assert two.params["heads"](1, 1, 1) == HV / 2 and two.params["k_heads"](1, 1, 1) == HK / 2
    assert two.flops(1, 1024, 1024) == one.flops(1, 1024, 1024) / 2


def test_kv_and_state_memory_of_qwen35() -> None:
    from charon_search.memory.serving import kv_bytes_per_token, linear_state_bytes_per_request

    spec = load_model("qwen3.5-397b-a17b")
    # 15 full-attention layers x K and V x one KV head (2 heads over 8 ranks: replicated)
    # x 256 dims x 1 byte (fp8); the 45 Gated DeltaNet layers hold no KV.
    assert kv_bytes_per_token(spec, tp=8, kv_dtype="fp8") == 15 * 2 * 1 * 256 * 1
    # Per request on one of 8 GPUs: 45 layers x (8 value heads x 128 x 128 fp32 state
    # + (2 x 16 x 128 + 64 x 128) / 8 conv channels x 3 past inputs x 2 bytes).
    per_layer = 8 * 128 * 128 * 4 + (2 * 16 * 128 + 64 * 128) // 8 * 3 * 2
    assert linear_state_bytes_per_request(spec, tp=8) == 45 * per_layer


def test_sglang_memory_split_for_linear_states() -> None:
    from charon_search.memory.serving import kv_cache_capacity, linear_state_bytes_per_request

    spec = load_model("qwen3.5-397b-a17b")
    kw = dict(tp=8, ep=8, weight_dtype="fp8", kv_dtype="fp8")
    plain = kv_cache_capacity(spec, "h200-sxm-8gpu", **kw)
    split = kv_cache_capacity(spec, "h200-sxm-8gpu", linear_state_ratio=0.9, **kw)
    # SGLang --mamba-full-memory-ratio 0.9: states get 0.9 / 1.9 of the cache memory.
    total = plain.available_bytes
    assert split.linear_state_bytes == pytest.approx(total * 0.9 / 1.9)
    assert split.available_bytes == pytest.approx(total / 1.9)
    assert split.linear_state_slots == int(split.linear_state_bytes
                                           // linear_state_bytes_per_request(spec, tp=8))


def test_delta_rule_priced_from_measured_kernel_rows() -> None:
    from charon_search.cost.profile_db import default_profile_db
    from charon_search.cost.selector import default_cost_model
    from charon_search.hardware import load_cluster
    from charon_search.serving._graphs import serving_graphs

    db = default_profile_db()
    rows = db.table("h200-sxm-141gb", "linear_attention").to_pandas()
    mine = rows[(rows.heads == 8) & (rows.kv_heads == 2) & (rows.head_dim == 128)]

    def measured(variant: str, col: str, x: float) -> float:
        sel = mine[(mine.variant == variant) & (mine[col] == x)
                   & ((mine.q_len == 1) if col == "batch" else (mine.batch == 1))]
        return float(sel.latency_s.iloc[0])

    spec = load_model("qwen3.5-397b-a17b")
    model = default_cost_model(load_cluster("h200-sxm-8gpu"))
    pre, dec = serving_graphs(spec, tp=8, pp=1, ep=8, dp_attention=False, precision="fp8",
                              engine="sglang")
    for graph, (b, s), kernels in (
            (pre["moe_linear"], (1, 1024), (("prefill", "q_len", 1024), ("conv_prefill",
                                                                          "q_len", 1024))),
            (dec["moe_linear"], (4, 1), (("decode", "batch", 4), ("conv_decode", "batch", 4)))):
        cost = model.cost_graph_detailed(graph, b, s, 1024)
        i = next(j for j, n in enumerate(graph.nodes) if n.kind == OpKind.LINEAR_ATTENTION)
        conv = next(j for j, n in enumerate(graph.nodes) if "causal_conv1d" in n.tags)
        want = sum(measured(*k) for k in kernels)
        assert cost.provenance[i] == "profile"
        assert cost.durations_s[i] == pytest.approx(want, rel=1e-9)
        assert cost.durations_s[conv] == 0.0  # charged to the delta-rule node
    # Between measured token counts: log-log interpolation lies between the neighbours.
    cost = model.cost_graph_detailed(pre["moe_linear"], 1, 1500, 1500)
    i = next(j for j, n in enumerate(pre["moe_linear"].nodes)
             if n.kind == OpKind.LINEAR_ATTENTION)
    lo = measured("prefill", "q_len", 1024) + measured("conv_prefill", "q_len", 1024)
    hi = measured("prefill", "q_len", 2048) + measured("conv_prefill", "q_len", 2048)
    assert lo < cost.durations_s[i] < hi


def test_sglang_runs_hybrid_models_without_overlap() -> None:
    from charon_search.serving.backends import engine_profile

    plain = engine_profile("sglang", isl=1024, max_batch_size=8, launcher="inferencex")
    hybrid = engine_profile("sglang", isl=1024, max_batch_size=8, launcher="inferencex",
                            linear_attention=True)
    assert plain.overlap_scheduler and not hybrid.overlap_scheduler
    assert any("MambaRadixCache" in s for s in hybrid.sources)
