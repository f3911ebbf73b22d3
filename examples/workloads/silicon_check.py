"""Sanity check of the serving simulator against measured silicon serving rows.

Reads aiconfigurator-core ``systems/silicon_sample.csv`` (measured TTFT/TPOT of vLLM/TRT-LLM
deployments; see /work/shared/data/peers/SOURCES.md) -- an import-time input, never read by the
package -- and simulates a spread of aggregated rows in closed loop (concurrency = the row's
``batch_size``, ``isl``/``osl`` fixed, 4 x concurrency requests, the first ``concurrency``
requests dropped as warm-up). The closed loop starts in steady state (first wave staggered over
one expected request lifetime, the simulator's default); ``--waves`` starts it all at once
instead. Nothing is calibrated per row. Prints median / p90 |error| for all, dense and MoE rows.

    python examples/workloads/silicon_check.py [silicon_sample.csv] [--waves] [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import time

from charon_search.serving import LengthDistribution, ServingConfig, WorkloadSpec, simulate_serving

DEFAULT = "/work/shared/data/peers/aiconfigurator-core/systems/silicon_sample.csv"
MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
}
CLUSTERS = {"h100_sxm": "h100-sxm-8gpu", "h200_sxm": "h200-sxm-8gpu"}
#: (system, model_path, backend) -> how many rows to take (the first ones in file order).
PICK = {
    ("h100_sxm", "meta-llama/Llama-3.1-8B-Instruct", "trtllm"): 3,
    ("h200_sxm", "nvidia/Llama-3.1-8B-Instruct-FP8", "vllm"): 3,
    ("h100_sxm", "meta-llama/Llama-3.1-70B", "vllm"): 3,
    ("h200_sxm", "meta-llama/Llama-3.1-70B", "vllm"): 3,
    ("h100_sxm", "Qwen/Qwen3-32B", "vllm"): 3,
    ("h200_sxm", "Qwen/Qwen3-235B-A22B-FP8", "vllm"): 2,
    ("h100_sxm", "openai/gpt-oss-120b", "vllm"): 2,
}


def pick_rows(path: str, max_osl: int) -> list[dict]:
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["mode"] == "agg"]
    out = []
    for key, n in PICK.items():
        cand = [r for r in rows if (r["system"], r["model_path"], r["backend"]) == key
                and int(r["osl"]) <= max_osl and int(r["pp_size"] or 1) == 1]
        out.extend(cand[:n])
    return out


def simulate_row(r: dict, ramp_up_s: float | None = None, fused: bool = True) -> dict:
    bs = int(r["batch_size"])
    tp = int(r["tp_size"])
    ep = int(r["moe_ep_size"] or 1)
    precision = {"": "bf16", "fp8": "fp8", "fp4": "fp4"}.get(r["precision"], "bf16")
    cfg = ServingConfig(tp=tp, ep=ep, precision=precision, max_num_seqs=max(bs, 1),
                        max_num_batched_tokens=8192, fused_kernels=fused)
    wl = WorkloadSpec(arrival="concurrency", concurrency=bs, num_requests=4 * bs,
                      input_len=LengthDistribution(value=int(r["isl"])),
                      output_len=LengthDistribution(value=int(r["osl"])), ramp_up_s=ramp_up_s)
    t0 = time.perf_counter()
    rep = simulate_serving(MODELS[r["model_path"]], CLUSTERS[r["system"]], cfg, wl,
                           keep_requests=True)
    # Steady state: drop the first wave (the `bs` requests issued together at t = 0), as a
    # benchmark's warm-up does.
    pr = rep.per_request
    keep = [i for i, rid in enumerate(pr["request_id"]) if rid >= bs]
    ttft_ms = 1e3 * sum(pr["ttft_s"][i] for i in keep) / len(keep)
    tpot_ms = 1e3 * sum(pr["tpot_s"][i] for i in keep) / len(keep)
    meas_ttft, meas_tpot = float(r["silicon_ttft_ms"]), float(r["silicon_tpot_ms"])
    return {
        "id": r["id"], "system": r["system"], "model": r["model_path"], "backend": r["backend"],
        "precision": precision, "isl": int(r["isl"]), "osl": int(r["osl"]), "batch_size": bs,
        "tp": tp, "ep": ep, "measured_ttft_ms": meas_ttft, "predicted_ttft_ms": ttft_ms,
        "ttft_err": ttft_ms / meas_ttft - 1, "measured_tpot_ms": meas_tpot,
        "predicted_tpot_ms": tpot_ms, "tpot_err": tpot_ms / meas_tpot - 1,
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?", default=DEFAULT)
    ap.add_argument("--max-osl", type=int, default=1024)
    ap.add_argument("--json")
    ap.add_argument("--unfused", action="store_true",
                    help="cost one kernel per traced op (ServingConfig.fused_kernels=False)")
    ap.add_argument("--waves", action="store_true",
                    help="start the closed loop's first wave at once (ramp_up_s=0) instead of "
                         "staggered over one request lifetime (the default)")
    args = ap.parse_args()
    results = []
    for r in pick_rows(args.csv, args.max_osl):
        try:
            res = simulate_row(r, 0.0 if args.waves else None, not args.unfused)
        except Exception as e:  # report and continue: this is a sanity sweep
            print(f"{r['id']}: failed: {type(e).__name__}: {e}", flush=True)
            continue
        results.append(res)
        print(f"{res['system']:9s} {res['model'][-28:]:28s} {res['backend']:6s} "
              f"{res['precision']:4s} isl={res['isl']:5d} osl={res['osl']:5d} "
              f"bs={res['batch_size']:3d} tp={res['tp']} | TTFT {res['measured_ttft_ms']:8.1f} "
              f"-> {res['predicted_ttft_ms']:8.1f} ms ({res['ttft_err']:+.0%}) | TPOT "
              f"{res['measured_tpot_ms']:6.2f} -> {res['predicted_tpot_ms']:6.2f} ms "
              f"({res['tpot_err']:+.0%}) [{res['wall_s']:.1f}s]", flush=True)
    if results:
        import statistics as st

        import numpy as np

        moe = ("Qwen3-235B", "gpt-oss")
        for label, sel in (("all", results),
                           ("dense", [x for x in results if not any(m in x["model"]
                                                                   for m in moe)]),
                           ("moe", [x for x in results if any(m in x["model"] for m in moe)])):
            if not sel:
                continue
            e1 = np.abs([x["ttft_err"] for x in sel])
            e2 = np.abs([x["tpot_err"] for x in sel])
            print(f"{label:5s} n={len(sel):2d} | TTFT |err| median {st.median(e1):.1%} "
                  f"p90 {np.percentile(e1, 90):.1%} | TPOT |err| median {st.median(e2):.1%} "
                  f"p90 {np.percentile(e2, 90):.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
