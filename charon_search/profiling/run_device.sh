#!/usr/bin/env bash
# The one prepared profiling command for a lent H100 / H200 (the device tool's `run`).
# From the repository root (on the device machine, $OUT is set by the tool):
#   bash charon_search/profiling/run_device.sh                      # PARTS="crosscheck fp8check serving"
#   PARTS=training bash charon_search/profiling/run_device.sh       # training kernels
#   EXPECT_GPU=h200-sxm-141gb PARTS=... bash charon_search/profiling/run_device.sh
# Device tool call: command "bash charon_search/profiling/run_device.sh", timeout_s 600
# (the docs: charon_search/data/profiles/measured/README.md, "Running on a lent GPU").
#
# What it does:
# * checks torch CUDA and the GPU (profiling.device: exact names only) and derives the
#   profile-DB key from it; EXPECT_GPU set and another GPU found: exit 2, nothing run;
# * samples SM clock, power, temperature and throttle reasons every 500 ms during the run
#   ($OUT/smi.csv);
# * runs each part of PARTS under its own `timeout` (capped by PART_LIMIT_S) and an overall
#   deadline (BUDGET_S, default 540 s: below the tool's 600 s per command); a part that
#   would start with under MIN_PART_S seconds left is skipped;
# * each part writes straight into $OUT/<part>/ as it measures (charon-search profile flushes
#   every shape), and once it ends its folder is packed into $OUT/results.tgz (rewritten
#   atomically), so at any moment $OUT holds at most log.txt, smi.csv, results.tgz and one
#   part's folder: <= 8 files, within what the tool brings back.
# Exit: 0 every part ran; 1 some part failed, timed out or was skipped (the others' rows are
# in results.tgz); 2 wrong or unknown GPU; 3 no usable CUDA torch, or nothing was measured.
#
# Parts (PARTS: names or groups, space separated, run in order):
#   crosscheck   H100 / H200 cross-check grid (profiling.gh100_crosscheck_grid), graph replay
#   fp8check     8192^3 bf16 vs fp8 GEMM rate (profiling.check_fp8)
#   grid         Llama-3.1-8B + Qwen3-30B-A3B prefill shapes, the standard grid, overlap
#   decode       Llama-3.1-8B decode 64x1:4096 (hung once on record: a short limit)
#   attn-<backend>-d<D>[v<DV>]   --train-attention, SDPA backend cudnn|flash|efficient,
#                head dim D (and MLA value head dim DV), eager
#   fp8-gemm     bf16 vs fp8 _scaled_mm at TP8 training GEMMs
#   fp8-linear   torchao fp8 linears (needs torchao: carry its wheel; skipped without)
#   groups: serving = grid decode; crosscheck-all = crosscheck fp8check;
#           training = attn-cudnn-d128 attn-flash-d128 fp8check attn-cudnn-d192v128 fp8-gemm
set -uo pipefail
: "${OUT:?OUT must be set (the device tool sets it)}"
PY="${PYTHON:-python3}"
BUDGET_S="${BUDGET_S:-540}"
MIN_PART_S="${MIN_PART_S:-20}"
KILL_AFTER_S="${KILL_AFTER_S:-10}"
PARTS="${PARTS:-crosscheck fp8check serving}"
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK="$(mktemp -d)"
DONE="$WORK/done"
mkdir -p "$DONE"
SMI_PID=""
TEE_PID=""
cleanup() {
  [[ -n "$SMI_PID" ]] && kill "$SMI_PID" 2>/dev/null
  rm -rf "$WORK"
  exec 1>&- 2>&-  # let tee write the log's last lines before the script returns
  [[ -n "$TEE_PID" ]] && wait "$TEE_PID" 2>/dev/null
}
trap cleanup EXIT
exec > >(tee -a "$OUT/log.txt") 2>&1
TEE_PID=$!

echo "== run_device.sh $(date -u +%FT%TZ), PARTS='$PARTS', budget ${BUDGET_S}s"
GPU_LINE=$("$PY" -m charon_search.profiling.device ${EXPECT_GPU:+--expect "$EXPECT_GPU"})
rc=$?
if (( rc != 0 )); then
  echo "== refused: no profiling run (device check exit $rc)"
  exit "$rc"
fi
GPU="${GPU_LINE#GPU_KEY=}"
echo "== GPU key $GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit \
    --format=csv
  Q=timestamp,clocks.sm,clocks.mem,power.draw.instant,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu="$Q" --format=csv,noheader >/dev/null 2>&1 \
    || Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
  nvidia-smi --query-gpu="$Q" --format=csv -lms 500 > "$OUT/smi.csv" 2>&1 &
  SMI_PID=$!
