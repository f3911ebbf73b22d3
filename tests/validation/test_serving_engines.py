"""Silicon serving rows carry their engine's scheduler facts and the benchmark's protocol into
the serving config (translation only, fast), and a few well-understood rows land within the
serving target (real simulation, marked slow)."""

from __future__ import annotations

import pytest

from charon_search.validation.translate import to_case

MINIMAX_B200_FP8 = "2026_04_06_minimax_m2_5_b200_sxm_vllm_fp8_agg_1024x1024_c32_tp4_ep1_1348"
SGLANG_051 = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_sglang_agg_2048x256_c128_tp4_epnone_43"
VLLM_FP8 = ("nvidia_llama_3_1_8b_instruct_fp8_nvidia_llama_3_1_8b_instruct_fp8_h200_sxm_vllm_"
            "agg_2000x100_c64_tp1_epnone_2")
TRTLLM_8B = ("meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_"
             "trtllm_agg_1024x128_c8_tp1_epnone_1")


def test_sglang_051_row_runs_prefill_first_lock_step(by_id) -> None:
    case = to_case(by_id[SGLANG_051])
    cfg, wl = case.config, case.workload
    # SGLang 0.5.1.post1 launched by aiconfigurator: no mixed chunk, max_prefill_tokens =
    # isl + 1500, chunked-prefill size 8192 for prompt tokens only, overlap scheduler.
    assert cfg.prefill_schedule == "prefill_first"
    assert cfg.max_prefill_tokens == 2048 + 1500 and cfg.max_num_batched_tokens == 8192
    assert not cfg.decode_in_budget and not cfg.prefix_caching
    assert cfg.iteration_overhead_s == 0.0 and cfg.max_num_seqs == 128
    # aiperf: 2 x 128 warm-up requests are drained before the measured phase, which starts on
    # an idle engine with all 128 streams together; 1024 of its 50 x 128 requests (8 turns)
    # are simulated, then the draining last turn.
    assert wl.concurrency == 128 and wl.ramp_up_s == 0.0
    assert case.extra["warmup_requests"] == 0 and case.extra["drain_requests"] == 128
    assert case.extra["measured_requests"] == 50 * 128
    assert wl.num_requests == 1024 + 128
    assert any("256 warm-up requests drained" in a for a in case.assumptions)
    assert any("mixed chunk off" in a for a in case.assumptions)


def test_vllm_row_runs_decode_first_mixed_batches(by_id) -> None:
    case = to_case(by_id[VLLM_FP8])
    cfg, wl = case.config, case.workload
    assert cfg.prefill_schedule == "mixed" and cfg.max_num_batched_tokens == 8192
    assert cfg.decode_in_budget and cfg.iteration_overhead_s is None
    # aiperf's 100-prompt pool; the aiconfigurator launch caches no prefixes.
    assert (wl.shared_prefix_tokens, wl.num_prefixes) == (2000, 100)
    assert not cfg.prefix_caching
    assert wl.ramp_up_s == 0.0  # aiperf starts every stream together


def test_trtllm_row_reserves_and_does_not_chunk(by_id) -> None:
    cfg = to_case(by_id[TRTLLM_8B]).config
    assert cfg.kv_admission == "reserve_max" and not cfg.chunked_prefill
    assert cfg.max_num_batched_tokens == 8 + 1024 + 1500
    assert cfg.iteration_overhead_s == 0.0 and cfg.max_num_seqs == 8
    # KvCacheConfig.tokens_per_block: the KV cache is paged 32 tokens at a time.
    assert cfg.block_size == 32


def test_gap_rows_stream_through_dynamo_inferencex_rows_do_not(by_id) -> None:
    """aiconfigurator's launches put dynamo.frontend and a dynamo.<engine> worker per replica
    in front of every engine; InferenceX's aggregated rows run the engine's own server."""
    for rid in (SGLANG_051, VLLM_FP8, TRTLLM_8B):
        case = to_case(by_id[rid])
        assert case.config.frontend == "dynamo"
        assert any("served through NVIDIA Dynamo" in a for a in case.assumptions)
    ix = by_id["2026_04_06_llama_3_1_70b_b200_sxm_trtllm_fp8_agg_1024x1024_c32_tp1_ep1_263"]
    assert to_case(ix).config.frontend == ""


