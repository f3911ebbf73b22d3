"""``charon-search validate --explain``: the simulation behind one record's prediction."""

from __future__ import annotations

import json
import math

import pytest

from charon_search.cli import main
from charon_search.validation import to_case
from charon_search.validation.explain import explain_case, render_explanation
from charon_search.validation.predict import predict_case

SC21 = "megatron_sc21_t1_1.7b"
#: TensorRT-LLM Llama-3.1-8B, TP8, 1024/512 at concurrency 8 (aiconfigurator gap analysis).
TRT_ROW = ("meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_"
           "agg_1024x512_c8_tp8_epnone_135")


def test_training_breakdown_sums_to_the_predicted_step(by_id):
    case = to_case(by_id[SC21])
    exp = explain_case(case)
    step = predict_case(case).info["step_time_s"]
    assert exp["step_time_s"] == pytest.approx(step, rel=1e-9)
    # The parts of the critical rank's step add up to it (StepBreakdown's contract).
    assert sum(exp["breakdown"].values()) == pytest.approx(step, rel=1e-6)
    assert sum(exp["cost_sources"].values()) == pytest.approx(1.0, abs=1e-6)
    text = render_explanation(exp)
    assert "compute_s" in text and "tp1 pp1 dp32" in text


def test_serving_explanation_matches_the_validated_prediction(by_id):
    rec = by_id[TRT_ROW]
    case = to_case(rec)
    exp = explain_case(case)
    pred = predict_case(case).predicted
    assert exp["predicted"]["ttft_s"] == pytest.approx(pred["ttft_s"], rel=1e-9)
    assert exp["predicted"]["tpot_s"] == pytest.approx(pred["tpot_s"], rel=1e-9)
    eng = exp["engine"]
    isl, c = 1024, 8
    # aiperf's fixed lengths, as the row states them.
    assert exp["workload"] == {"concurrency": c, "prompt_tokens": [isl, isl],
                               "output_tokens": [512, 512], "prompt_scale": 1.0,
                               "prompt_scale_why": ""}
    # aiconfigurator's trtllm.rule: max_num_tokens = max_batch_size + isl + 1500.
    assert eng["max_num_batched_tokens"] == c + isl + 1500
    prompt = exp["iterations"]["prompt"]
    # No chunked prefill: whole 1024-token prompts, as many as fit beside the decodes.
    assert prompt["mean_prompt_tokens"] / prompt["mean_prompts"] == pytest.approx(isl)
    assert prompt["mean_prompts"] <= (eng["max_num_batched_tokens"]) // isl
    decode = exp["iterations"]["decode"]
    assert decode["mean_decodes"] <= c
    assert prompt["time_share"] + decode["time_share"] == pytest.approx(1.0)
    # The decode step's operators are a part of the decode iteration (attention, LM head and
    # the sampler are the rest).
    ds = exp["decode_step"]
    assert 0 < ds["linear_total_s"] < decode["mean_duration_s"]
    assert ds["ops"] and all(op["source"] in ("profile", "predictor", "roofline", "collective")
                             for op in ds["ops"])
    # Its attention over the mean context (the prompt plus half the output) is most of the
    # rest: with the LM head they make up the simulated decode iteration.
    assert ds["context_tokens"] == isl + 512 // 2
    assert 0 < ds["attention_s"] < ds["linear_total_s"]
    assert ds["linear_total_s"] + ds["attention_s"] == pytest.approx(
        decode["mean_duration_s"], rel=0.1)
    # The mean prompt iteration, op by op: two whole prompts plus the few decodes beside them;
    # its token-linear ops, prefill attention and TensorRT-LLM's calibrated 16 ms of host time
    # per prompt iteration make up its simulated duration (the LM head and the decodes'
    # attention are the rest).
    ps = exp["prompt_step"]
    assert ps["tokens"] == round(prompt["mean_prompt_tokens"] + prompt["mean_decodes"])
    assert ps["linear_total_s"] + ps["attention_s"] + eng["prefill_iteration_overhead_s"] == (
        pytest.approx(prompt["mean_duration_s"], rel=0.05))
    assert ps["num_kernels"] * ps["host_per_kernel_s"] < ps["linear_total_s"]  # GPU-bound
    assert isl <= ps["tokens"] <= 2 * isl + c
    text = render_explanation(exp)
    assert f"prompt step at {ps['tokens']} tokens (" in text
    assert f"at {isl + 256} keys a request ({exp['kv_cache']['kv_dtype']} cache)" in text
    # Tensor-parallel attention: every rank runs all the step's tokens. Under attention DP
    # each rank runs its share (``rank_tokens``), and the line says so.
    assert ps["rank_tokens"] == ps["tokens"]
    dp = {**exp, "prompt_step": {**ps, "rank_tokens": -(-ps["tokens"] // 8)}}
    assert (f"prompt step at {ps['tokens']} tokens, {-(-ps['tokens'] // 8)} per attention-DP "
            "rank (") in render_explanation(dp)
    # Its gap-analysis launch tokenizes in Dynamo's front end, not in trtllm-serve: the H100
    # spec's TensorRT-LLM 4 us per prompt token does not apply, and it sets none for Dynamo
    # (docs/calibration/README.md: held out, the fitted 4 us helps one Dynamo source of three).
    per_token = case.cluster.calibration.frontend_prompt_token_s
    assert per_token["trtllm"] == pytest.approx(4e-6) and "dynamo" not in per_token
    assert eng["frontend_prompt_token_s"] == 0.0
    assert "frontend_prompt_token_s 0.00 us/token" in text
    # Its gap-analysis launch streams through a Dynamo worker, for which the H100 spec sets no
    # time per token (docs/calibration/README.md: checked, not adopted).
    assert eng["frontend"] == "dynamo"
    assert eng["frontend_output_token_s"] == 0.0
    assert "frontend dynamo" in text and "frontend_output_token_s 0.00 us/token" in text
    assert math.isfinite(exp["ttft_percentiles_s"]["p50"])
    # The KV cache: the memory model's capacity, and 8 streams of 1024 + 512 tokens at most.
    from charon_search.serving.simulator import kv_capacity_blocks

    kv = exp["kv_cache"]
    cfg = case.config
    blocks = kv_capacity_blocks(case.model, case.cluster, cfg, tp=cfg.tp, pp=cfg.pp, ep=cfg.ep)
    assert kv["capacity_tokens"] == blocks * cfg.block_size
    assert kv["full_length_demand_tokens"] == c * (isl + 512)
    assert 0 < kv["utilization"] <= c * (isl + 512) / kv["capacity_tokens"]
    assert kv["preemptions"] == 0
    assert f"{kv['capacity_tokens']:,} tokens per replica" in render_explanation(exp)
    # Sized as TensorRT-LLM does, by aiconfigurator's template fraction of the free memory.
    assert kv["memory"] == "free_gpu_memory_fraction 0.8"


def test_cli_explain_writes_json_and_rejects_unknown_ids(tmp_path, capsys):
    out = tmp_path / "explain.json"
    assert main(["validate", "--explain", "--ids", SC21, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [e["id"] for e in data["explanations"]] == [SC21]
    assert "step breakdown" in capsys.readouterr().out
    assert main(["validate", "--explain", "--ids", "no_such_record"]) == 2
    assert "--ids" in capsys.readouterr().err


#: InferenceX, Dynamo + TensorRT-LLM, DeepSeek-R1 NVFP4 on GB200: one TP-4 prefill worker and
#: four TP-8 (EP 8) decode workers, 1024/1024 tokens at concurrency 8.
DISAGG_ROW = "dsr1_gb200_trtllm_fp4_disagg_1024x1024_c8_cfg237"


def test_disaggregated_explanation_shows_the_pools_and_a_decode_step(by_id):
    exp = explain_case(to_case(by_id[DISAGG_ROW]))
    eng = exp["engine"]
    assert eng["prefill_pool"] == "1 x tp4 pp1 ep4" and eng["decode_pool"] == "4 x tp8 pp1 ep8"
    assert "tp" not in eng
    # The operators listed are a decode-pool replica's (the prefill replica's TP-4 GEMMs would
    # cost more than the whole decode iteration).
    decode = exp["iterations"]["decode"]
    assert 0 < exp["decode_step"]["linear_total_s"] < decode["mean_duration_s"]
    assert "decode_pool 4 x tp8 pp1 ep8" in render_explanation(exp)
    # The prompt step is the TP-4 prefill replica's (TensorRT-LLM's 16 ms host time included).
    prompt, ps = exp["iterations"]["prompt"], exp["prompt_step"]
    assert ps["linear_total_s"] + ps["attention_s"] + eng["prefill_iteration_overhead_s"] == (
        pytest.approx(prompt["mean_duration_s"], rel=0.05))


def test_training_explanation_lists_each_blocks_largest_operators(by_id):
    """SC21 1.7B (GPT, hidden 2304, FFN 9216, micro-batch 16 x 2048 tokens, TP1): the
    largest operators of one dense layer, as priced, with the FLOP/s a GEMM reaches."""
    exp = explain_case(to_case(by_id[SC21]))
    blocks = {(b["block"], b["pass"]): b for b in exp["block_ops"]}
    assert {("dense", "forward"), ("dense", "backward")} <= set(blocks)
    fwd = blocks[("dense", "forward")]
    secs = [op["seconds"] for op in fwd["ops"]]
    assert secs == sorted(secs, reverse=True) and sum(secs) <= fwd["total_s"] * (1 + 1e-12)
    # The FFN up-projection: 2 * tokens * hidden * ffn FLOPs, whatever its time.
    up = 2 * 16 * 2048 * 2304 * 9216
    assert any(op["flops_per_s"] and math.isclose(op["flops_per_s"] * op["seconds"], up,
                                                  rel_tol=1e-9) for op in fwd["ops"])
    # No communication in a TP1 forward: one layer's forward is its operators back to back.
    assert fwd["total_s"] == pytest.approx(exp["layer_times_s"]["dense"]["forward_s"],
                                           rel=1e-6)
    text = render_explanation(exp)
    assert "dense forward, one layer: operators sum to" in text and "TFLOP/s)" in text


def test_causal_attention_rate_counts_the_work_its_kernel_does(by_id):
    """torchtitan Llama 3.1 8B (32 heads of 128, 2 sequences of 8192 tokens per micro-batch,
    FlashAttention-2): the FLOP/s shown for the causal attention forward is its causal work,
    2 (QK^T and PV) x 2 x b x h x s^2/2 x d, over its time, not the full score square (which
    would show twice the rate, above what the kernel reaches on an H100)."""
    exp = explain_case(to_case(by_id["torchtitan_202412_t1_8b_8gpu_fsdp"]))
    fwd = {(b["block"], b["pass"]): b for b in exp["block_ops"]}[("dense", "forward")]
    attn = next(op for op in fwd["ops"] if op["kind"] == "attention")
    b, h, s, d = 2, 32, 8192, 128
    assert attn["flops_per_s"] * attn["seconds"] == pytest.approx(2 * b * h * s * s * d,
                                                                  rel=1e-9)
    # FlashAttention-2 on a GH100 forward: about 300-340 TFLOP/s (the measured dense kernel).
    assert 200e12 < attn["flops_per_s"] < 400e12


def test_explanation_shows_the_first_chunk_of_a_streaming_interval(by_id):
    """InferenceX's TensorRT-LLM DeepSeek recipe streams every 10 tokens: the explanation names
    the interval and the share of TTFT it adds, 9 token gaps (about 9 TPOTs), which takes the
    TTFT from one ~50 ms prompt step to about 200 ms; the Llama gap row streams every token."""
    exp = explain_case(to_case(by_id["dsr1_b200_trtllm_fp4_agg_1024x8192_c32_cfg91"]))
    assert exp["engine"]["stream_interval"] == 10
    tpot, ttft = exp["predicted"]["tpot_s"], exp["predicted"]["ttft_s"]
    text = render_explanation(exp)
    assert (f"first chunk carries token 10 (stream_interval, an empirical rule): about 9 x TPOT"
            f" = {9 * tpot * 1e3:.2f} ms") in text
    prompt = exp["iterations"]["prompt"]["mean_duration_s"]
    assert ttft > prompt + 9 * tpot * 0.9
    plain = explain_case(to_case(by_id[TRT_ROW]))
    assert plain["engine"]["stream_interval"] == 1
    assert "first chunk carries" not in render_explanation(plain)
