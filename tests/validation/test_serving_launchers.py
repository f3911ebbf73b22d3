"""Translation of the TensorRT-LLM perf-overview records (trtllm-bench) and of disaggregated
DeepSeek rows whose pools differ in attention DP (translation only, fast)."""

from __future__ import annotations

import dataclasses

from charon_search.validation.translate import to_case

PERF_8B_H200 = "trtllm_llama31_8b_h200_tp1_isl2048_osl2048"
DS_H100_DISAGG = "dsr1_h100_trtllm_fp8_disagg_1024x1024_c30_cfg494"
QWEN32_VLLM_GAP = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c16_tp2_epnone_4"


def test_perf_overview_row_runs_trtllm_bench_limits(by_id) -> None:
    case = to_case(by_id[PERF_8B_H200])
    cfg, wl = case.config, case.workload
    # tests/serving/test_backends_trtllm_bench.py: 512 requests, 2560 tokens for this row.
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (512, 2560)
    assert cfg.kv_admission == "reserve_max" and not cfg.chunked_prefill
    assert cfg.block_size == 32 and cfg.kv_dtype == "fp8" and cfg.tp_allreduce == "trtllm"
    # KV = 0.95 x memory left after weights and the profiling forward: between the heuristic's
    # 0.95 x (device - weights) = 2.06 M tokens and 0.90 of it.
    tokens = cfg.num_kv_blocks * cfg.block_size
    assert 0.90 * 2.06e6 < tokens < 2.06e6
    # perf-overview $num_requests for 2048/2048, all at t = 0.
    assert wl.num_requests == 1500 and wl.arrival == "burst"


def test_disagg_pools_keep_their_own_attention_dp(by_id) -> None:
    cfg = to_case(by_id[DS_H100_DISAGG]).config
    pre, dec = cfg.disagg.prefill, cfg.disagg.decode
    # Row: prefill 1 worker TP1 x attention-DP16, EP16; decode 3 workers TP16, EP16.
    assert (pre.tp, pre.ep, pre.dp_attention) == (16, 16, True)
    assert (dec.num_replicas, dec.tp, dec.ep, dec.dp_attention) == (3, 16, 16, False)


def test_sglang_attention_dp_moe_pools_run_expert_parallel(by_id) -> None:
    # Row (InferenceX, Dynamo + SGLang, DeepSeek-R1 FP4 on GB200 NVL72): prefill 4 workers of
    # attention-DP 4, decode one worker of attention-DP 32, both with moe_ep_size 1; the
    # srt-slurm recipes behind such rows set tp = dp = ep (DeepEP), so both pools run EP.
    case = to_case(by_id["dsr1_gb200_sglang_fp4_disagg_1024x1024_c8192_cfg259"])
    pre, dec = case.config.disagg.prefill, case.config.disagg.decode
    assert (pre.num_replicas, pre.tp, pre.ep, pre.dp_attention) == (4, 4, 4, True)
    assert (dec.num_replicas, dec.tp, dec.ep, dec.dp_attention) == (1, 32, 32, True)
    assert sum("EP 32 = the attention-DP ranks" in n for n in case.assumptions) == 1
    # TensorRT-LLM rows keep the EP they state (moe_tp 8 with ep 1 is expert TP).
    trt = to_case(by_id["dsr1_b200_trtllm_fp8_disagg_8192x1024_c128_cfg670"]).config
    assert trt.disagg.prefill.ep == 1


def test_trtllm_attention_dp_pools_budget_per_rank(by_id) -> None:
    # Row: prefill 2 workers TP1 x attention-DP8 (EP8), decode 3 workers ADP8, 8192/1024, C192.
    case = to_case(by_id["dsr1_h200_trtllm_fp8_disagg_8192x1024_c192_cfg325"])
    cfg = case.config
    # Engine defaults: max_num_tokens = C + isl + 1500 = 9884 per rank, x 8 ranks per worker.
    assert cfg.max_num_batched_tokens == 192 + 8192 + 1500
    assert cfg.disagg.prefill.max_num_batched_tokens == 8 * 9884
    assert cfg.disagg.decode.max_num_batched_tokens == 8 * 9884
    assert cfg.tp_allreduce == "trtllm" and cfg.kv_admission == "reserve_max"
    # A TP-attention pool keeps the replica-wide budget.
    tep = to_case(by_id["dsr1_h200_trtllm_fp8_disagg_8192x1024_c192_cfg674"]).config
    assert tep.disagg.prefill.max_num_batched_tokens == 0