#: Well-understood silicon rows: SGLang 0.5.1 runs each closed-loop wave in lock-step (every
#: prompt of the wave prefilled before anyone decodes), so TTFT is half a wave's prefill.
#: Measured TTFT / TPOT and the prediction at 01:35 in the comments.
WITHIN_TARGET = {
    # 786.0 ms / 12.52 ms; predicted 744.1 ms (-5 %) / 11.84 ms (-5 %).
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_sglang_agg_1024x256_c64_tp8_epnone_15": 0.20,
    # 2395.7 ms / 23.65 ms; predicted 2175.2 ms (-9 %) / 22.79 ms (-4 %).
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_sglang_agg_1024x256_c128_tp4_epnone_17": 0.20,
    # InferenceX vLLM Llama-3-70B FP8 rows, whose client (10 x C prompts of uniform 0.8-1.0 x
    # length, synchronized start) and recipe (8192-token budget, async scheduling) are both
    # known (session 2, round 2: the 70 vLLM 70B rows have median |err| 19 % TTFT, 6 % TPOT).
    # H200 TP8 C4 8192/1024: 303.2 ms / 8.76 ms; predicted 351.8 ms (+16 %) / 8.31 ms (-5 %),
    # with vLLM's own server taking 10 ms + 4 us per prompt token (docs/calibration/
    # serving-frontend-vllm.yaml; 10 us per token alone: 387.8 ms, +28 %; session 33).
    "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_8192x1024_c4_tp8_ep1_677": 0.20,
    # H100 TP4 C16 8192/1024: 731.5 ms / 21.06 ms; predicted 790.4 ms (+8 %) / 20.81 ms (-1 %).
    "2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_8192x1024_c16_tp4_ep1_789": 0.20,
    # InferenceX TensorRT-LLM Llama-3.1-70B FP8 on B200, TP8 C16 1024/1024: 83.5 ms / 6.51 ms;
    # predicted 88.2 ms (+6 %) / 6.66 ms (+2 %) with the 16 ms prompt-iteration host time the
    # H100/H200 fit found (70.6 ms, -15 %, without it; session 22).
    "2026_04_06_llama_3_1_70b_b200_sxm_trtllm_fp8_agg_1024x1024_c16_tp8_ep1_622": 0.20,
    # InferenceX vLLM MiniMax-M2.5 FP8 on B200, TP4 C32 1024/1024: 104.3 ms / 13.15 ms;
    # predicted 114.7 ms (+10 %) / 13.12 ms (-0 %) with the recipe's Triton fused MoE and the
    # front-end time carried from H100/H200 (100.0 ms without it; 65.9 ms, -37 %, / 11.8 ms,
    # -10 %, on vLLM's default FlashInfer rows; sessions 32-33).
    MINIMAX_B200_FP8: 0.20,
}


@pytest.mark.validation
@pytest.mark.slow
def test_silicon_rows_within_target(shipped_records) -> None:
    from charon_search.validation import run_validation, select_records

    res = run_validation(select_records(shipped_records, ids=list(WITHIN_TARGET)))
    assert not res.skipped, res.skipped
    errs = {(r["id"], r["metric"]): r["error"] for r in res.rows}
    assert len(errs) == 2 * len(WITHIN_TARGET)
    for (rid, metric), err in errs.items():
        assert abs(err) <= WITHIN_TARGET[rid], (rid, metric, err)


TRT_70B_TP2 = "2026_04_06_llama_3_1_70b_h200_sxm_trtllm_fp8_agg_1024x1024_c8_tp2_ep1_627"
TRT_70B_TP8 = "2026_04_06_llama_3_1_70b_h200_sxm_trtllm_fp8_agg_1024x1024_c8_tp8_ep1_584"
GPTOSS_H100_C512 = "2026_04_06_gpt_oss_120b_h100_sxm_vllm_fp4_agg_8192x1024_c512_tp2_ep1_1129"


