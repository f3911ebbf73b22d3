"""Fused selector: profile hit -> predictor -> roofline, with provenance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from charon_search.cost import predictor as P
from charon_search.cost.base import COST_BACKENDS, ShapePoint
from charon_search.cost.profile_db import default_profile_db, subset_profile_db
from charon_search.cost.roofline import RooflineCostBackend
from charon_search.cost.selector import (
    ATTENTION_BWD_FLOP_RATIO,
    FusedCostModel,
    PredictorCostBackend,
    ProfileCostBackend,
    default_cost_model,
)
from charon_search.hardware import load_cluster
from charon_search.ir import Node, OpGraph, OpKind, Phase
from charon_search.ir.graph import poly_params
from charon_search.ir.symbolic import Poly, sym
from charon_search.testing import CostBackendContract, comm_node, gemm_node, toy_cluster

GPU = "h100-sxm-80gb"
SMALL_HP = {**P.HYPERPARAMS, "max_iter": 80, "learning_rate": 0.15}
P1 = ShapePoint(1, 1, 1)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    db = subset_profile_db(default_profile_db(), tmp_path_factory.mktemp("pdb"), gpus=[GPU],
                           op_kinds=["gemm", "attention", "norm", "elementwise"], every=8,
                           keep={"gemm": [{"m": 4096, "n": 4096, "k": 4096}],
                                 "attention": [{"batch": 1, "heads": 32, "kv_heads": 8,
                                                "q_len": 4096, "kv_len": 4096,
                                                "head_dim": 128}]})
    return FusedCostModel(toy_cluster(), db=db, store=P.PredictorStore(db, hyperparams=SMALL_HP))


def _attn(kind: OpKind, q, kv, node_id=0) -> Node:
    return Node(id=node_id, name=f"attn{node_id}", kind=kind, phase=Phase.FORWARD,
                params=poly_params(batch=1, heads=32, kv_heads=8, q_len=q, kv_len=kv,
                                   head_dim=128, v_head_dim=128, causal=1),
                flops=Poly.const(1e9), bytes_read=Poly.const(1e6))


def test_profile_hit_returns_the_measurement(model):
    cost = model.cost(gemm_node(4096, 4096, 4096), P1)
    # aiconfigurator h100_sxm gemm/vllm/0.24.0 torch linear bf16 4096^3: 0.166026 ms.
    assert cost.provenance == "profile"
    assert cost.duration_s == pytest.approx(0.166026e-3, rel=1e-5)
    attn = model.cost(_attn(OpKind.ATTENTION, 4096, 4096), P1)
    assert attn.provenance == "profile"
    assert attn.duration_s == pytest.approx(0.264315e-3, rel=1e-5)  # FA3, b1 h32 kv8 d128


def test_fallback_order_and_provenance(model):
    unseen = model.cost(gemm_node(3000, 5000, 7000), P1)
    assert unseen.provenance == "predictor" and unseen.detail == "model"
    roof = RooflineCostBackend().cost(gemm_node(3000, 5000, 7000), P1, model.gpu)
    assert unseen.duration_s == pytest.approx(roof.duration_s, rel=0.5)
    softmax = Node(id=1, name="sm", kind=OpKind.SOFTMAX, params=poly_params(rows=8, cols=8),
                   flops=Poly.const(320), bytes_read=Poly.const(256))
    res = model.cost(softmax, P1)  # no softmax measurements anywhere
    assert res.provenance == "roofline"
    assert res.duration_s == RooflineCostBackend().cost(softmax, P1, model.gpu).duration_s
    assert model.cost(comm_node(OpKind.ALL_REDUCE, 2**20, 8), P1) is None


def test_attention_backward_is_scaled_forward(model):
    q = 3000  # not measured: both go through the predictor
    fwd = model.cost(_attn(OpKind.ATTENTION, q, q), P1)
    bwd = model.cost(_attn(OpKind.ATTENTION_BWD, q, q), P1)
    assert fwd.provenance == "predictor"
    assert (bwd.provenance, bwd.detail) == ("predictor", "fwd-scaled")
    assert bwd.duration_s == pytest.approx(ATTENTION_BWD_FLOP_RATIO * fwd.duration_s)


def test_attention_backward_of_a_measured_forward_scales_the_measurement(model):
    # The forward at this shape is a profile row (FA3, 0.264315 ms): the backward uses it,
    # not a predictor that may disagree with the measurement at the same shape.
    bwd = model.cost(_attn(OpKind.ATTENTION_BWD, 4096, 4096), P1)
    assert (bwd.provenance, bwd.detail) == ("profile", "fwd-scaled")
    assert bwd.duration_s == pytest.approx(ATTENTION_BWD_FLOP_RATIO * 0.264315e-3, rel=1e-5)


def test_gpu_without_data_is_roofline_with_warning():
    fused = FusedCostModel(toy_cluster(gpu="l20-48gb"))
    assert fused.warnings == ["no profile data for l20-48gb; roofline only"]
    node = gemm_node(4096, 4096, 4096)
    res = fused.cost(node, P1)
    assert res.provenance == "roofline"
    assert res.duration_s == RooflineCostBackend().cost(node, P1, fused.gpu).duration_s


def test_cost_graph_matches_nodes_and_memoizes(model):
    b, s = sym("b"), sym("s")
    nodes = (gemm_node(b * s, 4096, 4096, node_id=0), gemm_node(b * s, 1000, 3000, node_id=1),
             comm_node(OpKind.ALL_REDUCE, b * s * 8192, 2, node_id=2),
             _attn(OpKind.ATTENTION, s, s, node_id=3).replace(
                 params=poly_params(batch=b, heads=32, kv_heads=8, q_len=s, kv_len=s,
                                    head_dim=128, v_head_dim=128, causal=1)))
    graph = OpGraph(name="g", nodes=nodes, tensors={})
    detailed = model.cost_graph_detailed(graph, 1, 4096)
    assert detailed.provenance == ("profile", "predictor", "", "profile")
    durations = model.cost_graph(graph, 1, 4096)
    assert durations is detailed.durations_s  # memoized
    assert math.isnan(durations[2])
    for i in (0, 1, 3):
        assert durations[i] == model.cost(nodes[i], ShapePoint(1, 4096, 4096)).duration_s
    shares = detailed.shares()
    assert set(shares) == {"profile", "predictor"} and sum(shares.values()) == pytest.approx(1)
    assert model.cost_graph(graph, 2, 4096)[0] > durations[0]


def test_backends_registered():
    assert COST_BACKENDS.get("profile") is ProfileCostBackend
    assert COST_BACKENDS.get("predictor") is PredictorCostBackend


def test_default_cost_model_cached():
    cl = toy_cluster()
    assert default_cost_model(cl) is default_cost_model(cl)


class TestProfileBackendContract(CostBackendContract):
    backend_factory = ProfileCostBackend


def test_profile_backend_hit_and_miss():
    backend, gpu = ProfileCostBackend(), toy_cluster().gpu
    hit = backend.cost(gemm_node(4096, 4096, 4096), P1, gpu)
    assert hit.provenance == "profile"
    assert hit.duration_s == pytest.approx(0.166026e-3, rel=1e-5)
    assert backend.cost(gemm_node(4095, 4096, 4096), P1, gpu) is None


def test_predictor_durations_are_finite_positive(model):
    m = np.array([1, 7, 100, 1000, 5000, 20000])
    graph = OpGraph(name="gs", nodes=tuple(gemm_node(int(x), 2048, 1536, node_id=i)
                                           for i, x in enumerate(m)), tensors={})
    d = model.cost_graph(graph, 1, 1)
    assert np.all(np.isfinite(d)) and np.all(d > 0)
    assert np.all(np.diff(d[2:]) > 0)  # from 100 tokens on, more tokens take longer


@pytest.mark.slow
class TestPredictorBackendContract(CostBackendContract):
    """Trains the shipped H100 GEMM predictors (bf16, fp8) once per test session."""

    backend_factory = PredictorCostBackend


def _mla_decode(batch: int, kv: int) -> Node:
    return Node(id=0, name="mla", kind=OpKind.ATTENTION, phase=Phase.FORWARD,
                params=poly_params(batch=batch, heads=16, kv_heads=1, q_len=1, kv_len=kv,
                                   head_dim=576, v_head_dim=576, causal=0),
                flops=Poly.const(1e9), bytes_read=Poly.const(1e6))


def test_mla_decode_is_priced_from_the_measured_mla_kernel():
    """Absorbed MLA decode (16 query heads of a TP-8 DeepSeek rank over one 576-wide latent KV
    head) is its own kernel; its rows are aiconfigurator-core's ``generation_mla_perf``
    (TensorRT-LLM 1.3.0rc20, bf16 KV): batch 32 at 4096 cached tokens, H200 0.05442 ms,
    H100 0.06825 ms. The FA3 rows it was extrapolated from before priced it ~1.8x higher. A GPU
    without MLA rows falls back to the decode model instead of failing."""
    db = default_profile_db()
    shape = {"batch": 32, "heads": 16, "kv_heads": 1, "q_len": 1, "kv_len": 4096,
             "head_dim": 576}
    for gpu, ms in (("h200-sxm-141gb", 0.05442), ("h100-sxm-80gb", 0.06825)):
        assert db.exact(gpu, "attention", "decode_mla", "bf16", shape) == pytest.approx(
            ms * 1e-3, rel=1e-3)
    h200 = FusedCostModel(toy_cluster(gpu="h200-sxm-141gb"), db=db)
    cost = h200.cost(_mla_decode(32, 4096), P1)
    assert cost.provenance == "profile"
    assert cost.duration_s == pytest.approx(0.05442e-3, rel=1e-3)
    l40s = FusedCostModel(toy_cluster(gpu="l40s-48gb"), db=db).cost(_mla_decode(32, 4096), P1)
    assert l40s.provenance == "predictor" and math.isfinite(l40s.duration_s)


def test_blackwell_fp4_gemm_is_priced_from_the_measured_nvfp4_rows():
    """An fp4 GEMM on a B200 is the measured NVFP4 linear kernel (aiconfigurator-core
    b200_sxm/gemm/vllm/0.24.0, ``FlashInferCuteDslNvFp4LinearKernel``: 16 x 8192 x 8192 in
    13.2 us, 12.8 us at the fastest m of 16-64 that one M tile spans,
    ``profile_db.single_tile_envelope``), not the bf16 kernel (22.6 us, its own fastest)
    it fell back to before the NVFP4 rows were imported."""
    m = default_cost_model(load_cluster("b200-8gpu"))
    fp4 = m.cost(gemm_node(16, 8192, 8192, dtype="fp4"), P1)
    bf16 = m.cost(gemm_node(16, 8192, 8192), P1)
    assert fp4.provenance == bf16.provenance == "profile"
    assert fp4.duration_s == pytest.approx(12.84e-6, rel=0.01)
    assert bf16.duration_s == pytest.approx(22.6e-6, rel=0.01)


@pytest.mark.parametrize("engine_rows,measured_s", [("sglang", 0.406e-3), ("trtllm", 0.411e-3)])
def test_block_fp8_gemm_is_priced_from_the_engines_block_scaled_rows(engine_rows, measured_s):
    """A dense GEMM of a 128x128 block-fp8 checkpoint runs the engine's block-scaled kernel:
    8192^3 on a B200 takes 0.406 ms in SGLang's DeepGEMM and 0.411 ms in TensorRT-LLM's
    (aiconfigurator-core b200_sxm/gemm/{sglang/0.5.14,trtllm/1.3.0rc20}), not the 0.717 ms of
    vLLM's per-tensor CUTLASS fp8 row that priced it before. A GPU without block-scaled rows
    (A100: no fp8 tensor cores, no such rows) keeps the node's own dtype."""
    from charon_search.cost.selector import GEMM_ROWS_TAG

    node = gemm_node(8192, 8192, 8192, dtype="fp8")
    block = node.replace(tags=frozenset({"fp8", f"{GEMM_ROWS_TAG}{engine_rows}"}))
    b200 = default_cost_model(load_cluster("b200-8gpu"))
    got = b200.cost(block, P1)
    assert got.provenance == "profile"
    assert got.duration_s == pytest.approx(measured_s, rel=0.01)
    assert b200.cost(node, P1).duration_s == pytest.approx(0.717e-3, rel=0.01)
    a100 = default_cost_model(toy_cluster(gpu="a100-sxm-80gb"))
    assert a100.cost(block, P1).duration_s == a100.cost(node, P1).duration_s


