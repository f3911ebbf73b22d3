"""Accuracy of a few well-understood records against the targets of issue 8 (real simulators).

A single record is held to the p90 bound of its group (training step time 10 %, serving TTFT/TPOT
20 %); the medians are reported by `charon-search validate` / docs/accuracy.md. Records whose
error the simulators do not yet reach are xfail with the measured error in the reason (strict:
they turn into failures once they pass, so the marker gets removed).
"""

from __future__ import annotations

import pytest

from charon_search.validation import run_validation, select_records

pytestmark = [pytest.mark.validation, pytest.mark.slow]

H100_8B_ROW = ("meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_"
               "trtllm_agg_1024x128_c8_tp1_epnone_1")


SC21_ROW = "megatron_sc21_t1_7.5b"
TORCHTITAN_ROW = "torchtitan_trainy_h200_8b_4nodes"


@pytest.fixture(scope="module")
def validated(shipped_records):
    """One run over the three records (the simulators' traces are shared)."""
    return run_validation(select_records(shipped_records,
                                         ids=[SC21_ROW, TORCHTITAN_ROW, H100_8B_ROW]))


def _errors(validated, rid):
    assert rid not in {s["id"] for s in validated.skipped}, validated.skipped
    return {r["metric"]: r["error"] for r in validated.rows if r["id"] == rid}


def test_sc21_7_5b_hardware_tflops(validated):
    # SC21 Table 1: GPT-7.5B, 128 A100, TP 4, DP 32, 142 TFLOP/s per GPU (46 % of peak).
    # Megatron-LM 2021 ran unfused CoreAttention (attention_kernel "eager"): +7.1 % at 23:45,
    # +2.4 % with the A100 sustained clock (session 2).
    err = _errors(validated, SC21_ROW)
    assert abs(err["hardware_tflops_per_gpu"]) <= 0.10, err


def test_torchtitan_llama3_8b_h200_throughput(validated):
    # torchtitan benchmark (Trainy, June 2025): Llama 3.1 8B, 32 H200, FSDP, 10,938 TPS/GPU.
    # +26.5 % before the sustained-clock derating, +11.5 % after it; -4.9 % once torchtitan's
    # SDPA attention is priced as FlashAttention-2 (cuDNN attention was opt-in in torch
    # 2.5.1-2.8) rather than the H200 profile's FlashAttention-3 (session 2, round 2).
    err = _errors(validated, TORCHTITAN_ROW)
    assert abs(err["tokens_per_s_per_gpu"]) <= 0.10, err


def test_llmfoundry_mpt70b_fsdp_activation_checkpointing(shipped_records):
    # llm-foundry MPT benchmark table (H100-80GB): MPT-70B on 64 GPUs, FSDP FULL_SHARD with
    # activation checkpointing, 1,039 tokens/s per GPU. Each layer's backward gathers its
    # parameters once (the re-run forward uses them); gathering them again for the recompute
    # exposed 19 ms of FSDP traffic per layer and predicted -5.1 % (session 35: +1.5 %).
    rid = "llmfoundry_h100_80gb_mpt70b_64gpu_seq2048"
    err = _errors(run_validation(select_records(shipped_records, ids=[rid])), rid)
    assert abs(err["tokens_per_s_per_gpu"]) <= 0.05, err


@pytest.mark.xfail(strict=True, reason=(
    "serving simulator, session 2 (02:45): TTFT -77 %, TPOT -11 % on this row (02:15: -77 % / "
    "-8 %, before the CUDA-graph kernel floor and TensorRT-LLM's RoPE-in-attention; session "
    "1: -87 % / +20 %); TPOT is within target since TensorRT-LLM's overlap scheduler, no-chunk "
    "budget and custom all-reduce are modelled, TTFT is not: the dense TensorRT-LLM 1.0.0rc3 "
    "gap-analysis rows measure 2-12x one prefill (more with concurrency), as if arrivals "
    "stayed in partial waves the simulation does not keep; unexplained; session 3: unchanged "
    "(the Llama-8B rows fit a closed loop in which the engine serves C-1 requests at once for "
    "C = 8-32, i.e. one request always waits a full request time / (C-1), but the Qwen3-32B rows "
    "of the same engine and source do not); session 4: TTFT -51 % (predicted 94 ms) once the "
    "overlap scheduler forms each batch while the previous one runs, so a closed-loop prompt "
    "joins the third batch after its predecessor's response; session 5: TPOT -9 % (was -11 %) "
    "once the simulated run no longer drains during its last measured turn, TTFT -51 %: on the "
    "Llama-3.1-8B rows of all three engines the excess is about one request time / "
    "concurrency (as if one request always waited), on larger models it is not; session 7: "
    "TTFT -51 %, TPOT -9 % with aiperf's drained warm-up (the measured phase starts on an idle "
    "engine: 50 turns of 8 streams from one synchronized wave); session 9: unchanged as "
    "shipped; a calibrated TensorRT-LLM front-end latency (20-60 ms, "
    "docs/calibration/serving-frontend.yaml) does not carry from one measurement pipeline to "
    "the other and is not in the cluster specs; session 10: TTFT -34 %, TPOT -6 % with the "
    "calibrated 16 ms a served TensorRT-LLM iteration carrying prompt tokens adds "
    "(docs/calibration/serving-prefill-trtllm.yaml, which lowers both TensorRT-LLM sources' "
    "error held out); session 11: unchanged, and no phase pattern reaches it: with a client "
    "turnaround of 0-50 ms between a response and the next request this row predicts 85-135 ms "
    "against the measured 191 ms (the method of benchmarks/bench_phase_sensitivity.py, which "
    "moves other gap rows' TTFT by up to 2x); "
    "target |err| <= 20 %"))
