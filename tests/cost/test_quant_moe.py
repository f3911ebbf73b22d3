"""Quantized MoE kernels: imported per engine and dtype, priced from their own rows.

Numbers come from the shipped profile DB, converted from aiconfigurator-core 0.12.0
``systems/data/h200_sxm/moe/{vllm/0.24.0,trtllm/1.3.0rc20}/moe_perf.parquet`` (power-law 1.01
routing, ``latency`` in ms): the gpt-oss-120b expert shape (hidden 2880, expert FFN 2880,
128 experts, top-4, no EP/TP).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from charon_search.cost import predictor as P
from charon_search.cost.profile_db import ProfileDB, default_profile_db, write_profile_db
from charon_search.cost.selector import FusedCostModel
from charon_search.ir import Node, OpKind
from charon_search.ir.symbolic import Poly
from charon_search.testing import toy_cluster

GPU = "h200-sxm-141gb"
GPT_OSS = {"top_k": 4, "num_experts": 128, "n": 2880, "k": 2880, "group_size": 1}
#: Measured ms per layer (vLLM OAI-Triton MXFP4 kernel / TensorRT-LLM ``moe_torch_flow``).
VLLM_MS = {16: 0.27987, 32: 0.36494, 1024: 1.33958, 8192: 3.9425}
TRTLLM_MS = {16: 0.27299, 32: 0.34923, 1024: 1.15569, 8192: 5.65578}
SMALL_HP = {**P.HYPERPARAMS, "max_iter": 120, "learning_rate": 0.15}


def test_imported_w4a16_row_is_returned_for_its_exact_shape():
    db = default_profile_db()
    for variant, table in (("moe_ffn_skew.vllm", VLLM_MS), ("moe_ffn_skew.trtllm", TRTLLM_MS)):
        for tokens, ms in table.items():
            got = db.exact(GPU, "grouped_gemm", variant, "w4a16_mxfp4",
                           {"tokens": tokens, **GPT_OSS})
            assert got == pytest.approx(ms * 1e-3, rel=1e-4), (variant, tokens)
    entry = db.entry(GPU, "grouped_gemm")
    assert {"moe_ffn_skew.vllm", "moe_ffn_skew.trtllm", "moe_ffn_skew.sglang"} <= set(
        entry["variants"])
    assert {"fp8", "fp8_block", "w4a16_mxfp4"} <= set(entry["dtypes"])
    # One source table per engine, named on every row.
    assert any("h200_sxm/moe/trtllm/1.3.0rc20/moe_perf.parquet" in s for s in entry["sources"])


def test_moe_rows_keep_their_ep_degree():
    """The EP degree is part of the row key: rows measured at EP 2..256 are all kept."""
    tbl = default_profile_db().table(GPU, "grouped_gemm").select(variant="moe_ffn",
                                                                   dtype="bf16")
    assert {1.0, 8.0, 64.0} <= set(tbl.columns["group_size"].tolist())


def _import_script():
    path = Path(__file__).resolve().parents[2] / "scripts" / "import_peers.py"
    spec = importlib.util.spec_from_file_location("import_peers_q", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_convert_moe_quant_units_variant_and_one_family(tmp_path):
    cols = ["framework", "version", "device", "op_name", "kernel_source", "moe_dtype",
            "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
            "moe_ep_size", "distribution", "latency"]
    rows = [  # latency in ms; a second (fewer-rows) kernel family and a balanced row dropped
        ["TRTLLM", "1.3.0rc20", "H200", "moe", "cutlass", "fp8_block", 64, 7168, 2048, 8, 256,
         1, 8, "power_law_1.01", 0.5],
        ["TRTLLM", "1.3.0rc20", "H200", "moe", "cutlass", "fp8_block", 64, 7168, 2048, 8, 256,
         2, 4, "power_law_1.01", 0.7],
        ["TRTLLM", "1.3.0rc20", "H200", "moe", "other", "fp8_block", 64, 7168, 2048, 8, 256,
         1, 8, "power_law_1.01", 0.1],
        ["TRTLLM", "1.3.0rc20", "H200", "moe", "cutlass", "fp8_block", 64, 7168, 2048, 8, 256,
         1, 8, "balanced", 0.9],
        ["TRTLLM", "1.3.0rc20", "H200", "moe", "cutlass", "bfloat16", 64, 7168, 2048, 8, 256,
         1, 8, "power_law_1.01", 0.9],
    ]
    path = tmp_path / "moe.csv"
    pd.DataFrame(rows, columns=cols).to_csv(path, index=False)
    out = _import_script().convert_moe_quant(str(path), GPU, "t", "trtllm")
    assert list(out.variant.unique()) == ["moe_ffn_skew.trtllm"]
    assert list(out.dtype.unique()) == ["fp8_block"]
    assert list(out.kernel.unique()) == ["cutlass"]
    assert sorted(out.latency_s.tolist()) == pytest.approx([0.5e-3, 0.7e-3])
    # n is the per-GPU expert FFN (inter / moe_tp); group_size the EP degree.
    r = out[np.isclose(out.latency_s, 0.7e-3)].iloc[0]
    assert (r.n, r.k, r.group_size, r.tokens, r.top_k) == (1024, 7168, 4, 64, 8)


def _quant_rows_model(tmp_path_factory, gpu: str, dtype: str) -> FusedCostModel:
    """A small DB: ``gpu``'s ``dtype`` MoE rows of every engine plus a quarter of the bf16
    rows, with quickly trained predictors."""
    df = default_profile_db().table(gpu, "grouped_gemm").to_pandas()
    keep = (df.dtype == dtype) | ((df.variant == "moe_ffn") & (df.index % 4 == 0))
    root = tmp_path_factory.mktemp(dtype)
    write_profile_db(df[keep], root)
    db = ProfileDB(root)
    return FusedCostModel(toy_cluster(gpu=gpu), db=db, store=P.PredictorStore(
        db, hyperparams=SMALL_HP, use_disk_cache=False))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The H200 W4A16 rows of every engine plus a quarter of the bf16 rows."""
    return _quant_rows_model(tmp_path_factory, GPU, "w4a16_mxfp4")


