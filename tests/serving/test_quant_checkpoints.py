"""Per-module precision of quantized serving checkpoints (from their HF quantization_config).

gpt-oss-120b (``openai/gpt-oss-120b`` config.json): ``quant_method: mxfp4`` with
``modules_to_not_convert`` = self_attn, mlp.router, embed_tokens, lm_head, i.e. only the MoE
experts are MXFP4. DeepSeek-V3 / Qwen3-235B-A22B-FP8: 128x128 block-scaled fp8 everywhere but
the router gate, norms and LM head.
"""

from __future__ import annotations

import dataclasses

import pytest

from charon_search.catalog import load_model
from charon_search.errors import ConfigError, InfeasibleError
from charon_search.ir.ops import OpKind
from charon_search.serving._graphs import checkpoint_kv_dtype, checkpoint_quant, serving_graphs


def _gemms(graphs):
    return [(name, n) for name, g in graphs.items() for n in g.nodes
            if n.kind in (OpKind.GEMM, OpKind.GROUPED_GEMM)]


@pytest.fixture(scope="module")
def gpt_oss():
    return load_model("gpt-oss-120b")


def test_gpt_oss_fp4_keeps_attention_router_and_head_bf16(gpt_oss):
    prefill, decode = serving_graphs(gpt_oss, tp=2, pp=1, ep=1, dp_attention=False,
                                     precision="fp4", engine="trtllm")
    for graphs in (prefill, decode):
        gemms = _gemms(graphs)
        by_role = {}
        for _, n in gemms:
            by_role.setdefault(n.role, set()).add(n.dtype)
        assert by_role["attn.qkv"] == {"bf16"}
        assert by_role["attn.out"] == {"bf16"}
        assert by_role["moe.router"] == {"bf16"}
        assert by_role["lm_head"] == {"bf16"}
        experts = [n for _, n in gemms if n.role == "moe.expert"]
        # W4A16: 4-bit weights, bf16 activations and bf16 MMAs (not the FP4 tensor-core rate);
        # weights at MXFP4's 4 bits + one E8M0 scale byte per 32 = 0.53125 bytes.
        assert experts and all(n.dtype == "bf16" for n in experts)
        for n in experts:
            assert {"fp4", "moe_dtype:w4a16_mxfp4", "moe_engine:trtllm"} <= n.tags
            assert n.params["weight_bytes"](1, 1, 1) == 0.5 + 1 / 32


def test_unknown_engine_runs_vllm_kernels(gpt_oss):
    prefill, _ = serving_graphs(gpt_oss, tp=1, pp=1, ep=1, dp_attention=False,
                                precision="fp4", engine="nccl")
    experts = [n for _, n in _gemms(prefill) if n.role == "moe.expert"]
    assert experts and all("moe_engine:vllm" in n.tags for n in experts)


def test_block_fp8_checkpoints_quantize_attention_not_the_router():
    for name in ("deepseek-v3", "qwen3-235b-a22b", "minimax-m2.5"):
        q = checkpoint_quant(load_model(name), "fp8")
        assert q.moe_dtype == "fp8_block", name
        assert {"attn.qkv", "attn.out", "moe.expert"} <= q.quantized_roles
        assert "moe.router" not in q.quantized_roles and "lm_head" not in q.quantized_roles
    gpt = checkpoint_quant(load_model("gpt-oss-120b"), "fp4")
    assert gpt.moe_dtype == "w4a16_mxfp4"
    assert gpt.quantized_roles.isdisjoint({"attn.qkv", "attn.out"})
    assert "openai--gpt-oss-120b_config.json" in gpt.source