def test_inferencex_row_runs_its_client_and_recipe(by_id) -> None:
    case = to_case(by_id[TRT_70B_TP2])
    cfg, wl = case.config, case.workload
    # InferenceX benchmark_serving.py: 10 x C prompts, all measured, streams start together,
    # lengths uniform in [int(0.8 x 1024), 1024].
    assert wl.ramp_up_s == 0.0 and wl.num_requests == 80
    assert case.extra["warmup_requests"] == 0 and case.extra["measured_requests"] == 80
    assert case.extra["drain_requests"] == 0  # every turn simulated: the run drains itself
    assert (wl.input_len.kind, wl.input_len.low, wl.input_len.high) == ("uniform", 819, 1024)
    assert (wl.output_len.low, wl.output_len.high) == (819, 1024)
    # 70b_fp8_h200_trt_slurm.sh: --max_num_tokens 16384, batch waiting at 1k/1k below TP 8.
    assert cfg.max_num_batched_tokens == 16384 and cfg.batch_wait_iters == 20
    assert cfg.tp_allreduce == "trtllm"
    assert to_case(by_id[TRT_70B_TP8]).config.batch_wait_iters == 0


def test_inferencex_vllm_gpt_oss_on_hopper_runs_marlin_experts() -> None:
    """InferenceX gptoss_fp4_h100.sh / gptoss_fp4_h200.sh export VLLM_MXFP4_USE_MARLIN=1; other
    GPUs' recipes do not (B200's exports VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 instead), and
    the Llama-3-70B recipe has no MXFP4 experts."""
    from charon_search.serving.backends import engine_profile

    kw = dict(isl=1024, max_batch_size=8, launcher="inferencex", model="openai/gpt-oss-120b")
    for gpu in ("h100-sxm-80gb", "h200-sxm-141gb"):
        prof = engine_profile("vllm", gpu=gpu, **kw)
        assert prof.config_kwargs()["moe_kernel"] == "marlin"
        assert any("VLLM_MXFP4_USE_MARLIN=1" in s for s in prof.sources)
    assert engine_profile("vllm", gpu="b200-sxm-180gb", **kw).config_kwargs()["moe_kernel"] == (
        "mxfp8")
    assert "moe_kernel" not in engine_profile("vllm", gpu="l40s-48gb", **kw).config_kwargs()
    kw["model"] = "meta-llama/Llama-3.1-70B"
    assert "moe_kernel" not in engine_profile("vllm", gpu="h200-sxm-141gb", **kw).config_kwargs()


def test_inferencex_gpt_oss_kv_cache_dtype_follows_the_recipe(by_id) -> None:
    """The B200 recipes set an fp8 KV cache (vLLM ``kv-cache-dtype: fp8``, TensorRT-LLM
    ``kv_cache_config dtype: fp8``); the Hopper ones leave it to ``auto``, the checkpoint's
    bf16. On the H100 TP 2 rows at concurrency 512 that halves the cache to the ~1 M tokens the
    measured queueing implies (113 s TTFT at 8k/1k: predicted 105 s with bf16, 52 s with fp8)."""
    from charon_search.serving.backends import engine_profile

    kw = dict(isl=1024, max_batch_size=8, launcher="inferencex", model="openai/gpt-oss-120b")
    for backend in ("vllm", "trtllm"):
        assert engine_profile(backend, gpu="b200-sxm-180gb", **kw).config_kwargs()[
            "kv_dtype"] == "fp8"
        assert engine_profile(backend, gpu="h200-sxm-141gb", **kw).config_kwargs()[
            "kv_dtype"] == "bf16"
    assert "kv_dtype" not in engine_profile(
        "vllm", gpu="h200-sxm-141gb", **{**kw, "model": "meta-llama/Llama-3.1-70B"}
    ).config_kwargs()
    case = to_case(by_id[GPTOSS_H100_C512])
    assert case.config.kv_dtype == "bf16"
    assert any("as the launch sets it" in n for n in case.assumptions)


MINIMAX_H100_C64 = "2026_04_06_minimax_m2_5_h100_sxm_vllm_fp8_agg_8192x1024_c64_tp4_ep4_1359"
DSR1_SGLANG_H200 = "2026_03_25_deepseek_r1_h200_sxm_sglang_fp8_agg_8192x1024_c32_tp8_0_ep1_0_264"


