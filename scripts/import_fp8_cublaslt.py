#!/usr/bin/env python
"""Ship the cuBLASLt / CUTLASS fp8 GEMM time ratio of aiconfigurator-core's measured rows.

Usage::

    python scripts/import_fp8_cublaslt.py [--peers /work/shared/data/peers]
                                          [--out charon_search/data/kernels]

The shipped fp8 GEMM rows (``data/profiles/<gpu>/gemm.parquet``, dtype ``fp8``) are vLLM's
``CutlassFP8ScaledMMLinearKernel``. Training fp8 runs cuBLASLt: Transformer Engine's GEMM
(``transformer_engine/common/gemm/cublaslt_gemm.cu``) and torchao's ``torch._scaled_mm``
(tensorwise: ``at::cuda::blas::scaled_gemm``, a ``cublasLtMatmul``). aiconfigurator-core
0.12.0 (Apache-2.0) also measured TensorRT-LLM's PyTorch-flow ``Linear`` with
``QuantAlgo.FP8`` (``kernel_source`` ``torch_flow``; collector ``collector/trtllm/
collect_gemm.py``), whose per-tensor fp8 path is ``torch.ops.trtllm.cublas_scaled_mm``, i.e.
cuBLASLt, after the same static per-tensor input quantize as the vLLM rows. Both tables time
``m x k`` bf16 input -> cast -> scaled GEMM on the same GPUs, so their ratio at a shape is the
kernel family's difference at that shape (their bf16 rows, ``F.linear`` in both harnesses,
agree to a median 1.01 on H100).

Writes ``fp8_gemm_cublaslt_over_cutlass.csv``: ``gpu, m, n, k, ratio`` for ``m`` in
``M_KEPT`` (training-sized token counts; 1024-32768 are measured) and every measured ``(n, k)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def _version_key(path: Path) -> tuple:
    """A version folder's name as a comparable tuple: 1.3.0rc20 after 1.3.0rc3, 0.24.0 after
    0.9.0, a release after its candidates (numbers compare as numbers, the rest as text)."""
    import re

    parts = tuple((0, int(p)) if p.isdigit() else (1, p)
                  for p in re.findall(r"\d+|[^\d.]+", path.parent.name))
    return parts if any(kind for kind, _ in parts) else (*parts, (2, ""))  # 1.3.0 after 1.3.0rc20

#: aiconfigurator system folder -> shipped GPU key.
GPUS = {"h100_sxm": "h100-sxm-80gb", "h200_sxm": "h200-sxm-141gb"}
M_KEPT = (1024, 2048, 4096, 8192, 16384, 32768)


def _rows(path: Path, dtype: str, source: str) -> pd.Series:
    t = pd.read_parquet(path)
    t = t[(t.gemm_dtype == dtype) & (t.kernel_source == source) & t.m.isin(M_KEPT)]
    return t.groupby(["m", "n", "k"]).latency.median()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default="/work/shared/data/peers")
    ap.add_argument("--out", default=str(REPO / "charon_search" / "data" / "kernels"))
    args = ap.parse_args()
    frames = []
    for folder, key in GPUS.items():
        base = Path(args.peers) / "aiconfigurator-core/systems/data" / folder / "gemm"
        trt = max((base / "trtllm").glob("*/gemm_perf.parquet"), key=_version_key)
        vllm = max((base / "vllm").glob("*/gemm_perf.parquet"), key=_version_key)
        cub = _rows(trt, "fp8", "torch_flow")
        cut = _rows(vllm, "fp8", "CutlassFP8ScaledMMLinearKernel")
        j = pd.concat([cub.rename("cublaslt"), cut.rename("cutlass")], axis=1).dropna()
        j = j[(j.cublaslt > 0) & (j.cutlass > 0)]
        out = (j.cublaslt / j.cutlass).rename("ratio").reset_index()
        out.insert(0, "gpu", key)
        frames.append(out)
        print(f"{key}: {len(out)} shapes ({trt.parent.name} TRT-LLM / {vllm.parent.name} vLLM), "
              f"median ratio {out.ratio.median():.3f}")
    dst = Path(args.out)
    dst.mkdir(parents=True, exist_ok=True)
    df = pd.concat(frames, ignore_index=True)
    df[["m", "n", "k"]] = df[["m", "n", "k"]].astype(int)
    df["ratio"] = df.ratio.round(4)
    df.to_csv(dst / "fp8_gemm_cublaslt_over_cutlass.csv", index=False)


if __name__ == "__main__":
    main()
