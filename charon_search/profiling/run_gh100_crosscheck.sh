#!/usr/bin/env bash
# One-shot H100 / H200 cross-check for a lent machine (about 2-3 minutes on either part).
# Run it once on an H100 and once on an H200, from the repository root:
#   OUT=/some/dir bash charon_search/profiling/run_gh100_crosscheck.sh
# The two parts are one GH100 die at 700 W. The shipped GEMM tables (aiconfigurator-core, vLLM
# 0.24.0) agree on bf16 but not on fp8: at large GEMMs the H200 rows are 0.56-0.88x the H100's
# time (docs/calibration/README.md, session 54). This times the same shapes on the part it runs
# on, so the two runs together say whether the die or the H100 measurement differs:
# profiling.shapes.gh100_crosscheck_grid (bf16 F.linear and fp8 torch._scaled_mm at 15 table
# shapes; RMSNorm, add and SiLU-and-mul at decode sizes, by CUDA-graph replay), then check_fp8
# (8192^3 bf16 and fp8 rates, random and zero inputs), with the SM clock and power sampled
# every 500 ms throughout ($OUT/smi.csv).
# = run_device.sh with PARTS="crosscheck fp8check": the GPU key comes from the detected device
# (exact "NVIDIA H100 80GB HBM3" or "NVIDIA H200"; anything else is refused), each part runs
# under a `timeout`, results go to $OUT/results.tgz and $OUT/log.txt; exit codes as there.
set -uo pipefail
export OUT="${OUT:-/tmp/charon-profile}" PARTS="${PARTS:-crosscheck fp8check}"
exec bash "$(dirname "$0")/run_device.sh"
