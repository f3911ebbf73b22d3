"""Quick check of the serving simulator on a spread of measured silicon serving rows.

A thin wrapper over ``charon-search validate``: it picks a small spread of aggregated rows of
``silicon_sample.csv`` (measured TTFT/TPOT of vLLM/TRT-LLM deployments on H100/H200; by default
the copy shipped in the package, ``charon_search/data/validation/silicon_sample.csv``) and runs
them through the validation translation (``charon_search.validation.run_validation``), which
applies each row's engine profile (``charon_search.serving.engine_serving_config``: the engine's
scheduler defaults and the cluster spec's calibrated host times), its closed-loop concurrency and
its precision/checkpoint, exactly as ``validate`` does. The printed numbers are therefore the
rows ``charon-search validate --ids <the ids it prints>`` reports; use that command (or
``--kind serving`` for all rows) for anything beyond this spread. Prints each row and the median /
p90 |error| of TTFT and TPOT for all, dense and MoE rows.

    python examples/workloads/silicon_check.py [silicon_sample.csv] [--max-osl 1024] \
        [--workers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics as st

import numpy as np

from charon_search.validation import data_dir, load_files, run_validation, select_records

DEFAULT = data_dir() / "silicon_sample.csv"
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
MOE = ("Qwen3-235B", "gpt-oss")


def pick_ids(path: str, max_osl: int) -> list[str]:
    """Ids of the first rows of each ``PICK`` group (aggregated, no PP, osl <= ``max_osl``)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["mode"] == "agg"]
    out = []
    for key, n in PICK.items():
        cand = [r for r in rows if (r["system"], r["model_path"], r["backend"]) == key
                and int(r["osl"]) <= max_osl and int(r["pp_size"] or 1) == 1]
        out.extend(r["id"] for r in cand[:n])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", default=str(DEFAULT),
                    help="a silicon CSV in aiconfigurator-core's layout (default: the "
                         "shipped one)")
    ap.add_argument("--max-osl", type=int, default=1024,
                    help="only rows with at most this many output tokens (default 1024)")
    ap.add_argument("--workers", type=int, default=0,
                    help="Ray worker actors (0 = in this process), as `validate --workers`")
    ap.add_argument("--json", help="write the validate result (same layout as `validate --json`)")
    args = ap.parse_args()
    ids = pick_ids(args.csv, args.max_osl)
    files = "" if args.csv == str(DEFAULT) else f"{args.csv} "
    print(f"same rows as: charon-search validate {files}--ids {' '.join(ids)}", flush=True)
    records = select_records(load_files([args.csv]), ids=ids)
    res = run_validation(records, workers=args.workers)
    for s in res.skipped:
        print(f"{s['id']}: not expressed: {s['reason']}")
    by_id: dict[str, dict[str, dict]] = {}
    for row in res.rows:
        by_id.setdefault(row["id"], {})[row["metric"]] = row
    errs: dict[str, list[tuple[str, float]]] = {"ttft_s": [], "tpot_s": []}
    for rec in records:
        rows = by_id.get(rec.id)
        if not rows:
            continue
        parts = []
        for metric, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT")):
            if metric in rows:
                r = rows[metric]
                errs[metric].append((rec.model["name"], r["error"]))
                parts.append(f"{label} {1e3 * r['measured']:8.2f} -> {1e3 * r['predicted']:8.2f} "
                             f"ms ({r['error']:+.0%})")
        c = rec.config
        print(f"{rec.id}\n    {rec.hardware.get('gpu')!s:9s} {rec.model['name'][-28:]:28s} "
              f"{c.get('framework')!s:6s} isl={c.get('input_len'):5d} "
              f"osl={c.get('output_len'):5d} conc={c.get('concurrency')!s:>4s} | "
              + " | ".join(parts), flush=True)
    for label, keep in (("all", lambda m: True), ("dense", lambda m: not any(x in m for x in MOE)),
                        ("moe", lambda m: any(x in m for x in MOE))):
        e1 = [abs(e) for m, e in errs["ttft_s"] if keep(m)]
        e2 = [abs(e) for m, e in errs["tpot_s"] if keep(m)]
        if e1 and e2:
            print(f"{label:5s} n={len(e1):2d} | TTFT |err| median {st.median(e1):.1%} "
                  f"p90 {np.percentile(e1, 90):.1%} | TPOT |err| median {st.median(e2):.1%} "
                  f"p90 {np.percentile(e2, 90):.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res.to_json(), f, indent=1)


if __name__ == "__main__":
    main()
