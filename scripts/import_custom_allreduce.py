#!/usr/bin/env python
"""Ship the serving engines' measured custom all-reduce latency (``serving.custom_allreduce``).

Usage::

    python scripts/import_custom_allreduce.py [--peers /work/shared/data/peers]
        [--out charon_search/data/serving/custom_allreduce.csv]

Source: aiconfigurator-core 0.12.0 (Apache-2.0; NVIDIA)
``systems/data/<system>/comm/<engine>/<version>/custom_allreduce_perf.parquet``: bf16
all-reduces of ``message_size`` **elements** over ``num_gpus`` NVLink peers, ``latency`` in
**milliseconds**. Most vLLM and SGLang tables time a CUDA-graph and an eager launch of each
shape; the minimum over a shape's rows is kept (the graph-replayed one, except at 16 MiB on 4
and 8 Blackwell GPUs under SGLang 0.5.9, where eager is 3-6 % faster). One version per
(system, engine): the oldest folder aiconfigurator measured (PEP 440 order), the rule behind
the Hopper rows (TRT-LLM 1.2.0rc5, vLLM 0.14.0, SGLang 0.5.6.post2); most silicon rows ran
engines of that age or older. Output rows: ``gpu, framework, version, num_gpus, bytes,
latency_s`` (bytes = elements x 2; seconds rounded to the nanosecond), by engine, system,
group size and size.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import pandas as pd
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from charon_search.cost.profile_db import normalize_gpu  # noqa: E402

#: aiconfigurator system folders with NVLink custom all-reduce tables of datacenter GPUs.
SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300")
ENGINES = ("trtllm", "vllm", "sglang")
BF16_BYTES = 2


def oldest_version(data: Path, system: str, engine: str) -> str | None:
    """The oldest version folder of ``engine``'s custom all-reduce table on ``system``."""
    found = [p.parent.name for p in (data / system / "comm" / engine).glob(
        "*/custom_allreduce_perf.parquet")]
    return min(found, key=Version) if found else None


def convert(path: Path, gpu: str, engine: str, version: str) -> list[tuple]:
    """One table -> ``(gpu, framework, version, num_gpus, bytes, latency_s)`` rows."""
    t = pd.read_parquet(path)
    t = t[t.allreduce_dtype == "bfloat16"]
    best = t.groupby(["num_gpus", "message_size"]).latency.min().sort_index()
    return [(gpu, engine, version, int(n), int(m) * BF16_BYTES, round(float(ms) * 1e-3, 9))
            for (n, m), ms in best.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default=str(REPO.parent / "shared" / "data" / "peers"))
    ap.add_argument("--out", default=str(REPO / "charon_search" / "data" / "serving"
                                         / "custom_allreduce.csv"))
    args = ap.parse_args(argv)
    data = Path(args.peers) / "aiconfigurator-core" / "systems" / "data"
    rows: list[tuple] = []
    versions: dict[str, list[str]] = {}
    for engine in ENGINES:
        for system in SYSTEMS:
            version = oldest_version(data, system, engine)
            if version is None:
                continue
            gpu = normalize_gpu(system)
            assert gpu is not None, system
            rows += convert(data / system / "comm" / engine / version
                            / "custom_allreduce_perf.parquet", gpu, engine, version)
            versions.setdefault(system, []).append(f"{engine}/{version}")
    with open(args.out, "w", newline="") as f:
        f.write("# Custom (one-/two-shot NVLink) all-reduce latency of bf16 tensors inside one "
                "node, as the serving\n# engines run it, measured by aiconfigurator-core 0.12.0 "
                "(Apache-2.0; NVIDIA), written by\n# scripts/import_custom_allreduce.py from "
                "systems/data/<system>/comm/<engine>/<version>/custom_allreduce_perf.parquet,\n"
                "# the oldest version per (system, engine):\n")
        for system, found in versions.items():
            f.write(f"#   {system}: {', '.join(found)}\n")
        f.write("# converted: message_size (bf16 elements) x 2 -> bytes, latency ms -> s; min "
                "over duplicate rows.\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(("gpu", "framework", "version", "num_gpus", "bytes", "latency_s"))
        w.writerows(rows)
    print(f"{args.out}: {len(rows)} rows from {sum(map(len, versions.values()))} tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
