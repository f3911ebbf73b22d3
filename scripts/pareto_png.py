"""Render a search run's Pareto front as a PNG (matplotlib), e.g. for docs.

Reads RUN_DIR/trials.parquet and RUN_DIR/pareto.parquet written by `charon-search search`; the
metrics are columns of those files (both axes are drawn as maximized). The README's figure:

    python scripts/pareto_png.py runs/l70 tokens_per_s_per_user tokens_per_s_per_gpu \\
        "Llama-3.1-70B on vLLM, H100/H200, p90 TTFT <= 1 s, TPOT <= 50 ms (150 NSGA-II trials)" \\
        docs/img/llama3-70b-serving-pareto.png
"""

import argparse
import sys
from pathlib import Path

import matplotlib
import pyarrow.parquet as pq

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog=__doc__.split("\n", 2)[2].rstrip() + "\n",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                    help="a `charon-search search --out` directory")
    ap.add_argument("x", metavar="X_METRIC", help="column for the x axis, e.g. "
                    "tokens_per_s_per_user")
    ap.add_argument("y", metavar="Y_METRIC", help="column for the y axis, e.g. "
                    "tokens_per_s_per_gpu")
    ap.add_argument("title", metavar="TITLE", help="the plot's title")
    ap.add_argument("out", type=Path, metavar="OUT.png", help="the PNG to write")
    args = ap.parse_args()
    x, y = args.x, args.y
    for name in ("trials.parquet", "pareto.parquet"):
        if not (args.run_dir / name).is_file():
            ap.error(f"{args.run_dir / name} does not exist (RUN_DIR must be a search's --out)")
    rows = pq.read_table(args.run_dir / "trials.parquet").to_pylist()
    front = pq.read_table(args.run_dir / "pareto.parquet").to_pylist()
    for col in (x, y):
        if front and col not in front[0]:
            ap.error(f"{col!r} is not a column of {args.run_dir / 'pareto.parquet'}; its numeric "
                     "columns: " + ", ".join(sorted(k for k, v in front[0].items()
                                                    if isinstance(v, (int, float)))))
    feas = [r for r in rows if r.get("feasible")]
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.scatter(
        [r[x] for r in feas], [r[y] for r in feas], c="lightgrey", s=12, label="feasible trials"
    )
    fams = sorted({r["family"] for r in front})
    for f in fams:
        rs = [r for r in front if r["family"] == f]
        ax.scatter([r[x] for r in rs], [r[y] for r in rs], s=60, edgecolors="k", label=f)
    line = sorted(front, key=lambda r: r[x])
    ax.plot([r[x] for r in line], [r[y] for r in line], "k:", lw=1)
    for r in front:
        lab = (
            f"{r.get('mode')} "
            + (
                f"tp{r.get('tp')}x{r.get('dp')}"
                if r.get("mode") == "aggregated"
                else f"P{r.get('prefill_replicas')}xTP{r.get('prefill_tp')} "
                f"D{r.get('decode_replicas')}xTP{r.get('decode_tp')}"
            )
            + f" {r.get('num_gpus')}G"
        )
        ax.annotate(lab, (r[x], r[y]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(x + " (maximize)")
    ax.set_ylabel(y + " (maximize)")
    ax.set_title(args.title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print("wrote", args.out, len(front), "front points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