def _expert(tokens: float, tags: tuple[str, ...] = ()) -> Node:
    c = Poly.const
    return Node(id=0, name="experts", kind=OpKind.GROUPED_GEMM, role="moe.expert", dtype="fp4",
                params={"tokens": c(tokens), "top_k": c(4), "num_experts": c(128),
                        "n": c(2880), "k": c(2880), "weight_bytes": c(0.5)},
                flops=c(2 * tokens * 4 * 3 * 2880 * 2880), tags=frozenset(tags))


@pytest.mark.parametrize(("engine", "measured"), [("vllm", VLLM_MS), ("trtllm", TRTLLM_MS)])
def test_tagged_expert_node_is_priced_from_its_engines_rows(model, engine, measured):
    tags = ("moe_dtype:w4a16_mxfp4", f"moe_engine:{engine}")
    for tokens, ms in measured.items():
        dur, prov, detail = model._cost_nodes([_expert(tokens, tags)], 1, 1, 1)
        assert prov[0] == "predictor" and detail[0] == "moe-ffn-rate"
        # Trained on these very shapes (among ~650 / ~380 rows): within 15 %.
        assert dur[0] == pytest.approx(ms * 1e-3, rel=0.15), (engine, tokens)


def test_untagged_expert_keeps_the_bf16_pricing_which_is_faster(model):
    """Without a kernel tag the bf16 model prices the node at its weight bytes (the old path);
    the measured W4A16 kernel is slower than that at 1024 tokens (dequantization in the loop)."""
    dur, prov, _ = model._cost_nodes([_expert(1024)], 1, 1, 1)
    assert prov[0] == "predictor"
    assert dur[0] < 0.75 * VLLM_MS[1024] * 1e-3


def test_unknown_engine_falls_back_to_another_engines_rows(model):
    tags = ("moe_dtype:w4a16_mxfp4", "moe_engine:nccl")
    dur, _, _ = model._cost_nodes([_expert(1024, tags)], 1, 1, 1)
    assert dur[0] == pytest.approx(VLLM_MS[1024] * 1e-3, rel=0.15)