else
  echo "== nvidia-smi not found: no clock / power samples"
fi

expand() {  # groups -> part names
  local p
  for p in $PARTS; do
    case "$p" in
      serving) echo grid decode ;;
      crosscheck-all) echo crosscheck fp8check ;;
      training) echo attn-cudnn-d128 attn-flash-d128 fp8check attn-cudnn-d192v128 fp8-gemm ;;
      *) echo "$p" ;;
    esac
  done
}

pack() {  # move a finished part's folder out of $OUT and rewrite results.tgz atomically
  local name=$1
  [[ -d "$OUT/$name" ]] && mv "$OUT/$name" "$DONE/$name"
  tar czf "$OUT/results.tgz.tmp" -C "$DONE" . && mv -f "$OUT/results.tgz.tmp" "$OUT/results.tgz"
}

PROF=("$PY" -m charon_search.profiling --repeats 10 --warmup 3)
FAILED=0
for name in $(expand); do
  limit=""; cmd=()
  case "$name" in
    crosscheck) limit=240; cmd=("$PY" -m charon_search.profiling --gh100-crosscheck
                                --repeats 20 --warmup 5) ;;
    fp8check) limit=60; cmd=("$PY" -m charon_search.profiling.check_fp8) ;;
    grid) limit=240; cmd=("${PROF[@]}" --model llama-3.1-8b --model qwen3-30b-a3b
                          --phase prefill --points 1x4096,4x1024,1x2048 --grid --collectives
                          --overlap) ;;
    decode) limit=90; cmd=("${PROF[@]}" --model llama-3.1-8b --phase decode
                           --points 64x1:4096) ;;
    fp8-gemm) limit=150; cmd=("${PROF[@]}" --eager --fp8-gemm) ;;
    fp8-linear) limit=330; cmd=("$PY" -m charon_search.profiling.fp8_linear) ;;
    attn-*)
      if [[ "$name" =~ ^attn-(cudnn|flash|efficient)-d([0-9]+)(v([0-9]+))?$ ]]; then
        limit=150
        cmd=("${PROF[@]}" --eager --train-attention --sdpa-backend "${BASH_REMATCH[1]}"
             --head-dim "${BASH_REMATCH[2]}")
        [[ -n "${BASH_REMATCH[4]}" ]] && cmd+=(--v-head-dim "${BASH_REMATCH[4]}")
      fi ;;
  esac
  if [[ -z "$limit" ]]; then
    echo "== $name: unknown part, skipped"; FAILED=1; continue
  fi
  if [[ "$name" == fp8-linear ]] && ! "$PY" -c "import torchao" 2>/dev/null; then
    echo "== $name: skipped (torchao not installed)"; FAILED=1; continue
  fi
  left=$((DEADLINE - $(date +%s) - KILL_AFTER_S))
  if (( left < MIN_PART_S )); then
    echo "== $name: SKIPPED (${left}s left before the deadline)"; FAILED=1; continue
  fi
  (( limit > left )) && limit=$left
  [[ -n "${PART_LIMIT_S:-}" ]] && (( limit > PART_LIMIT_S )) && limit=$PART_LIMIT_S
  mkdir -p "$OUT/$name"
  case "$name" in
    fp8check) ;;
    fp8-linear) cmd+=(--out "$OUT/$name/fp8_linear.jsonl") ;;
    *) cmd+=(--gpu-name "$GPU" --out "$OUT/$name") ;;
  esac
  echo "== $name (limit ${limit}s): ${cmd[*]}"
  t0=$(date +%s)
  if [[ "$name" == fp8check ]]; then
    timeout --signal=TERM --kill-after="$KILL_AFTER_S" "$limit" "${cmd[@]}" \
      | tee "$OUT/$name/check_fp8.jsonl"
  else
    timeout --signal=TERM --kill-after="$KILL_AFTER_S" "$limit" "${cmd[@]}"
  fi
  rc=$?
  echo "== $name: exit $rc after $(( $(date +%s) - t0 ))s"
  (( rc != 0 )) && FAILED=1
  pack "$name"
done

# Anything measured? Rows (one JSON line each, written as measured) or fp8 check lines.
MEASURED=$(find "$DONE" -name '*.jsonl' -exec cat {} + 2>/dev/null | grep -c . || true)
echo "== done in $(( $(date +%s) - START ))s: ${MEASURED:-0} measured lines in results.tgz"
ls -la "$OUT"
if (( ${MEASURED:-0} == 0 )); then
  echo "== FAILED: nothing was measured"
  exit 3
fi
exit "$FAILED"