def test_decode_attention_over_an_fp8_cache_runs_the_engines_measured_kernel():
    """Each engine's decode attention over an fp8 cache is its own measured kernel:
    aiconfigurator-core 0.12.0 ``h100_sxm/attention/<engine>/<ver>/generation_attention_perf``,
    32 query heads, 4 KV heads, head_dim 128, 32 requests at 4,096 keys (step 4095): vLLM
    0.24.0 FlashAttention 3 65.18 us, SGLang 0.5.14 fa3 77.51 us, TensorRT-LLM 1.3.0rc20 XQA
    57.70 us, against vLLM's 99.30 us over a bf16 cache and 57.96 us at the same bytes (2,048
    keys of bf16) for a cache whose engine has no rows."""
    from charon_search.cost.selector import ATTN_ENGINE_TAG, KV_CACHE_TAG

    model = FusedCostModel(toy_cluster(gpu=GPU))

    def secs(*tags: str):
        node = Node(id=0, name="attn", kind=OpKind.ATTENTION, phase=Phase.FORWARD,
                    params=poly_params(batch=32, heads=32, kv_heads=4, q_len=1,
                                       kv_len=sym("c"), head_dim=128),
                    flops=Poly.const(1e9), bytes_read=Poly.const(1e6), tags=frozenset(tags))
        return model.cost(node, ShapePoint(32, 1, 4096))

    assert secs().duration_s == pytest.approx(99.30e-6, rel=1e-3)
    fallback = secs(f"{KV_CACHE_TAG}fp8")
    assert fallback.duration_s == pytest.approx(57.96e-6, rel=1e-3)
    assert fallback.provenance == "profile"
    for engine, us in (("vllm", 65.18), ("sglang", 77.51), ("trtllm", 57.70)):
        hit = secs(f"{KV_CACHE_TAG}fp8", f"{ATTN_ENGINE_TAG}{engine}")
        assert (hit.duration_s, hit.provenance) == (pytest.approx(us * 1e-6, rel=1e-3),
                                                     "profile"), engine


