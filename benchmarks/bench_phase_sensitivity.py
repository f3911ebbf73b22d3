"""How much a fixed-length closed loop's predicted TTFT depends on client timing.

A silicon benchmark drives the engine with C streams, each sending its next request as soon as
the previous response ends. With every prompt and output of the same length (aiconfigurator's
aiperf rows) a deterministic simulation settles into one of several phase patterns (streams
in lock-step waves, or evenly staggered, or in clumps), and which one it settles into depends
on delays of a few milliseconds that no row states: the client's turnaround between a response
and its next request, the front end's hand-over. This script re-simulates shipped silicon rows
(``charon_search/data/validation``) with an exponential client turnaround of mean ``J``
(``WorkloadSpec.think_time_s``: the pause is not part of TTFT, only of when the request
arrives) and prints predicted TTFT / TPOT per ``J`` next to the measured values.

It is the measurement behind the accuracy notes on phase sensitivity: a mean turnaround of
20 ms moves the TensorRT-LLM gap-analysis rows' TTFT towards the measurement but the vLLM
ones away from it, so no single client turnaround is shipped (see
``docs/calibration/README.md``). Rows whose benchmark draws random lengths (InferenceX,
``range_ratio`` 0.8) are the control: their phases mix by themselves.

    python benchmarks/bench_phase_sensitivity.py [--turnaround-ms 0 2 5 20 50] [--json out.json]

Prints one JSON object on the last line: ``{"rows": [{"id", "measured", "predicted":
{J_ms: {"ttft_s", "tpot_s"}}}], "wall_s"}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import warnings

warnings.simplefilter("ignore", UserWarning)

from charon_search.validation import default_files, load_files, to_case  # noqa: E402
from charon_search.validation.predict import predict_case  # noqa: E402
from charon_search.validation.translate import ServingCase  # noqa: E402

#: One row per engine and pipeline, low to moderate concurrency (ids of silicon_sample.csv).
ROWS = (
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_trtllm_agg_4096x128_c16_tp8_epnone_147",
    "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_"
    "1024x512_c8_tp4_epnone_90",
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_sglang_agg_1024x256_c16_tp4_epnone_11",
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c32_tp4_epnone_8",
    "2026_04_06_gpt_oss_120b_h200_sxm_trtllm_fp4_agg_1024x1024_c64_tp8_ep1_275",
)


def _ms(pair: dict[str, float]) -> str:
    """``TTFT/TPOT`` in milliseconds."""
    return f"{pair['ttft_s'] * 1e3:.1f}/{pair['tpot_s'] * 1e3:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turnaround-ms", type=float, nargs="+", default=[0.0, 2.0, 5.0, 20.0, 50.0],
                    help="mean client turnaround(s) to simulate, milliseconds")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    if any(j < 0 for j in args.turnaround_ms):
        ap.error("--turnaround-ms must be >= 0")
    t0 = time.perf_counter()
    records = {r.id: r for r in load_files(default_files()) if r.id in ROWS}
    out = []
    header = "  ".join(f"J={j:g}ms".rjust(15) for j in args.turnaround_ms)
    print(f"{'row':<60} {'measured':>15}  {header}   (TTFT ms / TPOT ms)")
    for rid in ROWS:
        case = to_case(records[rid])
        assert isinstance(case, ServingCase), rid
        measured = {m: float(v) for m, v in records[rid].measured.items()}
        pred = {}
        for j in args.turnaround_ms:
            # Scored as `validate` scores the row (warm-up left out, measured-turn weights).
            res = predict_case(dataclasses.replace(
                case, workload=dataclasses.replace(case.workload, think_time_s=j / 1e3)))
            pred[f"{j:g}"] = {m: res.predicted[m] for m in ("ttft_s", "tpot_s")}
        out.append({"id": rid, "measured": measured, "predicted": pred})
        cells = "  ".join(_ms(p).rjust(15) for p in pred.values())
        print(f"{rid[-60:]:<60} {_ms(measured):>15}  {cells}", flush=True)
    result = {"rows": out, "wall_s": round(time.perf_counter() - t0, 1)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