def test_h100_llama3_8b_silicon_row(validated):
    # aiconfigurator silicon row: TRT-LLM, H100, TP1, concurrency 8, 1024/128 tokens:
    # TTFT 190.95 ms, TPOT 7.94 ms; predicted 43.8 ms / 7.10 ms.
    err = _errors(validated, H100_8B_ROW)
    assert abs(err["ttft_s"]) <= 0.20 and abs(err["tpot_s"]) <= 0.20, err


KORTHIKANTI_T4 = ("korthikanti_t4_22b_layer_baseline_no_recompute",
                  "korthikanti_t4_22b_layer_full_recompute",
                  "korthikanti_t4_22b_layer_selective_recompute",
                  "korthikanti_t4_22b_layer_selective_plus_sequence_parallel")


def test_korthikanti_table4_layer_times(shipped_records):
    # Korthikanti et al. Table 4: one 22B layer (TP 8, micro-batch 4 x 2048) forward + backward
    # 19.6 / 27.2 / 20.9 / 20.3 ms with no / full / selective / selective + SP recompute.
    # Predicted (session 16): +5.1 / +8.3 / +4.5 / -2.2 %; session 36, with the TP all-reduces
    # priced from the measured A100 NCCL rows (~0.9 ms for the 96 MiB all-reduce, where the
    # fitted line said 1.02 ms): +3.5 / +6.3 / +3.0 / -2.4 %.
    res = run_validation(select_records(shipped_records, ids=list(KORTHIKANTI_T4)))
    got = {r["id"]: r for r in res.rows if r["metric"] == "layer_forward_backward_time_s"}
    assert set(got) == set(KORTHIKANTI_T4), res.skipped
    measured = {rid: got[rid]["measured"] for rid in KORTHIKANTI_T4}
    assert measured == dict(zip(KORTHIKANTI_T4, (0.0196, 0.0272, 0.0209, 0.0203), strict=True))
    for rid, r in got.items():
        assert abs(r["error"]) <= 0.07, (rid, r)


QWEN35_ROW = "2026_04_06_qwen3_5_397b_h200_sxm_sglang_fp8_agg_1024x8192_c8_tp8_ep8_1500"


@pytest.fixture(scope="module")
def qwen35(shipped_records):
    return run_validation(select_records(shipped_records, ids=[QWEN35_ROW]))


def test_qwen35_hybrid_tpot_h200(qwen35):
    # InferenceX, SGLang 0.5.9, Qwen3.5-397B-A17B FP8 on 8 H200 (TP 8, EP 8), 1024/8192 tokens
    # at concurrency 8: TPOT 10.5 ms. 45 of its 60 layers are Gated DeltaNet, priced from
    # SGLang's measured kernels; SGLang runs the model without its overlap scheduler
    # (MambaRadixCache). +9.8 % (session 18); -18 % with the overlap scheduler assumed.
    err = _errors(qwen35, QWEN35_ROW)
    assert abs(err["tpot_s"]) <= 0.20, err


@pytest.mark.xfail(strict=True, reason=(
    "session 18: TTFT -78 % (304 ms measured, 67 ms predicted). Every Qwen3.5 silicon row, on "
    "H200 and B200 alike, measures ~200-280 ms more TTFT than the simulated prefill at any "
    "concurrency and prompt length (1k and 8k), a near-constant offset, not prefill work; "
    "unexplained; session 20: the offset is 13-22 x TPOT on H200 and B300 and 25-35 x TPOT on "
    "B200 (TP 8), a first chunk carrying the stream_interval-th token; the B200 rows fit the "
    "stored qwen3.5_fp8_b200.sh (--stream-interval 30, test below), the H200 one "
    "(--stream-interval 50) predicts +70 to +270 %: its version postdates these rows; "
    "session 24: the B200 recipes' --scheduler-recv-interval 10/30 on top of the stream "
    "interval puts the 105 B200 rows' median TTFT bias at +21.6 % (from -0.4 %), so it is not "
    "applied to Qwen3.5; this row unchanged; session 28: SGLang's stream_output_generation "
    "sends a streaming request's first token at once (len(output_ids) % stream_interval == 1), "
    "so the interval rule describes the B200 rows' delay without explaining it"))
