#!/usr/bin/env bash
# Training-kernel profiling on a lent single H200; refuses any other GPU.
# Run from the repository root:  OUT=/some/dir bash charon_search/profiling/run_h200_training.sh
# = run_device.sh with the training parts: training attention forward and backward with
# PyTorch SDPA's cuDNN and FlashAttention-2 (flash) backends at head dims 128, 112, 192/128
# (MLA), 64, 256 and 96, the fp8 vs bf16 GEMM check, bf16 vs fp8 torch._scaled_mm GEMMs at TP8
# Llama-3.1 8B/70B training shapes and, with torchao installed, whole fp8 linears. Each part
# runs under its own `timeout` and all under run_device.sh's 540 s deadline: the full list
# takes longer (the 2026-11-30 session needed two calls), so parts the deadline reaches are
# skipped (exit 1) and run in a second call with PARTS naming them, e.g.
#   PARTS="attn-cudnn-d256 attn-flash-d256 attn-cudnn-d96 attn-flash-d96 fp8-gemm fp8-linear"
# Results: $OUT/results.tgz (one folder per part; profile_rows.jsonl, summary.json and, for
# attention, train_attention.parquet: the format sim.train_attention reads; merge runs with
# `python -m charon_search.profiling.merge_train_attention`) and $OUT/log.txt.
set -uo pipefail
export OUT="${OUT:-/tmp/charon-profile}" EXPECT_GPU="${EXPECT_GPU:-h200-sxm-141gb}"
export PARTS="${PARTS:-attn-cudnn-d128 attn-flash-d128 fp8check attn-flash-d112 attn-cudnn-d112 attn-cudnn-d192v128 attn-cudnn-d64 attn-flash-d64 attn-cudnn-d256 attn-flash-d256 attn-cudnn-d96 attn-flash-d96 fp8-gemm fp8-linear}"
exec bash "$(dirname "$0")/run_device.sh"