def test_quantized_predictor_uses_its_format_weight_bytes():
    key = P.ModelKey(GPU, "grouped_gemm", "moe_ffn_skew.vllm", "w4a16_mxfp4")
    cols = P._with_weight_bytes(key, {"weight_bytes": np.array([2.0])})
    assert cols["weight_bytes"] == pytest.approx(0.5 + 1 / 32)  # MXFP4: 4 bits + E8M0 / 32
    bf16 = P.ModelKey(GPU, "grouped_gemm", "moe_ffn", "bf16")
    assert P._with_weight_bytes(bf16, {"weight_bytes": 0.5})["weight_bytes"] == 0.5


def test_ep_rank_node_is_priced_at_the_measured_ep_row(model):
    """An EP-4 rank of gpt-oss at 1024 global tokens holds 32 of the 128 experts and computes
    1024 x 4 / 4 rows: the node carries that rank's shape (256 tokens x top-4 over 32 experts)
    and the cost model looks it up as the measured row (1024 tokens, 128 experts, EP 4:
    TensorRT-LLM 0.654 ms, vs 1.156 ms at EP 1)."""
    tags = ("moe_dtype:w4a16_mxfp4", "moe_engine:trtllm", "moe_ep:4")
    c = Poly.const
    node = Node(id=0, name="experts", kind=OpKind.GROUPED_GEMM, role="moe.expert", dtype="fp4",
                params={"tokens": c(256), "top_k": c(4), "num_experts": c(32), "n": c(2880),
                        "k": c(2880), "weight_bytes": c(0.5)},
                flops=c(2 * 256 * 4 * 3 * 2880 * 2880), tags=frozenset(tags))
    dur, _, _ = model._cost_nodes([node], 1, 1, 1)
    assert dur[0] == pytest.approx(0.654e-3, rel=0.15)


# ---------------------------------------------------------------------------- Marlin MoE
H100 = "h100-sxm-80gb"
#: aiconfigurator-core 0.12.0 ``h100_sxm/moe/vllm/0.24.0/moe_perf.parquet``, kernel
#: ``vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu`` (Marlin, MXFP4
#: weights): hidden 3584, inter 3072 at MoE-TP 4 (768 per GPU), 896 experts, top-16, power-law
#: 1.01 routing; latency in ms.
MARLIN_MXFP4_MS = {16: 0.492, 1024: 2.925, 8192: 11.961}
MARLIN_SHAPE = {"top_k": 16, "num_experts": 896, "n": 768, "k": 3584}


def test_convert_moe_marlin_pools_marlin_rows_of_every_table(tmp_path):
    cols = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk",
            "num_experts", "moe_tp_size", "moe_ep_size", "distribution", "latency"]
    a = pd.DataFrame([  # vLLM: Marlin MXFP4 and int4 kept, the Triton kernel dropped
        ["vllm_mxfp4_marlin", "w4a16_mxfp4", 64, 3584, 3072, 16, 896, 4, 1, "power_law_1.01", 1.0],
        ["vllm_wna16marlinmoe_marlin", "int4_wo", 64, 7168, 2048, 8, 384, 1, 1,
         "power_law_1.01", 2.0],
        ["oai_triton", "w4a16_mxfp4", 64, 2880, 2880, 4, 128, 1, 1, "power_law_1.01", 3.0],
    ], columns=cols)
    b = pd.DataFrame([  # SGLang: balanced routing dropped
        ["sglang_marlin_moe", "int4_wo", 64, 2048, 768, 8, 128, 2, 1, "power_law_1.01", 4.0],
        ["sglang_marlin_moe", "int4_wo", 64, 2048, 768, 8, 128, 2, 1, "balanced", 5.0],
    ], columns=cols)
    (tmp_path / "v").mkdir()
    (tmp_path / "s").mkdir()
    a.to_csv(tmp_path / "v" / "moe.csv", index=False)
    b.to_csv(tmp_path / "s" / "moe.csv", index=False)
    paths = [str(tmp_path / "v" / "moe.csv"), str(tmp_path / "s" / "moe.csv")]
    out = _import_script().convert_moe_marlin(paths, H100, tmp_path)
    assert set(out.variant) == {"moe_ffn_skew.marlin"} and set(out.dtype) == {"w4a16_marlin"}
    assert sorted(out.latency_s.tolist()) == pytest.approx([1e-3, 2e-3, 4e-3])
    assert out[np.isclose(out.latency_s, 4e-3)].n.iloc[0] == 384  # inter / moe_tp
    assert len(set(out.source)) == 2  # each row names its own table