def test_inferencex_deepseek_recipes(by_id) -> None:
    # SGLang dsr1_fp8_h200.sh: chunked-prefill / max-prefill 32768, 256 running requests
    # (cuda-graph-max-bs 256) outside 1k/1k; the row's concurrency (16) is below the cap.
    sg = to_case(by_id["dsr1_h200_sglang_fp8_agg_1024x8192_c16_cfg81"]).config
    assert sg.max_num_batched_tokens == sg.max_prefill_tokens == 32768
    assert sg.prefill_schedule == "prefill_first" and sg.max_num_seqs == 16
    assert sg.cuda_graph_sizes[-1] == 256
    # --stream-interval 10: the client's first chunk is the 10th token.
    assert sg.stream_interval == 10
    # TensorRT-LLM dsr1_fp8_h200_trt.sh: max(8192, round_up_64(C + isl + 64)).
    short = to_case(by_id["dsr1_h200_trtllm_fp8_agg_1024x1024_c16_cfg83"]).config
    assert short.max_num_batched_tokens == 8192  # 16 + 1024 + 64 -> 1152 < 8192
    long = to_case(by_id["dsr1_h200_trtllm_fp8_agg_8192x1024_c64_cfg83"]).config
    assert long.max_num_batched_tokens == 8320  # 64 + 8192 + 64, already a multiple of 64
    # stream_interval: 10 without post-processing workers: the first chunk is the 10th token;
    # the Llama-3.3-70B recipe streams every 10 tokens too but runs 2 post-processing workers,
    # and its rows show no delay, so it keeps the first token at once.
    assert short.stream_interval == long.stream_interval == 10
    llama = next(r for r in by_id.values() if r.id.startswith("2026_04_06_llama_3_1_70b_h200")
                 and "trtllm" in r.id)
    assert to_case(llama).config.stream_interval == 1


def test_inferencex_sglang_deepseek_fp8_b200_tp4_recipe(by_id) -> None:
    """dsr1_fp8_b200.sh's TP 4 branch (8k/1k only): 32 running requests, chunks of 8192,
    --mem-fraction-static 0.95 and a recv poll every 10 batches whatever the concurrency. At
    the H200 recipe's 0.82 the row did not fit: 0.82 x 178.35 GiB < 157.5 GiB of weights."""
    from charon_search.serving.simulator import kv_capacity_blocks

    row = "2026_04_06_deepseek_r1_b200_sxm_sglang_fp8_agg_8192x1024_c16_tp4_ep1_1987"
    case = to_case(by_id[row])
    cfg = case.config
    assert (cfg.tp, cfg.gpu_memory_utilization) == (4, 0.95)
    assert cfg.max_num_batched_tokens == cfg.max_prefill_tokens == 8192
    assert cfg.cuda_graph_sizes[-1] == 32 and cfg.max_num_seqs == 16
    assert cfg.scheduler_recv_interval == 10  # the TP 8 branch relaxes to 30 from 16 streams
    assert cfg.allreduce_norm_fusion and cfg.kv_dtype == "fp8"
    # The recipe's --stream-interval 30 is simulated as 10: the same day's TP 8 FP8 1k/1k run
    # without MTP (226.6 ms) fits the first-chunk rule at 10 (211 ms), not at 30 (422 ms).
    assert cfg.stream_interval == 10
    # The TP 8 FP8 rows keep the H200 recipe's limits: 0.82, no fusion, 256 running requests
    # outside 1k/1k, stream interval 10, and a recv poll every 30 batches from 16 streams.
    tp8 = to_case(by_id["2026_04_06_deepseek_r1_b200_sxm_sglang_fp8_agg_8192x1024_c16_tp8_ep8_"
                        "1041"]).config
    assert (tp8.tp, tp8.gpu_memory_utilization, tp8.allreduce_norm_fusion) == (8, 0.82, False)
    assert tp8.cuda_graph_sizes[-1] == 256 and tp8.scheduler_recv_interval == 30
    assert tp8.stream_interval == 10
    # KV cache below (0.95 x 178.35 GiB - 157.5 GiB) / (61 layers x 576 B of fp8 latent a
    # token) = 364.6 k tokens, by the activations and graphs the engine also holds.
    tokens = cfg.block_size * kv_capacity_blocks(case.model, case.cluster, cfg, tp=4, pp=1, ep=1)
    assert 0.8 * 364.6e3 < tokens < 364.6e3