def test_mla_decode_over_an_fp8_cache_runs_the_engines_measured_kernel():
    """MLA decode over an fp8 cache (16 query heads over the 576-wide latent, 32 requests at
    4,096 keys): TensorRT-LLM 1.3.0rc20's measured fp8 kernel (``generation_mla_perf``) takes
    42.38 us on H200 and 19.11 us on B200, SGLang 0.5.14's ``trtllm_mla`` 20.77 us on B200,
    where the half-bytes rule (bf16 rows at 2,048 keys) gives 36.51 and 21.12 us. SGLang's
    Hopper table (its FlashAttention 3 MLA, 5x its bf16 time) is not imported, so SGLang on
    H200 keeps the rule."""
    from charon_search.cost.selector import ATTN_ENGINE_TAG, KV_CACHE_TAG

    cases = (("h200-sxm-141gb", "trtllm", 42.38), ("h200-sxm-141gb", "sglang", 36.51),
             ("b200-sxm-180gb", "trtllm", 19.11), ("b200-sxm-180gb", "sglang", 20.77),
             ("b200-sxm-180gb", "vllm", 21.12))
    for gpu, engine, us in cases:
        node = _mla_decode(32, 4096).replace(
            params=poly_params(batch=32, heads=16, kv_heads=1, q_len=1, kv_len=sym("c"),
                               head_dim=576, v_head_dim=576, causal=0),
            tags=frozenset({f"{KV_CACHE_TAG}fp8", f"{ATTN_ENGINE_TAG}{engine}"}))
        cost = FusedCostModel(toy_cluster(gpu=gpu)).cost(node, ShapePoint(32, 1, 4096))
        assert cost.duration_s == pytest.approx(us * 1e-6, rel=1e-3), (gpu, engine)