def test_shipped_marlin_rows_pool_mxfp4_and_int4_kernels():
    db = default_profile_db()
    for tokens, ms in MARLIN_MXFP4_MS.items():
        got = db.exact(H100, "grouped_gemm", "moe_ffn_skew.marlin", "w4a16_marlin",
                       {"tokens": tokens, "group_size": 1, **MARLIN_SHAPE})
        assert got == pytest.approx(ms * 1e-3, rel=2e-3), tokens
    tbl = db.table(H100, "grouped_gemm").select(variant="moe_ffn_skew.marlin",
                                                 dtype="w4a16_marlin")
    kernels = set(tbl.columns["kernel"].tolist())
    assert any("mxfp4" in k for k in kernels) and any("wna16" in k for k in kernels)
    assert any("sglang" in k for k in kernels)


@pytest.fixture(scope="module")
def h100_model(tmp_path_factory):
    """The H100 Marlin rows and the vLLM W4A16-MXFP4 (OpenAI Triton) rows."""
    df = default_profile_db().table(H100, "grouped_gemm").to_pandas()
    keep = (df.dtype == "w4a16_marlin") | (
        (df.variant == "moe_ffn_skew.vllm") & (df.dtype == "w4a16_mxfp4"))
    root = tmp_path_factory.mktemp("marlin")
    write_profile_db(df[keep], root)
    db = ProfileDB(root)
    return FusedCostModel(toy_cluster(gpu=H100), db=db, store=P.PredictorStore(
        db, hyperparams=SMALL_HP, use_disk_cache=False))


def _node(tokens: float, shape: dict[str, float], tags: tuple[str, ...]) -> Node:
    c = Poly.const
    return Node(id=0, name="experts", kind=OpKind.GROUPED_GEMM, role="moe.expert", dtype="fp4",
                params={"tokens": c(tokens), "weight_bytes": c(0.5),
                        **{k: c(v) for k, v in shape.items()}},
                flops=c(2 * tokens * shape["top_k"] * 3 * shape["n"] * shape["k"]),
                tags=frozenset(tags))


MARLIN_TAGS = ("moe_dtype:w4a16_marlin", "moe_engine:marlin")


def test_marlin_tagged_node_is_priced_from_the_marlin_rows(h100_model):
    for tokens, ms in MARLIN_MXFP4_MS.items():
        dur, prov, detail = h100_model._cost_nodes([_node(tokens, MARLIN_SHAPE, MARLIN_TAGS)],
                                                   1, 1, 1)
        assert (prov[0], detail[0]) == ("predictor", "moe-ffn-rate")
        assert dur[0] == pytest.approx(ms * 1e-3, rel=0.15), tokens


def test_marlin_is_slower_than_the_triton_kernel_at_prefill_sizes(h100_model):
    """gpt-oss-120b experts at TP 4 (2880 x 720 per GPU), an 8192-token prefill: vLLM's
    OpenAI Triton rows measure ~1.2 ms; Marlin, which InferenceX's vLLM recipes force, runs
    its tiles at a lower FLOP rate once every expert has hundreds of rows (the 896-expert
    table above: 181 TFLOP/s at 8192 tokens, TP 4)."""
    gpt_oss_tp4 = {**GPT_OSS, "n": 720}
    node = {"marlin": _node(8192, gpt_oss_tp4, MARLIN_TAGS),
            "triton": _node(8192, gpt_oss_tp4, ("moe_dtype:w4a16_mxfp4", "moe_engine:vllm"))}
    dur = {k: h100_model._cost_nodes([n], 1, 1, 1)[0][0] for k, n in node.items()}
    assert dur["triton"] == pytest.approx(1.2e-3, rel=0.2)
    assert dur["marlin"] > 1.3 * dur["triton"]
    flops = 2 * 8192 * 4 * 3 * 720 * 2880
    assert 120e12 < flops / dur["marlin"] < 300e12