def test_inferencex_deepseek_trt_attention_dp_recipe(by_id) -> None:
    """dsr1_fp8_h200_trt.sh with DP_ATTENTION=true: per-rank max_num_tokens (x8 ranks) and the
    attention-DP balance block (timeout_iters 60); without attention DP neither."""
    row = "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x1024_c128_tp8_0_ep8_0_1244"
    # Measured 2026-01-14, when the layout also ran with MTP, so ``validate`` skips the row
    # (test_serving_engines.py); the recipe is checked on the row without its date.
    undated = dataclasses.replace(by_id[row], extra={
        k: v for k, v in by_id[row].extra.items() if k != "measured_date"})
    adp = to_case(undated).config
    assert adp.dp_attention and adp.tp == 8
    assert adp.max_num_batched_tokens == 8 * 8192  # max(8192, 128 + 1024 + 64) per rank
    assert adp.adp_balance_timeout_iters == 60
    plain = to_case(by_id["dsr1_h200_trtllm_fp8_agg_1024x1024_c16_cfg83"]).config
    assert not plain.dp_attention and plain.adp_balance_timeout_iters == 0


def test_aiperf_rows_draw_from_a_pool_of_100_prompts(by_id) -> None:
    """aiperf's default 100 dataset entries: C = 16 drains 2 x 16 = 32 warm-up requests, so
    the measured ones continue at pool index 32 with those 32 prompts cached. The gap-analysis
    vLLM launch keeps prefix caching off (aiconfigurator rules), so the pool costs nothing
    there; an InferenceX row's random prompts are all distinct."""
    case = to_case(by_id[QWEN32_VLLM_GAP])
    wl = case.workload
    assert (wl.shared_prefix_tokens, wl.num_prefixes) == (1024, 100)
    assert (wl.prefix_offset, wl.cached_prefixes) == (32, 32)
    assert [p for p, _ in wl.warm_prefixes()] == list(range(32))
    assert not case.config.prefix_caching
    assert any("prompt pool of 100" in a for a in case.assumptions)
    ix = to_case(by_id[DS_H100_DISAGG]).workload
    assert ix.shared_prefix_tokens == 0


def test_inferencex_sglang_deepseek_prompts_under_the_transformers_5_client(by_id) -> None:
    """SGLang 0.5.10 (transformers 5) DeepSeek rows measured before InferenceX's client fix
    ran prompts 35921 / 7140 times their nominal length on the server (InferenceX PR #937);
    the same rows on SGLang 0.5.9 (transformers 4.57) ran them as nominal."""
    from charon_search.serving.backends import (
        INFERENCEX_V5_PROMPT_INFLATION,
        inferencex_prompt_inflation,
    )

    assert INFERENCEX_V5_PROMPT_INFLATION == 35921 / 7140
    row = by_id["dsr1_b300_sglang_fp4_agg_8192x1024_c8_cfg718"]
    assert row.config["framework_version"] == "0.5.10.post1"
    assert row.extra["measured_date"] == "2026-04-17"
    wl = to_case(row).workload
    # InferenceX's random lengths: uniform over [0.8, 1] x 8192 = 6553..8192 client tokens.
    assert (wl.input_len.low, wl.input_len.high) == (round(6553 * 35921 / 7140),
                                                      round(8192 * 35921 / 7140))
    assert (wl.output_len.low, wl.output_len.high) == (819, 1024)  # outputs as nominal
    assert any("InferenceX PR #937" in n for n in to_case(row).assumptions)
    assert to_case(row).extra["prompt_scale"] == 35921 / 7140  # validate --explain prints it
    old = to_case(by_id["dsr1_b200_sglang_fp4_agg_1024x1024_c16_cfg202"]).workload
    assert (old.input_len.low, old.input_len.high) == (819, 1024)

    def inflated(**kw: str) -> bool:
        facts = dict(backend="sglang", version="0.5.10.post1", model="deepseek-ai/DeepSeek-R1",
                     mode="agg", measured="2026-04-17")
        return inferencex_prompt_inflation(**{**facts, **kw}) is not None

    assert inflated()
    assert inflated(version="nightly-dev-cu13-20260317-1eea7448")  # after 0313-2
    assert not inflated(version="nightly-dev-20260216-d3bae71e")   # transformers 4.57.1
    assert not inflated(version="0.5.9")
    assert not inflated(measured="2026-05-02")  # after the client's fix
    assert not inflated(measured="")            # date unknown
    assert not inflated(model="Qwen/Qwen3.5-397B-A17B")  # not a LlamaTokenizerFast model
    assert not inflated(mode="disagg")          # srt-slurm's own client
    assert not inflated(backend="vllm")         # vLLM's client and server share a loader