def test_kv_cache_dtype_is_the_engines_auto_where_the_recipe_passes_none(by_id) -> None:
    """InferenceX's MiniMax-M2.5 H100 vLLM recipe and DeepSeek-R1 H200 SGLang recipe pass no
    KV-cache dtype, so the engine's ``auto`` keeps the block-fp8 checkpoints' cache in bf16;
    the MiniMax B200 and DeepSeek Blackwell recipes pass fp8. The bf16 cache holds half the
    tokens: the H100 replica no longer holds even the 64 streams' mean prompts (64 x 7,373
    tokens, uniform over 6,553..8,192), and its measured TTFT (32.5 s) is a queue's."""
    from charon_search.memory.serving import kv_cache_capacity
    from charon_search.serving._graphs import weight_storage

    h100 = to_case(by_id[MINIMAX_H100_C64])
    assert h100.config.kv_dtype == "bf16"
    # --max-num-seqs 256 and no capture size: vLLM's default min(2 x 256, 512) tokens.
    assert h100.config.piecewise_graph_tokens == 512
    assert any("minimaxm2.5_fp8_h100.sh" in a for a in h100.assumptions)
    b200 = to_case(by_id[MINIMAX_B200_FP8])
    assert b200.config.kv_dtype == "fp8" and b200.config.piecewise_graph_tokens == 2048
    assert to_case(by_id[DSR1_SGLANG_H200]).config.kv_dtype == "bf16"
    b200_fp4 = "2026_03_25_deepseek_r1_b200_sxm_sglang_fp4_agg_1024x1024_c16_tp8_0_ep8_0_257"
    assert to_case(by_id[b200_fp4]).config.kv_dtype == "fp8"
    cfg = h100.config
    caps = {kv: kv_cache_capacity(h100.model, h100.cluster, tp=cfg.tp, ep=cfg.ep,
                                  gpu_memory_utilization=0.9, kv_dtype=kv,
                                  **weight_storage(h100.model, "fp8")).num_tokens
            for kv in ("bf16", "fp8")}
    assert caps["fp8"] / caps["bf16"] == pytest.approx(2.0, rel=0.01)
    assert caps["bf16"] < 64 * 7373 < caps["fp8"]


def test_gap_rows_keep_the_aiperf_protocol(by_id) -> None:
    case = to_case(by_id[TRTLLM_8B])
    wl = case.workload
    assert wl.input_len.kind == "fixed" and wl.input_len.value == 1024
    assert case.extra["measured_requests"] == 50 * 8


def test_first_wave_keeps_its_weight_when_fewer_turns_are_simulated() -> None:
    from charon_search.validation.predict import _steady_state

    # 10 turns of 4 measured, 2 simulated: the idle-start wave (TTFT 1 s) weighs 4 / 40, the
    # simulated second turn (0.1 s) stands for the other nine.
    per = {"request_id": list(range(8)), "ttft_s": [1.0] * 4 + [0.1] * 4,
           "tpot_s": [0.01] * 8}
    ttft, tpot = _steady_state({"per_request": per}, 0, nominal=40, wave=4)
    assert ttft == pytest.approx(0.1 * 1.0 + 0.9 * 0.1) and tpot == pytest.approx(0.01)
    # Every measured request simulated: the plain mean.
    ttft, _ = _steady_state({"per_request": per}, 0, nominal=8, wave=4)
    assert ttft == pytest.approx(0.55)


def test_draining_turn_keeps_only_its_own_weight() -> None:
    from charon_search.validation.predict import _steady_state

    # 50 turns of 4 measured after 8 warm-up requests; simulated: the first measured turn
    # (TPOT 30 ms), one settled turn (20 ms) and one turn past the window while arrivals stop
    # (10 ms: nobody's prefill interrupts its decode). The first and the draining turn weigh
    # 4 / 200 each (the benchmark's own first and last turns), the settled one the other 48.
    per = {"request_id": list(range(20)), "ttft_s": [0.5] * 20,
           "tpot_s": [0.0] * 8 + [0.03] * 4 + [0.02] * 4 + [0.01] * 4}
    _, tpot = _steady_state({"per_request": per}, 8, nominal=200, wave=4, drain=4)
    assert tpot == pytest.approx(0.02 * 0.03 + 0.02 * 0.01 + 0.96 * 0.02)
    # Without the draining turn counted apart, it would weigh like a settled one.
    _, tpot = _steady_state({"per_request": per}, 8, nominal=200, wave=4)
    assert tpot == pytest.approx(0.02 * 0.03 + 0.98 * 0.015)