def test_heldout_roofline_prices_quantized_moe_at_its_compute_dtype():
    """``profiles eval`` compares each predictor with the roofline; a quantized MoE dtype is not
    a GPU peak dtype, so the roofline uses the one it computes in (block fp8 -> fp8 MMAs, W4A16
    -> bf16 after dequantization) instead of failing."""
    cols = {"tokens": np.array([1024.0]), "top_k": np.array([4.0]),
            "num_experts": np.array([128.0]), "n": np.array([720.0]), "k": np.array([2880.0]),
            "group_size": np.array([1.0]), "latency_s": np.array([1e-3])}
    for dtype, compute in (("fp8_block", "fp8"), ("w4a16_marlin", "bf16"),
                           ("w4a16_mxfp4", "bf16"), ("int4_wo", "bf16")):
        got = P.roofline_seconds("grouped_gemm", cols, H100, dtype)
        want = P.roofline_seconds("grouped_gemm", cols, H100, compute)
        assert got is not None and np.isfinite(got).all()
        assert got == pytest.approx(want), dtype


def test_convert_mla_decode_keeps_bf16_kv_generation_rows(tmp_path):
    cols = ["kernel_source", "mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl",
            "tp_size", "step", "latency"]
    rows = [["default", "bfloat16", "bfloat16", 16, 32, 1, 4, 4095, 0.0544],
            ["default", "bfloat16", "fp8", 16, 32, 1, 4, 4095, 0.0424]]  # fp8 KV dropped
    path = tmp_path / "mla.csv"
    pd.DataFrame(rows, columns=cols).to_csv(path, index=False)
    out = _import_script().convert_mla_decode(str(path), H100, "t")
    assert len(out) == 1
    r = out.iloc[0]
    assert (r.variant, r["dtype"], r.heads, r.kv_heads, r.q_len, r.kv_len, r.head_dim) == (
        "decode_mla", "bf16", 16, 1, 1, 4096, 576)
    assert r.latency_s == pytest.approx(0.0544e-3)


#: DeepSeek-V3's routed experts on one of 32 wide-EP ranks (8 of 256 experts, top-8, expert FFN
#: 2048 over hidden 7168), per-rank shape as ``serving._graphs`` writes it.
DSV3_EP32 = {"top_k": 8, "num_experts": 8, "n": 2048, "k": 7168}
DEEPEP_TAGS = ("moe_dtype:fp8_block", "moe_engine:sglang_deepep", "moe_ep:32")


def _gb200_fp8_block_model(tmp_path_factory, variants: list[str]) -> FusedCostModel:
    """A cost model over GB200's SGLang fp8_block rows of ``variants`` only."""
    df = default_profile_db().table("gb200", "grouped_gemm").to_pandas()
    keep = (df.dtype == "fp8_block") & df.variant.isin(variants)
    root = tmp_path_factory.mktemp("deepep")
    write_profile_db(df[keep], root)
    db = ProfileDB(root)
    return FusedCostModel(toy_cluster(gpu="gb200"), db=db, store=P.PredictorStore(
        db, hyperparams=SMALL_HP, use_disk_cache=False))


@pytest.fixture(scope="module")
def gb200_model(tmp_path_factory):
    """GB200's SGLang fp8_block rows: DeepEP low-latency decode, DeepEP normal-mode prefill
    and fused-MoE (SGLang's own kernel)."""
    return _gb200_fp8_block_model(tmp_path_factory, [
        "moe_ffn_skew.sglang", "moe_ffn_skew.sglang_deepep",
        "moe_ffn_skew.sglang_deepep_normal"])


