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


def _errors(shipped_records, rid):
    res = run_validation(select_records(shipped_records, ids=[rid]))
    assert not res.skipped, res.skipped
    return {r["metric"]: r["error"] for r in res.rows}


def test_sc21_7_5b_hardware_tflops(shipped_records):
    # SC21 Table 1: GPT-7.5B, 128 A100, TP 4, DP 32, 142 TFLOP/s per GPU (46 % of peak).
    err = _errors(shipped_records, "megatron_sc21_t1_7.5b")
    assert abs(err["hardware_tflops_per_gpu"]) <= 0.10, err


def test_torchtitan_llama3_8b_h200_throughput(shipped_records):
    # torchtitan benchmark (Trainy, June 2025): Llama 3.1 8B, 32 H200, FSDP, 10,938 TPS/GPU.
    err = _errors(shipped_records, "torchtitan_trainy_h200_8b_4nodes")
    assert abs(err["tokens_per_s_per_gpu"]) <= 0.10, err


@pytest.mark.xfail(strict=True, reason=(
    "serving simulator at 22:40: TTFT +12.8 %, TPOT +36.6 % on this row (target |err| <= 20 %)"))
def test_h100_llama3_8b_silicon_row(shipped_records):
    # aiconfigurator silicon row: TRT-LLM, H100, TP1, concurrency 8, 1024/128 tokens:
    # TTFT 190.95 ms, TPOT 7.94 ms.
    err = _errors(shipped_records, H100_8B_ROW)
    assert abs(err["ttft_s"]) <= 0.20 and abs(err["tpot_s"]) <= 0.20, err