#: Two H200 TensorRT-LLM DeepSeek-R1 rows of one layout (TP8 EP8, C64, 1k/8k) and one image,
#: measured 2026-01-28 and 2026-01-14: 32.2 and 19.4 ms TPOT. From 2026-01-07 on InferenceX
#: ran each such layout with and without MTP (PR #392), and the rows do not say which.
DSR1_MTP_OR_NOT = ("2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x8192_c64_tp8_0_ep8_0_1240",
                   "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x8192_c64_tp8_0_ep8_0_1261")
#: The same layout and image measured 2025-12-15, before the MTP configurations existed.
DSR1_BEFORE_MTP = "dsr1_h200_trtllm_fp8_agg_1024x8192_c4_cfg181"


def test_inferencex_deepseek_rows_of_unknown_speculation_are_skipped(by_id) -> None:
    from charon_search.validation.translate import Unexpressible

    a, b = (by_id[i] for i in DSR1_MTP_OR_NOT)
    assert a.config["tp"] == b.config["tp"] and a.config["concurrency"] == b.config["concurrency"]
    assert a.measured["tpot_s"] == pytest.approx(1.66 * b.measured["tpot_s"], rel=0.01)
    for rec, day in ((a, "2026-01-28"), (b, "2026-01-14")):
        with pytest.raises(Unexpressible, match=f"speculative decoding unknown: measured {day}"):
            to_case(rec)
    assert to_case(by_id[DSR1_BEFORE_MTP]).config.speculative is None


#: The SGLang 0.5.9 FP8 TP8 EP1 layout on B200, 1k/1k at 8 streams, measured twice on
#: 2026-03-25 (227 ms TTFT / 10.8 ms TPOT and 364 / 8.8): dsr1-fp8-b200-sglang and its EAGLE
#: sibling dsr1-fp8-b200-sglang-mtp (InferenceX PR #626, 2026-02-03) share the layout.
DSR1_SGLANG_TWINS = ("2026_03_25_deepseek_r1_b200_sxm_sglang_fp8_agg_1024x1024_c8_tp8_0_ep1_0_249",
                     "2026_03_25_deepseek_r1_b200_sxm_sglang_fp8_agg_1024x1024_c8_tp8_0_ep1_0_304")


def test_inferencex_sglang_deepseek_rows_of_unknown_speculation_are_skipped(by_id) -> None:
    from charon_search.serving.backends import inferencex_spec_decoding_unknown
    from charon_search.validation.translate import Unexpressible

    a, b = (by_id[i] for i in DSR1_SGLANG_TWINS)
    assert a.config == b.config and a.extra["measured_date"] == b.extra["measured_date"]
    assert sorted(round(r.measured["tpot_s"] * 1e3, 1) for r in (a, b)) == [8.8, 10.8]
    for rec in (a, b):
        with pytest.raises(Unexpressible,
                           match="dsr1-fp8-b200-sglang-mtp of InferenceX PR #626"):
            to_case(rec)
    # The FP4 layout (TP8 EP8) had no speculative sibling then: it is simulated.
    fp4 = "2026_03_25_deepseek_r1_b200_sxm_sglang_fp4_agg_1024x1024_c8_tp8_0_ep8_0_248"
    assert to_case(by_id[fp4]).config.speculative is None

    def unknown(**kw: object) -> bool:
        facts = dict(backend="sglang", model="deepseek-ai/DeepSeek-R1-0528", mode="agg",
                     measured="2026-03-25", gpu="b200_sxm", precision="fp8", tp=8, ep=1)
        return inferencex_spec_decoding_unknown(**{**facts, **kw}) is not None

    assert unknown()
    assert not unknown(measured="2026-02-02")  # before the sibling existed
    assert not unknown(gpu="h200_sxm") and not unknown(precision="fp4") and not unknown(tp=4)
    assert not unknown(mode="disagg") and not unknown(model="MiniMaxAI/MiniMax-M2.5")
    # Qwen3.5 FP8 on B200 had its own sibling from 2026-03-09 (PR #898), at TP 4 EP 1.
    qwen = dict(model="Qwen/Qwen3.5-397B-A17B", tp=4)
    assert unknown(**qwen, measured="2026-03-20") and not unknown(**qwen, measured="2026-03-08")
    assert not unknown(model="Qwen/Qwen3.5-397B-A17B", tp=8)


