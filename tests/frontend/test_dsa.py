"""DeepSeek Sparse Attention (GLM-5): traced as the lightning indexer and a sparse MLA node,
priced from SGLang's measured GLM-5 kernels, with the indexer's key cache in the KV bytes.

Numbers checked against closed forms of GLM-5's ``config.json`` (78 layers; MLA with
kv_lora_rank 512, qk_rope_head_dim 64, 64 heads; indexer of 32 heads x 128 dims keeping the
top 2,048 keys) and against the measured rows shipped in ``sparse_attention.parquet``
(aiconfigurator-core, SGLang 0.5.14 on H200).
"""

from __future__ import annotations

import pytest

from charon_search.catalog import load_model
from charon_search.frontend import trace_model
from charon_search.ir import OpKind, Role

HEADS, RANK, ROPE = 64, 512, 64  # MLA: 64 heads, latent 512 + RoPE 64
IDX_HEADS, IDX_DIM, TOPK = 32, 128, 2048


@pytest.fixture(scope="module")
def spec():
    return load_model("glm-5")


@pytest.fixture(scope="module")
def traced(spec):
    return {ph: trace_model(spec, ph) for ph in ("prefill", "decode")}


def _one(graph, pred):
    hits = [n for n in graph.nodes if pred(n)]
    assert len(hits) == 1, [n.name for n in hits]
    return hits[0]


def _indexer(graph):
    return _one(graph, lambda n: n.kind == OpKind.SPARSE_INDEXER)


def _sparse_mla(graph):
    return _one(graph, lambda n: n.kind == OpKind.ATTENTION)


def test_catalog_entry(spec):
    assert spec.num_layers == 78
    assert spec.layer_types[:3] == ("dense",) * 3 and set(spec.layer_types[3:]) == {"moe"}
    assert spec.extra["dsa"] == {"index_heads": IDX_HEADS, "index_head_dim": IDX_DIM,
                                 "index_topk": TOPK, "indexer_layers": 78}
    # zai-org/GLM-5 model card: 744B parameters (40B active).
    assert spec.num_params == pytest.approx(744e9, rel=2e-3)


def test_indexer_flops_and_role(traced):
    for phase, s in (("prefill", 512.0), ("decode", 1.0)):
        node = _indexer(traced[phase].blocks["moe"].forward)
        assert node.role == Role.ATTN_INDEXER
        b, c = 4.0, 4096.0
        # 2 x 32 heads x 128 dims per (query, key) pair, over every cached key.
        assert node.flops(b, s, c) == 2 * IDX_HEADS * IDX_DIM * b * s * c
        assert node.params["topk"].const_value() == TOPK


def test_sparse_mla_attends_at_most_topk_keys(traced):
    g = traced["decode"].blocks["moe"].forward
    node = _sparse_mla(g)
    assert node.sparse_topk == TOPK
    assert node.attended_c(1000) == 1000 and node.attended_c(50_000) == TOPK
    b = 8.0
    per_key = 2 * HEADS * ((RANK + ROPE) + RANK)  # absorbed MLA: QK over 576, PV over 512
    row = g.nodes.index(node)
    assert g.evaluate(b, 1, 1000).flops[row] == b * 1000 * per_key
    # Beyond the top-k the node costs the same; the indexer keeps growing with the context.
    assert g.evaluate(b, 1, 50_000).flops[row] == g.evaluate(b, 1, TOPK).flops[row]
    idx = g.nodes.index(_indexer(g))
    assert g.evaluate(b, 1, 50_000).flops[idx] == 2 * IDX_HEADS * IDX_DIM * b * 50_000


def test_tensor_parallel_shards_mla_heads_not_the_indexer(traced):
    from charon_search.passes import parallelize_inference

    g = parallelize_inference(traced["decode"], tp=8, ep=1)["moe"]
    assert _sparse_mla(g).params["heads"].const_value() == HEADS / 8
    assert _indexer(g).params["heads"].const_value() == IDX_HEADS  # replicated
    # ... with all of its work on every rank, the sparse MLA with 1/8 of its heads.
    assert _indexer(g).flops(4, 1, 1000) == 2 * IDX_HEADS * IDX_DIM * 4 * 1000
    assert _sparse_mla(g).flops(4, 1, 1000) == 4 * 1000 * 2 * (HEADS / 8) * (2 * RANK + ROPE)