def test_sglang_wide_ep_decode_uses_the_deepep_rows(gb200_model):
    """aiconfigurator-core gb200/moe/sglang/0.5.10/wideep_generation_moe_perf.parquet: 2,048
    tokens over EP 32 (64 per rank), power-law 1.01, take 0.1202 ms in DeepEP's low-latency
    path; SGLang's fused-MoE rows (0.5.14 moe_perf) measure 0.4415 ms for the same shape."""
    dur, prov, detail = gb200_model._cost_nodes([_node(64, DSV3_EP32, DEEPEP_TAGS)], 1, 1, 1)
    assert (prov[0], detail[0]) == ("predictor", "moe-ffn-rate")
    assert dur[0] == pytest.approx(0.1202e-3, rel=0.15)
    fused = gb200_model._cost_nodes([_node(64, DSV3_EP32, (
        "moe_dtype:fp8_block", "moe_engine:sglang", "moe_ep:32"))], 1, 1, 1)[0][0]
    assert fused == pytest.approx(0.4415e-3, rel=0.15) and fused > 3 * dur[0]


def test_sglang_wide_ep_prefill_uses_the_deepep_normal_rows(gb200_model, tmp_path_factory):
    """A prefill batch of 1,024 tokens per rank on EP 32 (32,768 tokens, past DeepEP's 128-token
    low-latency limit) runs DeepEP's normal mode into DeepGEMM's contiguous grouped GEMM:
    aiconfigurator-core gb200/moe/sglang/0.5.10/wideep_context_moe_perf.parquet measures
    1.249 ms (power-law 1.01). SGLang's fused-MoE rows put the same batch at more than twice
    that (3.31 ms at half the tokens, 16,384 over EP 32); a GPU without normal-mode rows falls
    back to them, exactly as a node without the DeepEP tag."""
    deepep = gb200_model._cost_nodes([_node(1024, DSV3_EP32, DEEPEP_TAGS)], 1, 1, 1)[0][0]
    assert deepep == pytest.approx(1.249e-3, rel=0.15)
    fused = gb200_model._cost_nodes([_node(1024, DSV3_EP32, (
        "moe_dtype:fp8_block", "moe_engine:sglang", "moe_ep:32"))], 1, 1, 1)[0][0]
    assert fused > 2 * deepep
    no_normal = _gb200_fp8_block_model(
        tmp_path_factory, ["moe_ffn_skew.sglang", "moe_ffn_skew.sglang_deepep"])
    big = [no_normal._cost_nodes([_node(1024, DSV3_EP32, (
        "moe_dtype:fp8_block", f"moe_engine:{e}", "moe_ep:32"))], 1, 1, 1)[0][0]
        for e in ("sglang_deepep", "sglang")]
    assert big[0] == big[1] == pytest.approx(fused)


def test_sglang_attention_dp_with_ep_tags_the_deepep_rows():
    from charon_search.serving._graphs import CheckpointQuant, _moe_rows_engine

    block = CheckpointQuant(precision="fp8", quantized_roles=frozenset(), moe_dtype="fp8_block")
    assert _moe_rows_engine("sglang", block, 32, True) == "sglang_deepep"
    assert _moe_rows_engine("sglang", block, 32, False) == "sglang"  # TP attention
    assert _moe_rows_engine("sglang", block, 1, True) == "sglang"  # experts not spread
    assert _moe_rows_engine("trtllm", block, 32, True) == "trtllm"
    mxfp4 = CheckpointQuant(precision="fp4", quantized_roles=frozenset(),
                            moe_dtype="w4a16_mxfp4")
    assert _moe_rows_engine("sglang", mxfp4, 8, True) == "sglang"  # no DeepEP rows of it