def test_prefill_attention_over_an_fp8_cache_runs_the_engines_measured_kernel():
    """A 4,096-token prompt (32 query / 8 KV heads, head_dim 128) over an fp8 cache on H100
    (aiconfigurator ``context_attention_perf``): vLLM 0.24.0's FlashAttention 3 with bf16
    queries 309.61 us, SGLang 0.5.14's fa3 with fp8 queries 246.91 us, TensorRT-LLM
    1.3.0rc20's context FMHA 280.23 us; vLLM's kernel over a bf16 cache, which a generic
    engine keeps (a prompt's attention has no half-bytes rule), 264.31 us."""
    from charon_search.cost.selector import ATTN_ENGINE_TAG, KV_CACHE_TAG

    model = FusedCostModel(toy_cluster(gpu=GPU))
    kv8 = f"{KV_CACHE_TAG}fp8"
    for tags, us in (((), 264.31), ((kv8,), 264.31), ((kv8, f"{ATTN_ENGINE_TAG}vllm"), 309.61),
                     ((kv8, f"{ATTN_ENGINE_TAG}sglang"), 246.91),
                     ((kv8, f"{ATTN_ENGINE_TAG}trtllm"), 280.23)):
        node = _attn(OpKind.ATTENTION, 4096, 4096).replace(tags=frozenset(tags))
        cost = model.cost(node, P1)
        assert (cost.duration_s, cost.provenance) == (pytest.approx(us * 1e-6, rel=1e-3),
                                                       "profile"), tags


