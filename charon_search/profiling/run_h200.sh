#!/usr/bin/env bash
# One-shot profiling run for a lent single-H200 machine (a few minutes).
# Run from the repository root:  OUT=/some/dir bash charon_search/profiling/run_h200.sh
# Writes $OUT/profile_rows.parquet (profile-DB schema), $OUT/calibration.yaml,
# $OUT/summary.json and $OUT/log.txt. Needs python3 with torch (CUDA), pandas, pyarrow, pyyaml.
set -euo pipefail
OUT="${OUT:-/tmp/charon-profile}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
  # Traced shapes of Llama-3.1-8B (prefill b1 s4096 and b4 s1024; decode b64 at 4k context),
  # Qwen3-30B-A3B (MoE) at prefill 1x2048, plus the standard grid that matches the shipped DB,
  # NCCL collectives when more than one GPU is visible, and the overlap slowdown.
  time python3 -m charon_search.profiling --model llama-3.1-8b --model qwen3-30b-a3b \
    --phase prefill --points 1x4096,4x1024,1x2048 --grid --collectives --overlap \
    --gpu-name h200-sxm-141gb --repeats 10 --warmup 3 --out "$OUT"
  python3 -m charon_search.profiling --model llama-3.1-8b --phase decode --points 64x1:4096 \
    --gpu-name h200-sxm-141gb --repeats 10 --warmup 3 --out "$OUT/decode"
} 2>&1 | tee "$OUT/log.txt"
