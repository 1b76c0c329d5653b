#!/usr/bin/env bash
# make gpu-check (issue 22): the GPU path in one command, for one CUDA GPU, no network, <= 6 minutes.
# Through the real CLI on the embedded Ray, NCCL, use_gpu: true (specs in benchmarks/gpu_check/):
#   1_main       gpt2-124m 12x1024: single + ddp, buckets 1/25/500 MB, gas 1 and 4 with no_sync, 3 rounds,
#                calibrate, trace_comm
#   2_timing     one DDP cell timed by sync, events and loop, interleaved, 5 rounds
#   3_hooks      comm hooks none/bf16/powersgd;  3_workload: a user workload;  3_isolation: the cell alone
# then `ddpsweep report` and `ddpsweep recommend`, and a markdown summary (benchmarks/gpu_summary.py).
# Everything lands under $OUT (default build/gpu-check): results/, report.html, recommend.json, summary.md.
# Packages the machine lacks (Ray, ...) come from build/device_bundle.tar.xz (benchmarks/device_bundle.sh).
# The parts' limits add up to 335 s, report and recommend to ~20 s: within 6 minutes with Ray's starts.
# On this project's lent H200: `make device-bundle` here, then the device tool with
#   command "make gpu-check OUT=$OUT/gpu-check", carry ["build/device_bundle.tar.xz"]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "make gpu-check needs a CUDA GPU (torch.cuda.is_available() is not True here): nothing run"
  exit 0
fi
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
source benchmarks/device_env.sh "${DEVICE_BUNDLE:-build/device_bundle.tar.xz}"
results="$OUT/results"
started=$SECONDS

sweep() {  # sweep SPEC LIMIT_S: one part, cut at LIMIT_S so that the summary is always written
  echo "== $1 ($((SECONDS - started)) s in)"
  timeout --signal=INT --kill-after=30 "$2" "$PY" -m service.cli run "benchmarks/gpu_check/$1.yaml" \
    --results "$results" --sweep-id "$1" 2>&1 | tail -n 40
  echo "$1 exit ${PIPESTATUS[0]}" >>"$OUT/exit_codes"
}
: >"$OUT/exit_codes"
sweep 1_main 130
sweep 2_timing 75
sweep 3_hooks 35
sweep 3_workload 35
sweep 3_isolation 60
"$PY" -m service.cli report --results "$results" --out "$OUT/report.html" >"$OUT/report.log" 2>&1
"$PY" -m service.cli recommend --results "$results" --format json >"$OUT/recommend.json" 2>"$OUT/recommend.log"
"$PY" -m service.cli recommend --results "$results" >"$OUT/recommend.txt" 2>&1
"$PY" benchmarks/gpu_summary.py "$results" >"$OUT/summary.md"
{ echo; echo "## Run"; echo "- wall: $((SECONDS - started)) s"; sed 's/^/- /' "$OUT/exit_codes"; } >>"$OUT/summary.md"
cat "$OUT/summary.md"