def test_convert_moe_triton_takes_each_format_from_the_newest_table_with_triton_rows(tmp_path):
    """vLLM's Triton fused-MoE rows: the legacy collector names the kernel ``vllm_fused_moe``,
    the modular one ``..._triton_tritonexperts``; FlashInfer rows and balanced routing are
    dropped, and a format comes from the first (newest) table that measured it."""
    cols = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk",
            "num_experts", "moe_tp_size", "moe_ep_size", "distribution", "latency"]
    new = pd.DataFrame([  # 0.24.0: FlashInfer for fp8_block, Triton for fp8
        ["vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic", "fp8_block", 1024, 3072,
         1536, 8, 256, 4, 1, "power_law_1.01", 0.318],
        ["vllm_modeloptfp8moe_triton_tritonexperts", "fp8", 1024, 3072, 1536, 8, 256, 4, 1,
         "power_law_1.01", 0.3],
    ], columns=cols)
    old = pd.DataFrame([  # 0.22.0: the legacy collector's Triton kernel for both formats
        ["vllm_fused_moe", "fp8_block", 1024, 3072, 1536, 8, 256, 4, 1, "power_law_1.01", 0.445],
        ["vllm_fused_moe", "fp8_block", 1024, 3072, 1536, 8, 256, 4, 1, "balanced", 0.5],
        ["vllm_fused_moe", "fp8", 1024, 3072, 1536, 8, 256, 4, 1, "power_law_1.01", 0.256],
    ], columns=cols)
    for name, df in (("new", new), ("old", old)):
        (tmp_path / name).mkdir()
        df.to_csv(tmp_path / name / "moe.csv", index=False)
    out = _import_script().convert_moe_triton(
        [str(tmp_path / "new" / "moe.csv"), str(tmp_path / "old" / "moe.csv")], GPU, tmp_path)
    assert set(out.variant) == {"moe_ffn_skew.vllm_triton"}
    got = dict(zip(out.dtype, out.latency_s, strict=True))
    assert got == pytest.approx({"fp8": 0.3e-3, "fp8_block": 0.445e-3})
    assert out.n.tolist() == [384, 384]  # inter / moe_tp


#: MiniMax-M2.5's routed experts at MoE-TP 4 (hidden 3072, 1536 / 4 per GPU, 256 experts, top 8),
#: block fp8, power-law 1.01, on B200 (ms): aiconfigurator-core ``b200_sxm/moe/vllm/0.22.0``
#: (``vllm_fused_moe``, vLLM's Triton kernel) and ``0.24.0`` (FlashInfer's TRT-LLM kernel,
#: vLLM's default rows there).
MINIMAX_TP4 = {"top_k": 8, "num_experts": 256, "n": 384, "k": 3072, "group_size": 1}
B200_TRITON_MS = {16: 0.092, 1024: 0.445, 4096: 0.957}
B200_FLASHINFER_MS = {16: 0.081, 1024: 0.318, 4096: 0.506}


def test_shipped_b200_triton_rows_are_slower_than_the_default_flashinfer_rows():
    db = default_profile_db()
    for tokens, ms in B200_TRITON_MS.items():
        shape = {"tokens": tokens, **MINIMAX_TP4}
        triton = db.exact("b200-sxm-180gb", "grouped_gemm", "moe_ffn_skew.vllm_triton",
                          "fp8_block", shape)
        default = db.exact("b200-sxm-180gb", "grouped_gemm", "moe_ffn_skew.vllm", "fp8_block",
                           shape)
        assert triton == pytest.approx(ms * 1e-3, rel=0.01), tokens
        assert default == pytest.approx(B200_FLASHINFER_MS[tokens] * 1e-3, rel=0.01), tokens
    assert B200_TRITON_MS[4096] / B200_FLASHINFER_MS[4096] > 1.8



# ---------------------------------------------------------------------------- NVFP4 MoE
B200 = "b200-sxm-180gb"
#: DeepSeek-V3/R1's routed experts (hidden 7168, expert FFN 2048, 256 experts, top-8) at EP 8,
#: power-law 1.01 routing, NVFP4 weights and activations on B200; ms per layer from
#: aiconfigurator-core 0.12.0 ``b200_sxm/moe/<engine>/<version>/moe_perf.parquet``: TensorRT-LLM
#: 1.3.0rc20 ``moe_torch_flow_min_latency``, SGLang 0.5.14 ``sglang_flashinfer_trtllm_moe``,
#: vLLM 0.24.0 FlashInfer TRT-LLM-gen (``..._trtllmnvfp4expertsmonolithic``).
DSV3_EP8 = {"top_k": 8, "num_experts": 256, "n": 2048, "k": 7168, "group_size": 8}
NVFP4_EP8_MS = {"trtllm": {128: 0.123136, 16384: 1.009005},
                "sglang": {128: 0.130106, 16384: 1.263490},
                "vllm": {128: 0.138618, 16384: 1.386560}}