def test_listed_norms_indexers_and_gates_do_not_unquantize_their_blocks():
    """GLM-5-FP8 lists its attention norms and sparse-attention indexer
    (``self_attn.kv_a_layernorm``, ``self_attn.indexers_proj``, ``self_attn.indexer.k_norm``)
    and Qwen3.5-FP8 its shared expert's one-output gate (``mlp.shared_expert_gate``) in
    ``modules_to_not_convert``; the attention projections and the shared expert stay fp8.
    A bare ``self_attn`` entry (gpt-oss) or a named projection keeps those GEMMs bf16."""
    glm = checkpoint_quant(load_model("glm-5"), "fp8")
    assert {"attn.qkv", "attn.out", "moe.shared", "moe.expert"} <= glm.quantized_roles
    qwen = checkpoint_quant(load_model("qwen3.5-397b-a17b"), "fp8")
    assert {"attn.qkv", "attn.out", "moe.shared", "moe.expert"} <= qwen.quantized_roles
    kimi = load_model("kimi-k2.5")
    cfg = dict(kimi.hf_config)
    cfg["_charon_checkpoints"] = {"fp8": {"quantization_config": {
        "quant_method": "fp8", "weight_block_size": [128, 128],
        "modules_to_not_convert": ["model.layers.3.self_attn.o_proj", "lm_head"]}}}
    q = checkpoint_quant(dataclasses.replace(kimi, hf_config=cfg), "fp8")
    assert "attn.out" not in q.quantized_roles and "attn.qkv" in q.quantized_roles


