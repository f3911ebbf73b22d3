#!/usr/bin/env bash
# Serving-shape profiling run on a lent single H200 (a few minutes); refuses any other GPU.
# Run from the repository root:  OUT=/some/dir bash charon_search/profiling/run_h200.sh
# = run_device.sh with PARTS=serving: the traced shapes of Llama-3.1-8B and Qwen3-30B-A3B
# (prefill 1x4096, 4x1024, 1x2048), the standard grid, NCCL collectives when more than one GPU
# is visible, the overlap slowdown (part `grid`), then Llama-3.1-8B decode at 64x1:4096 (part
# `decode`, under its own short limit: it hung once). Each part under a `timeout`, all under
# a 540 s deadline, results in $OUT/results.tgz (written as parts finish) and $OUT/log.txt;
# exit codes as run_device.sh. Needs python3 with torch (CUDA), pandas, pyarrow, pyyaml.
set -uo pipefail
export OUT="${OUT:-/tmp/charon-profile}" EXPECT_GPU="${EXPECT_GPU:-h200-sxm-141gb}"
export PARTS="${PARTS:-serving}"
exec bash "$(dirname "$0")/run_device.sh"
