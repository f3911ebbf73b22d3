"""Derive the shipped request trace from vidur's processed Splitwise conversation trace.

Source: microsoft/vidur @7d47513 (MIT), data/processed_traces/splitwise_conv.csv, itself from
the Azure LLM inference trace 2023 (Splitwise, Patel et al. ISCA 2024). We keep the first
2,000 requests in arrival order, rebase arrival times to 0 and rename the columns to the
charon-search trace schema (arrived_at, prompt_tokens, output_tokens).

Run from the repository root, with the CSV of a checkout of microsoft/vidur (it overwrites the
shipped trace, which it reproduces byte for byte):
    python examples/workloads/make_splitwise_trace.py \
        ../vidur/data/processed_traces/splitwise_conv.csv
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

OUT = Path("charon_search/data/traces/splitwise_conv_2k.csv")
NUM = 2000


def main(src: str) -> None:
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))[:NUM]
    t0 = float(rows[0]["arrived_at"])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrived_at", "prompt_tokens", "output_tokens"])
        for r in rows:
            w.writerow([f"{float(r['arrived_at']) - t0:.6f}", int(r["num_prefill_tokens"]),
                        int(r["num_decode_tokens"])])
    print(f"wrote {OUT} ({len(rows)} requests)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python examples/workloads/make_splitwise_trace.py "
              "VIDUR/data/processed_traces/splitwise_conv.csv", file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