def test_shipped_nvfp4_rows_per_engine():
    db = default_profile_db()
    for engine, table in NVFP4_EP8_MS.items():
        for tokens, ms in table.items():
            got = db.exact(B200, "grouped_gemm", f"moe_ffn_skew.{engine}", "nvfp4",
                           {"tokens": tokens, **DSV3_EP8})
            assert got == pytest.approx(ms * 1e-3, rel=1e-4), (engine, tokens)
    trt = db.table(B200, "grouped_gemm").select(variant="moe_ffn_skew.trtllm", dtype="nvfp4")
    assert set(trt.columns["kernel"].tolist()) == {"moe_torch_flow_min_latency"}


def test_trtllm_nvfp4_takes_its_trtllm_gen_rows_not_the_cutlass_ones(tmp_path):
    """TensorRT-LLM's table holds a CUTLASS NVFP4 MoE (more rows) and its TRT-LLM-gen one
    (``moe_torch_flow_min_latency``), the kernel ``moe_config.backend: TRTLLM`` runs: the
    import keeps the latter (``PREFERRED_MOE_KERNEL``)."""
    cols = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk",
            "num_experts", "moe_tp_size", "moe_ep_size", "distribution", "latency"]
    shape = [7168, 2048, 8, 256, 1, 8, "power_law_1.01"]
    rows = [["moe_torch_flow_cutlass", "nvfp4", t, *shape, 0.3] for t in (1, 64, 1024)]
    rows += [["moe_torch_flow_min_latency", "nvfp4", 64, *shape, 0.11]]
    path = tmp_path / "moe.csv"
    pd.DataFrame(rows, columns=cols).to_csv(path, index=False)
    mod = _import_script()
    out = mod.convert_moe_quant(str(path), B200, "t", "trtllm")
    assert list(out.kernel.unique()) == ["moe_torch_flow_min_latency"]
    assert out.latency_s.tolist() == pytest.approx([0.11e-3])
    # Another engine keeps the family with the most rows.
    assert list(mod.convert_moe_quant(str(path), B200, "t", "sglang").kernel.unique()) == [
        "moe_torch_flow_cutlass"]


@pytest.fixture(scope="module")
def b200_nvfp4_model(tmp_path_factory):
    """The B200 NVFP4 MoE rows of every engine plus a quarter of the bf16 rows."""
    return _quant_rows_model(tmp_path_factory, B200, "nvfp4")


@pytest.mark.parametrize("engine", sorted(NVFP4_EP8_MS))
def test_nvfp4_expert_node_is_priced_from_its_engines_rows(b200_nvfp4_model, engine):
    """An EP-8 rank of DeepSeek's experts: ``tokens / 8`` tokens x top-8 over 32 local experts,
    looked up as the measured EP-8 row of the global tokens (within 15 %)."""
    tags = ("moe_dtype:nvfp4", f"moe_engine:{engine}", "moe_ep:8")
    local = {**DSV3_EP8, "num_experts": 32}
    local.pop("group_size")
    for tokens, ms in NVFP4_EP8_MS[engine].items():
        node = _node(tokens / 8, local, tags)
        dur, prov, detail = b200_nvfp4_model._cost_nodes([node], 1, 1, 1)
        assert (prov[0], detail[0]) == ("predictor", "moe-ffn-rate")
        assert dur[0] == pytest.approx(ms * 1e-3, rel=0.15), (engine, tokens)


def test_nvfp4_prefill_experts_beat_the_bf16_model_at_half_bytes(b200_nvfp4_model):
    """Before the NVFP4 rows, these experts were the bf16 MoE model at 0.5625 bytes per weight:
    right for weight-bound decode, but a bf16 FLOP rate for a compute-bound prefill. At 16,384
    tokens the measured FP4 kernel (1.44 TFLOP a rank in ~1.0 ms) is faster than that price."""
    local = {**DSV3_EP8, "num_experts": 32}
    local.pop("group_size")
    tagged = _node(16384 / 8, local, ("moe_dtype:nvfp4", "moe_engine:trtllm", "moe_ep:8"))
    bf16 = _node(16384 / 8, local, ())
    fp4_s = b200_nvfp4_model._cost_nodes([tagged], 1, 1, 1)[0][0]
    bf16_s = b200_nvfp4_model._cost_nodes([bf16], 1, 1, 1)[0][0]
    assert fp4_s < 0.8 * bf16_s