def test_qwen35_hybrid_ttft_h200(qwen35):
    err = _errors(qwen35, QWEN35_ROW)
    assert abs(err["ttft_s"]) <= 0.20, err


QWEN35_B300_ROW = "qwen3_5_b300_sglang_bf16_agg_8192x1024_c4_cfg738"


def test_qwen35_hybrid_tpot_b300_recipe(shipped_records):
    # InferenceX db dump, SGLang 0.5.10.post1, Qwen3.5-397B-A17B bf16 on 8 B300 (TP 8),
    # 8192/1024 tokens at concurrency 4: TPOT 6.694 ms. qwen3.5_bf16_b300.sh passes
    # --disable-radix-cache, so the overlap scheduler stays on: +4.5 % (session 38); +36 % with
    # SGLang's defaults (overlap off for the hybrid model, 9.12 ms). Measured 2026-04-18, the day
    # of the layout's speculative sibling (qwen3.5-bf16-b300-sglang-mtp), so ``validate`` skips
    # the row; the recipe is checked on the row without its date.
    import dataclasses

    row = select_records(shipped_records, ids=[QWEN35_B300_ROW])[0]
    undated = dataclasses.replace(row, extra={k: v for k, v in row.extra.items()
                                              if k != "measured_date"})
    err = _errors(run_validation([undated]), QWEN35_B300_ROW)
    assert abs(err["tpot_s"]) <= 0.10, err


DSR1_ADP_MOE_TP_ROW = "dsr1_b200_trtllm_fp8_disagg_8192x1024_c128_cfg670"


def test_attention_dp_with_expert_tp_disagg_row(shipped_records):
    # InferenceX (Dynamo + TensorRT-LLM 0.8.1.post2 image), DeepSeek-R1 FP8 on B200, 8192/1024
    # tokens at concurrency 128: one prefill worker of 8 attention-DP ranks whose experts are
    # tensor-parallel over the 8 GPUs (moe_tp 8, ep 1), two decode workers of DP 8 x EP 8;
    # TPOT 26.1 ms. Rejected before session 19 (each prefill rank held every expert whole:
    # 625 GiB per GPU); TPOT -2.8 %, TTFT +23.6 % once the experts are split over the DP ranks.
    res = run_validation(select_records(shipped_records, ids=[DSR1_ADP_MOE_TP_ROW]))
    err = _errors(res, DSR1_ADP_MOE_TP_ROW)
    assert abs(err["tpot_s"]) <= 0.20, err


GLM5_LONG_CONTEXT_ROW = "2026_03_25_glm_5_b200_sxm_sglang_fp8_agg_8192x1024_c8_tp8_0_ep1_0_497"


def test_glm5_sparse_attention_long_context_row(shipped_records):
    # InferenceX, GLM-5 FP8 (DeepSeek Sparse Attention) on B200 under SGLang, TP 8, 8192/1024
    # tokens at concurrency 8: TPOT 21.8 ms, TTFT 742 ms. Every decode step runs the lightning
    # indexer over ~8.7k cached keys and the sparse MLA over 2,048 of them per layer. TPOT
    # -2.6 %, TTFT +7.9 % (session 20); +31 % TPOT while the decode indexer and sparse MLA were
    # priced from the measured rows of the prefill kernels, which SGLang does not decode with.
    res = run_validation(select_records(shipped_records, ids=[GLM5_LONG_CONTEXT_ROW]))
    err = _errors(res, GLM5_LONG_CONTEXT_ROW)
    assert abs(err["tpot_s"]) <= 0.20, err


