"""Silicon serving rows carry their engine's scheduler facts and the benchmark's protocol into
the serving config (translation only, fast), and a few well-understood rows land within the
serving target (real simulation, marked slow)."""

from __future__ import annotations

import pytest

from charon_search.validation.translate import to_case

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
    # aiperf: 128 streams start together; 2 x 128 warm-up requests are not measured.
    assert wl.concurrency == 128 and wl.ramp_up_s == 0.0
    assert case.extra["warmup_requests"] == 256 and wl.num_requests == 256 + 256
    assert any("mixed chunk off" in a for a in case.assumptions)


def test_vllm_row_runs_decode_first_mixed_batches(by_id) -> None:
    case = to_case(by_id[VLLM_FP8])
    cfg, wl = case.config, case.workload
    assert cfg.prefill_schedule == "mixed" and cfg.max_num_batched_tokens == 8192
    assert cfg.decode_in_budget and cfg.iteration_overhead_s is None
    assert wl.shared_prefix_tokens == 0  # distinct prompts
    assert wl.ramp_up_s == 0.0  # aiperf starts every stream together


def test_trtllm_row_reserves_and_does_not_chunk(by_id) -> None:
    cfg = to_case(by_id[TRTLLM_8B]).config
    assert cfg.kv_admission == "reserve_max" and not cfg.chunked_prefill
    assert cfg.max_num_batched_tokens == 8 + 1024 + 1500
    assert cfg.iteration_overhead_s == 0.0 and cfg.max_num_seqs == 8


#: Well-understood silicon rows: SGLang 0.5.1 runs each closed-loop wave in lock-step (every
#: prompt of the wave prefilled before anyone decodes), so TTFT is half a wave's prefill.
#: Measured TTFT / TPOT and the prediction at 01:35 in the comments.
WITHIN_TARGET = {
    # 786.0 ms / 12.52 ms; predicted 744.1 ms (-5 %) / 11.84 ms (-5 %).
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_sglang_agg_1024x256_c64_tp8_epnone_15": 0.20,
    # 2395.7 ms / 23.65 ms; predicted 2175.2 ms (-9 %) / 22.79 ms (-4 %).
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_sglang_agg_1024x256_c128_tp4_epnone_17": 0.20,
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