def test_convert_attention_of_an_engine_keeps_the_default_kernel_and_query_type(tmp_path):
    """The fp8-cache import keeps the kernel and (prompt) query type with the most rows, drops
    bf16-cache and sliding-window rows, and converts ms to s; a decode row's keys are step + 1."""
    import importlib.util
    from pathlib import Path

    import pandas as pd

    path = Path(__file__).resolve().parents[2] / "scripts" / "import_peers.py"
    spec = importlib.util.spec_from_file_location("import_peers_attn", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cols = ["kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads",
            "head_dim", "beam_width", "attn_dtype", "kv_cache_dtype", "step", "window_size",
            "latency"]
    rows = [["fa3", 1, 4096, 32, 8, 128, 1, "fp8", "fp8", 0, 0, 0.30],
            ["fa3", 2, 4096, 32, 8, 128, 1, "fp8", "fp8", 0, 0, 0.50],
            ["fa3", 1, 4096, 32, 8, 128, 1, "bfloat16", "fp8", 0, 0, 0.40],
            ["fa3", 1, 4096, 32, 8, 128, 1, "fp8", "fp8", 0, 128, 0.10],  # sliding window
            ["fa3", 1, 4096, 32, 8, 128, 1, "bfloat16", "bfloat16", 0, 0, 0.20],
            ["triton", 1, 4096, 32, 8, 128, 1, "fp8", "fp8", 0, 0, 0.90]]
    csv = tmp_path / "ctx.csv"
    pd.DataFrame(rows, columns=cols).to_csv(csv, index=False)
    out = mod.convert_attention(str(csv), GPU, "t", decode=False, engine="sglang")
    assert set(out.variant) == {"prefill.sglang"} and set(out.dtype) == {"fp8"}
    assert set(out.kernel) == {"fa3"}
    assert sorted(out.latency_s) == pytest.approx([0.30e-3, 0.50e-3])
    assert set(out.q_len) == set(out.kv_len) == {4096}
    out = mod.convert_attention(str(csv), GPU, "t", decode=True, engine="vllm")
    # Decode keeps bf16 queries only: the one bf16-query fp8-cache row, at step + 1 keys.
    assert (list(out.variant), list(out.latency_s), list(out.kv_len), list(out.q_len)) == (
        ["decode.vllm"], [pytest.approx(0.40e-3)], [1], [1.0])