def test_inferencex_sglang_glm5_and_qwen35_recipes(by_id) -> None:
    """GLM-5 (glm5_fp8_*.sh): --mem-fraction-static 0.85 on every GPU. Qwen3.5 on B200
    (qwen3.5_fp8_b200.sh): --stream-interval 30, 32768-token chunks, memory fraction 0.82. On
    B300 (qwen3.5_{bf16,fp4,fp8}_b300.sh) the chunks and memory fraction of the checkpoint's
    recipe, its --disable-radix-cache and all-reduce fusion, without the stream interval; on
    H200 SGLang's defaults (the stored H200 versions do not fit the rows)."""
    from charon_search.serving.backends import engine_profile

    glm = to_case(by_id["2026_03_25_glm_5_b200_sxm_sglang_fp8_agg_8192x1024_c8_tp8_0_ep1_0_497"])
    assert glm.config.gpu_memory_utilization == 0.85 and glm.config.stream_interval == 1
    kw = dict(isl=1024, max_batch_size=16, launcher="inferencex",
              model="Qwen/Qwen3.5-397B-A17B", linear_attention=True)
    b200 = engine_profile("sglang", gpu="b200-sxm-180gb", **kw).config_kwargs()
    assert (b200["stream_interval"], b200["max_num_batched_tokens"],
            b200["gpu_memory_utilization"]) == (30, 32768, 0.82)
    # hybrid model, but the recipe's --disable-radix-cache keeps SGLang's overlap scheduler on;
    # with the default (radix cache on) it is off, as on H200 where no recipe is modelled
    assert b200["overlap_scheduler"] is True
    for precision, chunk, mem in (("bf16", 32768, 0.82), ("fp4", 32768, 0.8),
                                  ("fp8", 16384, 0.8)):
        b300 = engine_profile("sglang", gpu="b300-sxm-288gb", precision=precision,
                              **kw).config_kwargs()
        assert (b300["max_num_batched_tokens"], b300["gpu_memory_utilization"]) == (chunk, mem)
        assert b300["overlap_scheduler"] is True and "stream_interval" not in b300
        # --enable-flashinfer-allreduce-fusion: the bf16 recipe always, fp4 at TP 8, fp8 never
        assert b300.get("allreduce_norm_fusion", False) is (precision == "bf16")
    fp4_tp8 = engine_profile("sglang", gpu="b300-sxm-288gb", precision="fp4", tp=8, **kw)
    assert fp4_tp8.config_kwargs()["allreduce_norm_fusion"] is True
    h200 = engine_profile("sglang", gpu="h200-sxm-141gb", **kw).config_kwargs()
    assert "stream_interval" not in h200 and "gpu_memory_utilization" not in h200
    assert h200["overlap_scheduler"] is False
    # DeepSeek-R1 (either checkpoint, either name): every 10 tokens; on B200 and B300 the
    # recipes' scheduler polls every 30 decode batches at 16 streams (dsr1_fp4_b200.sh,
    # dsr1_fp8_b200.sh, dsr1_fp4_b300.sh), on H200 before every batch.
    kw.update(model="deepseek-ai/DeepSeek-R1", linear_attention=False, tp=8)
    for gpu, recv in (("b200-sxm-180gb", 30), ("b300-sxm-288gb", 30), ("h200-sxm-141gb", None)):
        got = engine_profile("sglang", gpu=gpu, **kw).config_kwargs()
        assert got["stream_interval"] == 10
        assert got.get("scheduler_recv_interval") == recv
    # Prefill chunks and running-request cap: an FP4 row on Blackwell runs dsr1_fp4_b200.sh
    # (--chunked-prefill-size 16384, SGLang's default --max-prefill-tokens 16384, 256 running);
    # FP8 rows and H200 the H200 recipe's 32768 and 512 at 1k/1k.
    kw.update(max_batch_size=1024, osl=1024)
    for gpu, precision, limits in (("b200-sxm-180gb", "fp4", (16384, 16384, 256)),
                                   ("b300-sxm-288gb", "fp4", (16384, 16384, 256)),
                                   ("b200-sxm-180gb", "fp8", (32768, 32768, 512)),
                                   ("h200-sxm-141gb", "fp4", (32768, 32768, 512))):
        got = engine_profile("sglang", gpu=gpu, precision=precision, **kw).config_kwargs()
        assert (got["max_num_batched_tokens"], got["max_prefill_tokens"],
                got["max_num_seqs"]) == limits, (gpu, precision)
        # dsr1_fp4_b200.sh also passes --enable-flashinfer-allreduce-fusion
        assert bool(got.get("allreduce_norm_fusion")) == (limits[0] == 16384)


