"""fp8 GEMM kernel family: cuBLASLt time from the shipped CUTLASS rows.

The shipped fp8 GEMM rows are vLLM's ``CutlassFP8ScaledMMLinearKernel``; training fp8 runs
cuBLASLt (Transformer Engine's GEMM, torchao's ``torch._scaled_mm``). aiconfigurator-core
measured both families on H100 and H200 with the same bf16-input, static-cast harness
(``data/kernels/README.md``, ``scripts/import_fp8_cublaslt.py``); ``cublaslt_over_cutlass``
returns their time ratio at the nearest measured shape (log distance over ``m``, ``n``, ``k``;
``m`` clipped to the measured 1,024-32,768), ``None`` for GPUs without both tables.
"""

from __future__ import annotations

import csv
import math
from functools import lru_cache
from importlib import resources

import numpy as np

from charon_search.layout import FP8_GEMM_KERNELS

__all__ = ["FP8_GEMM_KERNELS", "cublaslt_over_cutlass", "cublaslt_ratio_table"]

_FILE = "fp8_gemm_cublaslt_over_cutlass.csv"


@lru_cache(maxsize=1)
def cublaslt_ratio_table() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{gpu key: (log2 [m, n, k] rows, ratio)}`` of the shipped CSV."""
    path = resources.files("charon_search") / "data" / "kernels" / _FILE
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    with path.open() as f:
        for r in csv.DictReader(f):
            rows.setdefault(r["gpu"], []).append(
                (float(r["m"]), float(r["n"]), float(r["k"]), float(r["ratio"])))
    out = {}
    for gpu, rs in rows.items():
        a = np.array(rs, dtype=float)
        out[gpu] = (np.log2(a[:, :3]), a[:, 3])
    return out


@lru_cache(maxsize=65536)
def cublaslt_over_cutlass(gpu_key: str, m: float, n: float, k: float) -> float | None:
    """cuBLASLt / CUTLASS fp8 GEMM time at the nearest measured shape, or ``None``."""
    table = cublaslt_ratio_table().get(gpu_key)
    if table is None or min(m, n, k) <= 0:
        return None
    logs, ratio = table
    lo, hi = logs[:, 0].min(), logs[:, 0].max()
    q = np.array([min(max(math.log2(m), lo), hi), math.log2(n), math.log2(k)])
    i = int(np.argmin(((logs - q) ** 2).sum(axis=1)))
    return float(ratio[i])