#: Rows whose TTFT needs the recipe's --stream-interval: the client's first chunk taken to
#: carry the interval-th token (session 20; an empirical rule, ServingConfig.stream_interval:
#: SGLang's and TensorRT-LLM's own code send the first token at once).
#: * InferenceX, SGLang 0.5.9, Qwen3.5-397B-A17B FP8 on 8 B200 (TP 8), 1024/1024 tokens at
#:   concurrency 16: TTFT 441 ms, TPOT 12.2 ms; qwen3.5_fp8_b200.sh streams every 30 tokens:
#:   TTFT -6 %, -87 % with the first token taken as streamed at once.
#: * InferenceX, SGLang 0.5.9, DeepSeek-R1 FP4 on 8 B200 (TP 8, EP 8), 1024/1024 at
#:   concurrency 64: TTFT 496 ms, TPOT 16.3 ms; streamed every 10 tokens, the scheduler
#:   polling for new requests every 30 decode batches (--scheduler-recv-interval of the B200
#:   recipes): TTFT +4.9 %, TPOT +0.8 %; -76 % with neither, -45 % with the stream interval
#:   alone, -25 % with the polls alone (session 46). (Until session 46 this was the FP8 TP 8
#:   row of the same recipe family, now skipped: its layout also ran with EAGLE from
#:   2026-02-03, InferenceX PR #626.)
#: * InferenceX, TensorRT-LLM (dsr1_fp4_b200_trt.sh: ``stream_interval: 10``, no
#:   post-processing workers), DeepSeek-R1 FP4 on 8 B200 (TP 8, MoE TP 8), 1024/8192 tokens at
#:   concurrency 32: TTFT 221 ms, TPOT 13.7 ms. With the first chunk taken to carry the 10th
#:   token (session 52, backends.INFERENCEX_DSR1_TRT_STREAM_INTERVAL) TTFT -6.7 %; -54.7 % with
#:   the first token streamed at once, as TensorRT-LLM's own code does.
STREAM_INTERVAL_ROWS = (
    "2026_04_06_qwen3_5_397b_b200_sxm_sglang_fp8_agg_1024x1024_c16_tp8_ep1_1497",
    "2026_04_06_deepseek_r1_b200_sxm_sglang_fp4_agg_1024x1024_c64_tp8_ep8_1038",
    "dsr1_b200_trtllm_fp4_agg_1024x8192_c32_cfg91",
)


@pytest.mark.parametrize("rid", STREAM_INTERVAL_ROWS)
def test_b200_ttft_with_the_recipe_stream_interval(shipped_records, rid):
    err = _errors(run_validation(select_records(shipped_records, ids=[rid])), rid)
    assert abs(err["ttft_s"]) <= 0.20, err
    assert abs(err["tpot_s"]) <= 0.20, err


#: aiconfigurator gap analysis, TensorRT-LLM 1.3.0rc5 (Dynamo 0.8.1), Qwen3-32B NVFP4 on
#: GB200, 15000/500 tokens: 448 client streams over 32 TP-2 workers of batch 14 (64 GPUs,
#: like the disagg row of the same run); TTFT 746 ms, TPOT 13.7 ms. Simulated as one worker
#: at its 14 streams: TTFT +2 %, TPOT -5 % (session 21); +13,130 % / +735 % while the 448
#: streams were queued on one worker.
GB200_WORKERS_ROW = ("nvidia_qwen3_32b_nvfp4_nvidia_qwen3_32b_nvfp4_gb200_trtllm_agg_15000x500_"
                     "c448_tp2_0_epnone_2")


def test_agg_row_served_by_several_workers(shipped_records):
    res = run_validation(select_records(shipped_records, ids=[GB200_WORKERS_ROW]))
    err = _errors(res, GB200_WORKERS_ROW)
    assert abs(err["ttft_s"]) <= 0.20, err
    assert abs(err["tpot_s"]) <= 0.20, err
    case = res.cases[GB200_WORKERS_ROW]
    assert case["num_gpus"] == 64
    assert any(a.startswith("32 aggregated workers") and "its 14 streams" in a
               for a in case["assumptions"]), case["assumptions"]


#: InferenceX, vLLM 0.19.0, MiniMax-M2.5 FP8 on 4 B300 (TP 4), 1024/1024 tokens at concurrency
#: 128: TTFT 206 ms, TPOT 17.8 ms. vLLM's API server hands each of the 128 streams a chunk per
#: output cycle; the lag that adds to every token (frontend_output_stream_us: 600 us per stream,
#: fitted on H100/H200 only, so this B300 row is held out) is most of the TTFT the engine
#: misses: TTFT +3.5 %, TPOT -7.7 % (session 43); -33 % TTFT without it.
VLLM_MANY_STREAMS_ROW = "minimaxm2_5_b300_vllm_fp8_agg_1024x1024_c128_cfg733"


def test_vllm_many_streams_ttft_with_the_streaming_cycle(shipped_records):
    res = run_validation(select_records(shipped_records, ids=[VLLM_MANY_STREAMS_ROW]))
    err = _errors(res, VLLM_MANY_STREAMS_ROW)
    assert abs(err["ttft_s"]) <= 0.20, err
    assert abs(err["tpot_s"]) <= 0.20, err