def test_sglang_default_chunk_follows_gpu_memory(by_id) -> None:
    """SGLang ``ServerArgs``: ``chunked_prefill_size`` 2048 below 35 GiB of GPU memory, 8192
    below 160 GiB (L40S 48 GB, H100 80 GB, H200 141 GB), 16384 from there (B200 180 GB, B300
    288 GB, GB200 186 GB). A launch
    that passes no chunk size (the engine's defaults, GLM-5's InferenceX recipe) gets the GPU's
    value; a recipe that passes one (Qwen3.5 on B200: 32768) keeps it."""
    import dataclasses

    from charon_search.hardware import load_gpu
    from charon_search.serving.backends import engine_profile, sglang_default_chunked_prefill

    assert [sglang_default_chunked_prefill(g) for g in
            ("l40s-48gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "b300-sxm-288gb",
             "gb200")] == [8192, 8192, 8192, 16384, 16384, 16384]
    small = dataclasses.replace(load_gpu("l40s-48gb"), name="test-24gb",
                                hbm_capacity_bytes=24 * 2**30)
    assert sglang_default_chunked_prefill(small) == 2048
    kw = dict(isl=1024, max_batch_size=16, model="Qwen/Qwen3-32B", launcher="engine_defaults")
    for gpu, chunk in (("h200-sxm-141gb", 8192), ("b200-sxm-180gb", 16384)):
        prof = engine_profile("sglang", gpu=gpu, **kw)
        assert prof.config_kwargs()["max_num_batched_tokens"] == chunk
        assert any(f"chunked_prefill_size {chunk}" in line for line in prof.sources)
    glm = to_case(by_id["2026_03_25_glm_5_b200_sxm_sglang_fp8_agg_8192x1024_c8_tp8_0_ep1_0_497"])
    assert (glm.config.max_num_batched_tokens, glm.config.max_prefill_tokens) == (16384, 16384)



def test_minimax_fp8_recipe_runs_the_triton_moe_where_it_says_so(by_id) -> None:
    """InferenceX's MiniMax-M2.5 FP8 vLLM recipe on B200 exports VLLM_USE_FLASHINFER_MOE_FP8=0
    and VLLM_MOE_USE_DEEP_GEMM=0 (the H200 one passes ``--moe-backend triton``): the routed
    experts run vLLM's Triton fused MoE, priced from its own rows. The stored B300 recipe sets
    neither; the FP4 checkpoint's NVFP4 experts are no Triton format and keep their rows."""
    from charon_search.serving._graphs import serving_graphs

    case = to_case(by_id[MINIMAX_B200_FP8])
    assert case.config.moe_kernel == "triton"
    assert any("VLLM_USE_FLASHINFER_MOE_FP8=0" in a for a in case.assumptions)
    b300 = to_case(by_id["minimaxm2_5_b300_vllm_fp8_agg_1024x1024_c128_cfg733"])
    assert b300.config.moe_kernel == ""
    fp4 = to_case(by_id["2026_03_25_minimax_m2_5_b200_sxm_vllm_fp4_agg_1024x1024_c32_tp4_0_"
                        "ep1_0_117"])
    cfg = fp4.config
    prefill, _ = serving_graphs(fp4.model, tp=cfg.tp, pp=1, ep=cfg.ep, dp_attention=False,
                                precision=cfg.precision, engine="vllm", moe_kernel=cfg.moe_kernel)
    tags = {t for g in prefill.values() for n in g.nodes if n.role == "moe.expert"
            for t in n.tags}
    assert "moe_engine:vllm_triton" not in tags