def test_nvidia_nvfp4_checkpoints_keep_their_listed_modules_bf16():
    """NVIDIA's ModelOpt NVFP4 releases (hf_quant_config.json ``exclude_modules`` or config.json
    ``ignore``, globs like ``model.layers.*.self_attn*``): DeepSeek-V3.1-NVFP4 keeps MLA's
    q_a/q_b/kv_a/kv_b projections bf16 and quantizes o_proj; Qwen3.5-397B-A17B-NVFP4 quantizes
    only the routed experts; Qwen3-235B-A22B-NVFP4 every GEMM but router and head. Their
    routed experts run the engines' measured NVFP4 MoE kernels (``nvfp4``)."""
    ds = checkpoint_quant(load_model("deepseek-v3"), "fp4")
    assert ds.weight_bytes == 0.5 + 1 / 16  # one FP8 scale per 16 values
    assert checkpoint_quant(load_model("kimi-k2.5"), "int4").weight_bytes == 0.5 + 2 / 32
    assert checkpoint_quant(load_model("deepseek-v3"), "fp8").weight_bytes == 1.0
    assert "attn.qkv" not in ds.quantized_roles
    assert {"attn.out", "mlp.in", "mlp.out", "moe.shared", "moe.expert"} <= ds.quantized_roles
    assert ds.moe_dtype == "nvfp4" and not ds.block_fp8
    assert "nvidia--DeepSeek-V3.1-NVFP4_hf_quant_config.json" in ds.source
    qwen = checkpoint_quant(load_model("qwen3.5-397b-a17b"), "fp4")
    assert "moe.expert" in qwen.quantized_roles  # (it has no dense MLP layers)
    assert qwen.quantized_roles.isdisjoint({"attn.qkv", "attn.out", "moe.shared"})
    q235 = checkpoint_quant(load_model("qwen3-235b-a22b"), "fp4")
    assert {"attn.qkv", "attn.out", "moe.expert"} <= q235.quantized_roles
    kimi = load_model("kimi-k2.5")
    assert checkpoint_quant(kimi, "fp4").quantized_roles.isdisjoint({"attn.qkv", "attn.out"})
    cfg = dict(kimi.hf_config)
    cfg["_charon_checkpoints"] = {"fp4": {"quantization_config": {
        "quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}}}
    with pytest.raises(ConfigError, match=r"`quant_algo` must be one of \['FP8', 'NVFP4'\]"):
        checkpoint_quant(dataclasses.replace(kimi, hf_config=cfg), "fp4")


def test_models_without_a_shipped_checkpoint_keep_the_generic_rule():
    q = checkpoint_quant(load_model("llama-3.1-70b"), "fp8")
    assert q.moe_dtype == "fp8" and {"attn.qkv", "mlp.in"} <= q.quantized_roles
    assert checkpoint_quant(load_model("qwen3-30b-a3b"), "fp4").moe_dtype == ""


@pytest.mark.parametrize(("model", "precision", "kv"), [
    # Block-fp8 releases (quant_method fp8) declare no KV-cache quantization: bf16.
    ("deepseek-v3", "fp8", "bf16"), ("minimax-m2.5", "fp8", "bf16"),
    ("qwen3-235b-a22b", "fp8", "bf16"),
    # NVIDIA's ModelOpt NVFP4 exports declare an 8-bit float cache, in either spelling.
    ("deepseek-v3", "fp4", "fp8"),  # kv_cache_quant_algo: FP8
    ("minimax-m2.5", "fp4", "fp8"),  # kv_cache_scheme: {num_bits: 8, type: float}
    # MXFP4 gpt-oss declares none; nor does a checkpoint the catalog does not ship.
    ("gpt-oss-120b", "fp4", "bf16"), ("llama-3.1-70b", "fp8", "bf16"),
])
def test_engine_auto_kv_cache_dtype_is_what_the_checkpoint_declares(model, precision, kv):
    assert checkpoint_kv_dtype(load_model(model), precision) == kv


def test_auto_kv_dtype_is_resolved_from_the_checkpoint_before_sizing_the_cache():
    """``ServingConfig.kv_dtype`` defaults to ``auto``: the NVFP4 MiniMax-M2.5 checkpoint's
    declared fp8 cache holds twice the tokens of the block-fp8 one's bf16 cache, exactly what
    the explicit dtypes give."""
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster
    from charon_search.serving import ServingConfig
    from charon_search.serving.simulator import kv_capacity_blocks, resolve_kv_dtype

    model, cluster = load_model("minimax-m2.5"), load_cluster("b200-8gpu")
    assert ServingConfig().kv_dtype == "auto"
    kw = dict(tp=4, pp=1, ep=1)
    blocks = {}
    for precision, declared in (("fp4", "fp8"), ("fp8", "bf16")):
        auto = ServingConfig(tp=4, precision=precision)
        assert resolve_kv_dtype(model, auto).kv_dtype == declared
        explicit = auto.replace(kv_dtype=declared)
        blocks[precision] = kv_capacity_blocks(model, cluster, auto, **kw)
        assert blocks[precision] == kv_capacity_blocks(model, cluster, explicit, **kw)
    # Same weights, half the bytes a token: the fp4 run's auto (fp8) cache holds twice the
    # blocks of an explicit bf16 one.
    bf16 = kv_capacity_blocks(model, cluster, ServingConfig(tp=4, precision="fp4",
                                                            kv_dtype="bf16"), **kw)
    assert blocks["fp4"] / bf16 == pytest.approx(2.0, abs=1e-3)
    # An explicit dtype is kept: the fp8 checkpoint with an fp8 cache (a launch flag).
    forced = ServingConfig(tp=4, precision="fp8", kv_dtype="fp8")
    assert resolve_kv_dtype(model, forced) is forced


def test_auto_kv_dtype_follows_fp16_and_rejects_undeclared_schemes():
    import copy

    model = load_model("minimax-m2.5")
    assert checkpoint_kv_dtype(model, "fp16") == "fp16"
    for qc, what in (({"kv_cache_quant_algo": "NVFP4"}, "NVFP4"),
                     ({"kv_cache_scheme": {"num_bits": 4, "type": "float"}}, "num_bits")):
        bad = copy.deepcopy(model.hf_config)
        bad["_charon_checkpoints"]["fp4"]["quantization_config"] = qc
        with pytest.raises(ConfigError, match=f"8-bit float.*{what}"):
            checkpoint_kv_dtype(dataclasses.replace(model, hf_config=bad), "fp4")


def test_unknown_quant_method_is_a_config_error(gpt_oss):
    bad = dict(gpt_oss.hf_config)
    bad["_charon_checkpoints"] = {"fp4": {"quantization_config": {"quant_method": "awq"}}}
    with pytest.raises(ConfigError, match="quant_method"):
        checkpoint_quant(dataclasses.replace(gpt_oss, hf_config=bad), "fp4")


def test_marlin_launch_prices_4bit_experts_from_the_marlin_rows(gpt_oss):
    """``moe_kernel='marlin'`` (vLLM ``VLLM_MXFP4_USE_MARLIN=1``) retags gpt-oss's MXFP4 experts
    with the pooled Marlin rows; an fp8 checkpoint's experts (not a Marlin format) keep their
    engine's rows."""
    prefill, _ = serving_graphs(gpt_oss, tp=4, pp=1, ep=1, dp_attention=False,
                                precision="fp4", engine="vllm", moe_kernel="marlin")
    experts = [n for _, n in _gemms(prefill) if n.role == "moe.expert"]
    assert experts and all({"moe_dtype:w4a16_marlin", "moe_engine:marlin"} <= n.tags
                           for n in experts)
    fp8, _ = serving_graphs(load_model("qwen3-235b-a22b"), tp=4, pp=1, ep=1,
                            dp_attention=False, precision="fp8", engine="vllm",
                            moe_kernel="marlin")
    experts = [n for _, n in _gemms(fp8) if n.role == "moe.expert"]
    assert experts and all({"moe_dtype:fp8_block", "moe_engine:vllm"} <= n.tags
                           for n in experts)


def test_unknown_moe_kernel_is_a_config_error():
    from charon_search.serving.config import ServingConfig

    with pytest.raises(ConfigError,
                       match=r"`moe_kernel` must be one of \['', 'marlin', 'mxfp8', 'triton'\]"):
        ServingConfig(moe_kernel="cutlass")


def test_kimi_int4_checkpoint_quantizes_only_the_routed_experts():
    """Kimi-K2.5's compressed-tensors config: 4-bit integer weights (groups of 32, no
    activation quantization) on every Linear except its ``ignore`` list (lm_head and the
    regexes ``re:.*self_attn.*``, ``re:.*shared_experts.*``, ``re:.*mlp\\.(gate|up|gate_up|
    down)_proj.*``), so only the routed experts are W4A16, priced from the ``int4_wo`` rows."""
    kimi = load_model("kimi-k2.5")
    q = checkpoint_quant(kimi, "int4")
    assert q.moe_dtype == "int4_wo" and q.quantized_roles == frozenset({"moe.expert"})
    _, decode = serving_graphs(kimi, tp=8, pp=1, ep=1, dp_attention=False, precision="int4",
                               engine="vllm")
    gemms = _gemms(decode)
    experts = [n for _, n in gemms if n.role == "moe.expert"]
    assert experts and all({"moe_dtype:int4_wo", "moe_engine:vllm"} <= n.tags
                           and n.params["weight_bytes"](1, 1, 1) == 0.5 + 2 / 32
                           and n.dtype == "bf16" for n in experts)
    others = {n.role: n.dtype for _, n in gemms if n.role != "moe.expert"}
    assert others["attn.qkv"] == others["moe.shared"] == others["lm_head"] == "bf16"
    assert "int4" not in others.values()  # the router runs in fp32 (HF DeepSeek-V3)


def test_int4_needs_a_checkpoint_and_a_weight_only_scheme():
    with pytest.raises(ConfigError, match="int4"):
        checkpoint_quant(load_model("llama-3.1-8b"), "int4")
    kimi = load_model("kimi-k2.5")
    cfg = dict(kimi.hf_config)
    entry = dict(cfg["_charon_checkpoints"]["int4"])
    qc = dict(entry["quantization_config"])
    qc["config_groups"] = {"g": {"weights": {"num_bits": 8, "type": "int"},
                                 "input_activations": {"num_bits": 8}}}
    cfg["_charon_checkpoints"] = {"int4": {**entry, "quantization_config": qc}}
    with pytest.raises(ConfigError, match="weight-only"):
        checkpoint_quant(dataclasses.replace(kimi, hf_config=cfg), "int4")


def test_mxfp8_activations_price_mxfp4_experts_from_the_engines_w4a8_rows(gpt_oss):
    """``moe_kernel='mxfp8'`` (Blackwell: TensorRT-LLM's TRTLLM MoE backend, vLLM
    ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``) keeps the engine and prices the MXFP4 experts
    from its ``w4a8_mxfp4_mxfp8`` rows; on a B200 at 16 tokens (gpt-oss-120b's 128 experts,
    top 4, 2880 x 2880, one GPU) the measured TensorRT-LLM row is 0.114 ms against 0.456 ms
    for bf16 activations (aiconfigurator-core b200_sxm/moe/trtllm/1.3.0rc20)."""
    from charon_search.cost.selector import default_cost_model
    from charon_search.hardware import load_cluster

    cluster = load_cluster("b200-8gpu")
    model = default_cost_model(cluster)
    per_layer = {}
    for kernel in ("", "mxfp8"):
        _, decode = serving_graphs(gpt_oss, tp=1, pp=1, ep=1, dp_attention=False,
                                   precision="fp4", engine="trtllm", moe_kernel=kernel)
        g = decode["moe"]
        i, node = next((i, n) for i, n in enumerate(g.nodes) if n.role == "moe.expert"
                       and n.kind == OpKind.GROUPED_GEMM)
        fmt = "w4a8_mxfp4_mxfp8" if kernel else "w4a16_mxfp4"
        assert {"moe_engine:trtllm", f"moe_dtype:{fmt}"} <= node.tags
        per_layer[kernel] = model.cost_graph_detailed(g, 16, 1, 1024).durations_s[i]
    assert per_layer["mxfp8"] == pytest.approx(0.114e-3, rel=0.1)
    assert per_layer[""] == pytest.approx(0.456e-3, rel=0.1)


def test_triton_moe_kernel_tags_the_vllm_triton_rows_for_fp8_formats_only(gpt_oss):
    """``moe_kernel="triton"`` (vLLM ``--moe-backend triton``) prices block-fp8 experts from the
    Triton fused-MoE rows at the checkpoint's own format; MXFP4 experts keep the engine's."""
    prefill, decode = serving_graphs(load_model("minimax-m2.5"), tp=4, pp=1, ep=1,
                                     dp_attention=False, precision="fp8", engine="vllm",
                                     moe_kernel="triton")
    for graphs in (prefill, decode):
        experts = [n for _, n in _gemms(graphs) if n.role == "moe.expert"]
        assert experts and all({"moe_dtype:fp8_block", "moe_engine:vllm_triton"} <= n.tags
                               for n in experts)
    prefill, _ = serving_graphs(gpt_oss, tp=2, pp=1, ep=1, dp_attention=False,
                                precision="fp4", engine="vllm", moe_kernel="triton")
    experts = [n for _, n in _gemms(prefill) if n.role == "moe.expert"]
    assert experts and all({"moe_dtype:w4a16_mxfp4", "moe_engine:vllm"} <= n.tags
                           for n in experts)


def test_a_precision_without_a_checkpoint_that_does_not_fit_names_the_shipped_ones() -> None:
    # gpt-oss-120b is published with MXFP4 experts only: at bf16 its 117B parameters take
    # 217.6 GiB, more than an H100 holds, and the error says which precision the catalog has.
    from charon_search.serving import RequestSpec, ServingConfig, simulate_serving

    with pytest.raises(InfeasibleError, match=r"217\.6 GiB weights per GPU at bf16, within "
                                              r"the engine's gpu_memory_utilization 0\.9: "
                                              r"raise `--memory-fraction`, tp or pp, or use a "
                                              r"smaller precision\); the catalog's "
                                              r"gpt-oss-120b checkpoints are fp4"):
        simulate_serving("gpt-oss-120b", "h100-sxm-8gpu", ServingConfig(),
                         [RequestSpec(request_id=0, arrived_at_s=0.0, prompt_tokens=100,
                                      output_tokens=2)])


@pytest.mark.parametrize("engine,rows", [("sglang", "sglang"), ("trtllm", "trtllm"),
                                         ("vllm", "sglang")])
def test_block_fp8_dense_gemms_name_the_engines_block_scaled_rows(engine, rows):
    """DeepSeek-V3's fp8 checkpoint (``weight_block_size`` [128, 128]) runs its dense GEMMs
    with block-scaled kernels: each engine's own rows, vLLM's DeepGEMM from SGLang's rows
    (``BLOCK_FP8_GEMM_ROWS``); bf16 GEMMs (LM head) and per-tensor fp8 checkpoints carry no
    such tag."""
    from charon_search.cost.selector import GEMM_ROWS_TAG

    prefill, _ = serving_graphs(load_model("deepseek-v3"), tp=8, pp=1, ep=1,
                                dp_attention=False, precision="fp8", engine=engine)
    dense = [n for _, n in _gemms(prefill) if n.kind == OpKind.GEMM]
    tagged = {n.dtype for n in dense if f"{GEMM_ROWS_TAG}{rows}" in n.tags}
    assert tagged == {"fp8"}
    assert all(not any(t.startswith(GEMM_ROWS_TAG) for t in n.tags)
               for n in dense if n.dtype == "bf16")
    llama, _ = serving_graphs(load_model("llama-3.1-8b"), tp=1, pp=1, ep=1,
                              dp_attention=False, precision="fp8", engine=engine)
    assert not any(t.startswith(GEMM_ROWS_TAG) for _, n in _gemms(llama) for t in n.tags)


def test_trtllm_nvfp4_dispatches_quantized_activations():
    """TensorRT-LLM with attention DP and EP quantizes an NVFP4 MoE's input before the
    all-to-all (``use_postquant_alltoall``, ``TRTLLM_MOE_POST_QUANT_ALLTOALLV`` default on): a
    DeepSeek-V3 FP4 dispatch moves 0.5625 bytes a value (4 bits + one FP8 scale per 16), the
    combine still 2 (bf16). Other engines, other formats and TP attention keep bf16 dispatches.
    At 1,024 tokens on 8 attention-DP ranks each rank sends its 128 tokens x top-8 x hidden
    7,168 values."""
    ds = load_model("deepseek-v3")

    def a2a(engine: str, precision: str, dp_attention: bool = True) -> dict[str, float]:
        prefill, _ = serving_graphs(ds, tp=8, pp=1, ep=8, dp_attention=dp_attention,
                                    precision=precision, engine=engine)
        return {n.name.split("_")[1]: float(n.param("bytes")(1, 128, 128))
                for g in prefill.values() for n in g.nodes
                if n.kind == OpKind.ALL_TO_ALL and n.name.startswith("ep_")}

    values = 128 * 8 * 7168
    trt = a2a("trtllm", "fp4")
    assert trt["dispatch"] == pytest.approx(values * 0.5625)
    assert trt["combine"] == pytest.approx(values * 2)
    for engine, precision in (("sglang", "fp4"), ("vllm", "fp4"), ("trtllm", "fp8")):
        assert a2a(engine, precision)["dispatch"] == pytest.approx(values * 2), engine


def test_gpt_oss_expert_parallel_layer_sends_its_rows_once_and_fuses_its_experts():
    """gpt-oss adds per-expert biases inside its experts (HF ``GptOssExperts``: gate_up and
    down biases gathered by expert id). Those rows are the owning rank's parameters, so under
    attention DP and EP a layer dispatches only its token rows and combines only the experts'
    output, one all-to-all each, and its expert FFN stays one fused grouped GEMM (w13 + clamped
    SwiGLU + w2), as without EP. At 128 tokens per attention-DP rank the dispatch moves
    128 x top-4 x hidden 2,880 bf16 values (MXFP4 experts keep a bf16 dispatch)."""
    oss = load_model("gpt-oss-120b")
    prefill, decode = serving_graphs(oss, tp=2, pp=1, ep=2, dp_attention=True,
                                     precision="fp4", engine="trtllm")
    for graphs in (prefill, decode):
        moe = graphs["moe"]
        a2a = [n for n in moe.nodes if n.kind == OpKind.ALL_TO_ALL]
        assert [n.name.split("_")[1] for n in a2a] == ["dispatch", "combine"]
        experts = [n for n in moe.nodes if n.kind == OpKind.GROUPED_GEMM]
        assert len(experts) == 1 and "fused" in experts[0].tags
        assert (float(experts[0].params["n"](1, 1, 1)),
                float(experts[0].params["k"](1, 1, 1))) == (2880.0, 2880.0)
    values = 128 * 4 * 2880
    dispatch, combine = (float(n.param("bytes")(1, 128, 128)) for n in prefill["moe"].nodes
                         if n.kind == OpKind.ALL_TO_ALL)
    assert (dispatch, combine) == (values * 2, values * 2)


def test_vllm_per_tensor_fp8_experts_run_the_triton_fused_moe():
    """An assumed fp8 checkpoint (per-tensor scales, vLLM's Fp8MoEMethod) runs the Triton fused
    MoE before Blackwell, not the ModelOpt FlashInfer kernel vLLM's per-tensor rows time:
    Mixtral's two active experts a layer at one token are 0.176 ms in vLLM's block-fp8 Triton
    rows on H100 (the closest Triton rows: H100 has no per-tensor ones) against 0.256 ms in
    bf16, so fp8 must price below bf16 (it was 2.5x above: 21.6 vs 8.6 ms over 32 layers)."""
    from charon_search.hardware import load_cluster
    from charon_search.serving.config import ServingConfig
    from charon_search.serving.simulator import build_cost_model

    mixtral, h100 = load_model("mixtral-8x7b"), load_cluster("h100-sxm-8gpu")
    prefill, _ = serving_graphs(mixtral, tp=1, pp=1, ep=1, dp_attention=False,
                                precision="fp8", engine="vllm")
    experts = [n for _, n in _gemms(prefill) if n.role == "moe.expert"]
    assert experts and all({"moe_dtype:fp8", "moe_engine:vllm", "moe_method:fp8"} <= n.tags
                           for n in experts)

    def experts_s(precision: str) -> float:
        cm = build_cost_model(mixtral, h100, ServingConfig(precision=precision))
        return sum(row[3] for row in cm.linear_breakdown(1) if row[1] == "grouped_gemm")

    bf16, fp8 = experts_s("bf16"), experts_s("fp8")
    assert bf16 == pytest.approx(32 * 0.256e-3, rel=0.1)
    assert fp8 == pytest.approx(32 * 0.176e-3, rel=0.1)


def test_a_disaggregated_pool_that_does_not_fit_is_named() -> None:
    # Llama-3.1-70B's 131.4 GiB of bf16 weights fit no H100 at TP 1: in a disaggregated
    # deployment the error says which pool (here the decode pool; the prefill pool at TP 4 fits).
    from charon_search.serving import RequestSpec, ServingConfig, simulate_serving

    cfg = ServingConfig(disagg="prefill=1xTP4,decode=1xTP1")
    with pytest.raises(InfeasibleError, match=r"^decode pool: llama-3\.1-70b with tp=1, pp=1, "
                                              r"ep=1 leaves no room for KV cache"):
        simulate_serving("llama-3.1-70b", "h100-sxm-8gpu", cfg,
                         [RequestSpec(request_id=0, arrived_at_s=0.0, prompt_tokens=100,
                                      output_tokens=2)])