def test_kv_bytes_per_token_include_the_indexer_keys(spec):
    from charon_search.memory.serving import kv_bytes_per_token

    # fp8: FlashMLA's sparse layout (512 fp8 + 4 fp32 scales + 64 bf16 RoPE = 656 B) plus the
    # indexer's fp8 key with one fp32 scale (128 + 4 = 132 B), per layer, on every TP rank.
    assert kv_bytes_per_token(spec, tp=8, kv_dtype="fp8") == 78 * (656 + 132)
    assert kv_bytes_per_token(spec, tp=8, kv_dtype="bf16") == 78 * ((RANK + ROPE) * 2 + 132)


def test_decode_kernels_priced_from_the_measured_rows(traced):
    from charon_search.cost.selector import FusedCostModel
    from charon_search.hardware import load_cluster
    from charon_search.passes import parallelize_inference

    model = FusedCostModel(load_cluster("h200-sxm-8gpu"))
    g = parallelize_inference(traced["decode"], tp=8, ep=1)["moe"]
    idx, mla = g.nodes.index(_indexer(g)), g.nodes.index(_sparse_mla(g))
    cost = model.cost_graph_detailed(g, 64, 1, 4097)
    # SGLang 0.5.14 H200 top-k over 4,097 keys at batch 64: 11.8 us. Decode logits: the paged
    # kernel reading 64 x 4,097 fp8 keys with their scales (132 B each), at the roofline.
    roof = model._roofline(_indexer(g), 64, 1, 4097)[0]
    assert _indexer(g).bytes_read(64, 1, 4097) == pytest.approx(64 * 4097 * 132, rel=0.01)
    assert cost.provenance[idx] == "profile"
    assert cost.durations_s[idx] == pytest.approx(11.8e-6 + roof, rel=0.01)
    # At 2,048 keys every key is kept: no top-k kernel, the logits only.
    assert model.cost_graph_detailed(g, 64, 1, 2048).durations_s[idx] == pytest.approx(
        model._roofline(_indexer(g), 64, 1, 2048)[0], rel=0.01)
    # The decode sparse MLA is an MLA decode over its 2,048 kept keys (not the measured rows of
    # the prefill kernel): beyond the top-k it costs the same.
    assert cost.provenance[mla] != "profile"
    assert cost.durations_s[mla] == pytest.approx(
        model.cost_graph_detailed(g, 64, 1, 2048).durations_s[mla], rel=1e-9)


def test_decode_sparse_attention_grows_like_the_measured_module(traced):
    """aiconfigurator's whole-module GLM-5-FP8 decode rows (SGLang 0.5.14, H200, TP 8, fp8 KV,
    ``dsa_generation_module_perf``: projections, indexer, sparse attention, o_proj) at batch 4:
    79.4 us with 1 cached token, 101.3 us with 8,192. The projections do not depend on the
    context, so the indexer and the sparse MLA account for the 21.9 us of growth."""
    from charon_search.cost.selector import FusedCostModel
    from charon_search.hardware import load_cluster
    from charon_search.passes import parallelize_inference

    model = FusedCostModel(load_cluster("h200-sxm-8gpu"))
    g = parallelize_inference(traced["decode"], tp=8, ep=1)["moe"]
    rows = [g.nodes.index(_indexer(g)), g.nodes.index(_sparse_mla(g))]

    def core(c: float) -> float:
        return sum(model.cost_graph_detailed(g, 4, 1, c).durations_s[i] for i in rows)

    assert core(8193) - core(2) == pytest.approx(21.9e-6, rel=0.25)


def test_prefill_indexer_priced_from_the_measured_rows(traced):
    from charon_search.cost.selector import FusedCostModel
    from charon_search.hardware import load_cluster
    from charon_search.passes import parallelize_inference

    model = FusedCostModel(load_cluster("h200-sxm-8gpu"))
    g = parallelize_inference(traced["prefill"], tp=8, ep=1)["moe"]
    cost = model.cost_graph_detailed(g, 1, 4096, 4096)
    idx = g.nodes.index(_indexer(g))
    # One 4,096-token prompt: DeepGEMM fp8_mqa_logits 80.6 us + top-k 131.9 us (H200 rows).
    assert cost.durations_s[idx] == pytest.approx((80.6 + 131.9) * 1e-6, rel=0.01)
