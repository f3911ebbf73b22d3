#!/usr/bin/env bash
# One-shot training-kernel profiling run for a lent single-H200 machine (about 8 minutes).
# Run from the repository root:  OUT=/some/dir bash charon_search/profiling/run_h200_training.sh
# Times training attention forward and backward with PyTorch SDPA's cuDNN and FlashAttention-2
# (flash) backends at head dims 128, 112, 192/128 (MLA), 64, 256 and 96, checks fp8 vs bf16 GEMM speed,
# times bf16 vs fp8 torch._scaled_mm GEMMs at TP8 Llama-3.1 8B/70B training shapes and, with
# torchao installed, whole fp8 linears (forward + backward, casts included).
# Writes $OUT/log.txt and $OUT/results.tgz (one folder per run, each with profile_rows.parquet
# in the profile-DB schema, summary.json, calibration.yaml).
set -uo pipefail
OUT="${OUT:-/tmp/charon-profile}"
WORK="$(mktemp -d)"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
prof() {  # name, then profile arguments
  local name=$1; shift
  echo "== $name"
  timeout 150 python3 -m charon_search.profiling --eager --gpu-name h200-sxm-141gb \
    --repeats 10 --warmup 3 --out "$WORK/$name" "$@"
}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'cudnn', torch.backends.cudnn.version())"
  prof attn-cudnn-d128 --train-attention --sdpa-backend cudnn --head-dim 128
  prof attn-flash-d128 --train-attention --sdpa-backend flash --head-dim 128
  echo "== fp8 check"; timeout 60 python3 -m charon_search.profiling.check_fp8
  prof attn-flash-d112 --train-attention --sdpa-backend flash --head-dim 112
  prof attn-cudnn-d112 --train-attention --sdpa-backend cudnn --head-dim 112
  prof attn-cudnn-d192v128 --train-attention --sdpa-backend cudnn --head-dim 192 --v-head-dim 128
  prof attn-cudnn-d64 --train-attention --sdpa-backend cudnn --head-dim 64
  prof attn-flash-d64 --train-attention --sdpa-backend flash --head-dim 64
  for d in 256 96; do
    prof attn-cudnn-d$d --train-attention --sdpa-backend cudnn --head-dim $d
    prof attn-flash-d$d --train-attention --sdpa-backend flash --head-dim $d
  done
  prof fp8-gemm --fp8-gemm
  # torchao's Float8Linear under torch.compile (needs torchao: carry its wheel, see the device
  # tool's notes; the 2026-11-30 run used torchao 0.18.0)
  if python3 -c "import torchao" 2>/dev/null; then
    echo "== fp8 linears (torchao)"
    timeout 330 python3 -m charon_search.profiling.fp8_linear --out "$WORK/fp8_linear.jsonl"
  fi
  for f in "$WORK"/*/summary.json; do echo "-- $f"; grep -A3 '"errors"' "$f" | head -c 1500; done
} 2>&1 | tee "$OUT/log.txt"
tar czf "$OUT/results.tgz" -C "$WORK" .
