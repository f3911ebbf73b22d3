"""Render a search run's Pareto front as a PNG (matplotlib), e.g. for docs.

Usage: python scripts/pareto_png.py RUN_DIR X_METRIC Y_METRIC TITLE OUT.png
(reads RUN_DIR/trials.parquet and RUN_DIR/pareto.parquet written by `charon-search search`).
"""

import sys

import matplotlib
import pyarrow.parquet as pq

matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = sys.argv[1]
x, y = sys.argv[2], sys.argv[3]
rows = pq.read_table(f"{d}/trials.parquet").to_pylist()
front = pq.read_table(f"{d}/pareto.parquet").to_pylist()
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
ax.set_title(sys.argv[4])
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[5], dpi=110)
print("wrote", sys.argv[5], len(front), "front points")
