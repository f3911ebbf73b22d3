"""gpt-oss-120b H200 silicon rows priced with the measured W4A16-MXFP4 MoE kernels.

Before the quantized MoE rows were imported, the experts were priced by the bf16 fused-MoE
model at 0.5 bytes per weight, about 2x too fast at prefill sizes (aiconfigurator H200
vLLM 0.24 W4A16 MXFP4, gpt-oss shape, 1024 tokens: 1.34 ms measured vs 0.49 ms priced), and
attention was priced as fp4 although the checkpoint keeps it bf16. Session 3 A/B on the
same tree (``charon-search validate --kind serving --ids <row>``):

* TensorRT-LLM TP1 C4 8192/1024 (``..._288``), measured 297.9 ms / 7.65 ms: predicted
  182.8 ms / 5.54 ms before (-38.6 % / -27.5 %), 298.4 ms / 7.76 ms after (+0.2 % / +1.5 %).
* vLLM TP1 C4 1024/1024 (``..._356``), measured 85.7 ms / 6.33 ms: predicted 28.7 ms /
  5.02 ms before (-66.5 % / -20.7 %), 58.1 ms / 6.72 ms after (-32.3 % / +6.1 %).

Session 7: InferenceX's vLLM gpt-oss recipes export ``VLLM_MXFP4_USE_MARLIN=1``, so their
experts run the Marlin MoE kernel (``serving.backends._inferencex_vllm``), priced from the
pooled Marlin rows: the same row is 84.4 ms / 5.90 ms (-1.5 % / -6.9 %). Over the 80 vLLM
gpt-oss H100/H200 rows, TTFT median |err| 31.2 -> 20.4 %, TPOT 10.1 -> 6.6 %.
"""

from __future__ import annotations

import pytest

from charon_search.validation import default_files, load_files, run_validation, select_records

pytestmark = [pytest.mark.validation, pytest.mark.slow]

TRT_ROW = "2026_04_06_gpt_oss_120b_h200_sxm_trtllm_fp4_agg_8192x1024_c4_tp1_ep1_288"
VLLM_ROW = "2026_04_06_gpt_oss_120b_h200_sxm_vllm_fp4_agg_1024x1024_c4_tp1_ep1_356"


@pytest.fixture(scope="module")
def errors():
    records = load_files(default_files())
    res = run_validation(select_records(records, ids=[TRT_ROW, VLLM_ROW]))
    assert not res.skipped, res.skipped
    return {(r["id"], r["metric"]): r["error"] for r in res.rows}


def test_trtllm_gpt_oss_row_within_target(errors):
    # Issue 8 target: |err| <= 20 % (p90 bound) for TTFT and TPOT.
    assert abs(errors[(TRT_ROW, "ttft_s")]) <= 0.20, errors
    assert abs(errors[(TRT_ROW, "tpot_s")]) <= 0.20, errors


def test_vllm_gpt_oss_row_within_target(errors):
    # Was -66.5 % (bf16 model), then -32.3 % (OpenAI Triton rows) before the recipe's Marlin
    # (-2.3 %). Session 33: +15.6 % TTFT (99.2 ms) once vLLM's own server takes its calibrated
    # 10 ms + 4 us per prompt token (docs/calibration/serving-frontend-vllm.yaml), which lowers
    # the 161 H200 vLLM InferenceX TTFT metrics' median |error| from 19.2 to 10.5 % but
    # overshoots this row; the bound is the target, as for the TensorRT-LLM row.
    # Session 42: TPOT -8.9 -> -12.0 % (5.57 ms against 6.33 ms) once the MoE's routing and
    # top-k sum are priced inside the measured fused-MoE op instead of again beside it
    # (``serving._fusion._absorb_moe_routing``); the per-row bound is the p90 target, as for
    # TTFT and the TensorRT-LLM row.
    assert abs(errors[(VLLM_ROW, "ttft_s")]) <= 0.20, errors
    assert abs(errors[(VLLM_ROW, "tpot_s")]) <= 0.20, errors
