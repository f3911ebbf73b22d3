#!/usr/bin/env bash
# One-shot H100 / H200 cross-check for a lent machine (about 2 minutes on either part).
# Run it once on an H100 and once on an H200, from the repository root:
#   OUT=/some/dir bash charon_search/profiling/run_gh100_crosscheck.sh
# The two parts are one GH100 die at 700 W. The shipped GEMM tables (aiconfigurator-core, vLLM
# 0.24.0) agree on bf16 but not on fp8: at large GEMMs the H200 rows are 0.56-0.88x the H100's
# time (docs/calibration/README.md, session 54). This times the same shapes on the part it runs
# on, so the two runs together say whether the die or the H100 measurement differs:
# profiling.shapes.gh100_crosscheck_grid (bf16 F.linear and fp8 torch._scaled_mm at 15 table
# shapes; RMSNorm, add and SiLU-and-mul at decode sizes, by CUDA-graph replay), then check_fp8
# (8192^3 bf16 and fp8 with the SM clock and power read after each, random and zero inputs).
# Writes $OUT/<gpu>/profile_rows.parquet (profile-DB schema), summary.json, calibration.yaml,
# and $OUT/<gpu>/log.txt. Needs python3 with torch (CUDA), pandas, pyarrow, pyyaml.
set -uo pipefail
OUT="${OUT:-/tmp/charon-profile}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$NAME" in
  *H200*) GPU=h200-sxm-141gb ;;
  *H100*) GPU=h100-sxm-80gb ;;
  *) echo "not an H100 or H200: $NAME" >&2; exit 2 ;;
esac
mkdir -p "$OUT/$GPU"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
  time timeout 300 python3 -m charon_search.profiling --gh100-crosscheck --gpu-name "$GPU" \
    --repeats 20 --warmup 5 --out "$OUT/$GPU"
  echo "== fp8 check"; timeout 90 python3 -m charon_search.profiling.check_fp8
} 2>&1 | tee "$OUT/$GPU/log.txt"
