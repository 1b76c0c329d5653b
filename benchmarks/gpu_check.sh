#!/usr/bin/env bash
# make gpu-check: the GPU path in one command, for one CUDA GPU, no network, within 5 minutes from a cold start.
# Through the real CLI on the embedded Ray, NCCL, use_gpu: true (specs in benchmarks/gpu_check/):
#   1_main      gpt2-124m 12x1024: single + ddp, buckets 1/25 MB, gas 1 and 4 with no_sync, 2 rounds, trace_comm
#   2_timing    one DDP cell timed by sync, events and loop, interleaved, 3 rounds
#   3_hooks     comm hooks none/bf16/powersgd;  3_workload: a user workload (recsys)
#   4_compile   eager vs torch.compile (Inductor, ddp_optimizer) at 25 MB
# Before part 1, `ddpsweep predict` profiles gpt2-124m on the GPU; the summary sets part 1's cells beside it.
# Part 0 (benchmarks/gpu_calibration_path.py) runs the calibration code on a 1-rank NCCL group outside Ray.
# Every DDP configuration checks its gradient once (trainers.gradcheck); at world size 1 any error is kernel
# nondeterminism, which the check shares with the cell's own backward: the summary's first section.
# The summary (benchmarks/gpu_summary.py) is rewritten after every part, so a cut leaves what ran.
# REHEARSAL=1 runs the same flow on CPU (tiny model, gloo, fp16 for bf16, Inductor) to check the script itself.
# Everything lands under $OUT (default build/gpu-check): results/, report.html, recommend.json, summary.md.
# Packages the machine lacks (Ray, ...) come from build/device_bundle.tar.xz (benchmarks/device_bundle.sh).
# On a lent GPU machine: `make device-bundle` here, then the device tool with
#   command "make gpu-check OUT=$OUT/gpu-check", carry ["build/device_bundle.tar.xz"]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-build/gpu-check}
specs=benchmarks/gpu_check
if [ "${REHEARSAL:-0}" = 1 ]; then  # the same flow on CPU (tiny model, gloo): check the script, not the GPU
  specs="$OUT/specs"
  mkdir -p "$specs"
  for f in benchmarks/gpu_check/*.yaml; do
    sed -e 's/^model: gpt2-124m/model: tiny/' -e 's/^micro_batch: 12$/micro_batch: 4/' -e 's/^seq_len: 1024/seq_len: 32/' \
      -e 's/^backend: nccl/backend: gloo/' -e 's/^use_gpu: true/use_gpu: false/' -e 's/^cpus_per_worker: 4/cpus_per_worker: 1/' \
      -e 's/bf16/fp16/' -e 's/^cluster: gpu-check/cluster: gpu-check-rehearsal/' \
      -e 's/rows: 200000/rows: 20000/' "$f" >"$specs/$(basename "$f")"
  done
elif ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "make gpu-check needs a CUDA GPU (torch.cuda.is_available() is not True here): nothing run"
  exit 0
fi
mkdir -p "$OUT"
source benchmarks/device_env.sh "${DEVICE_BUNDLE:-build/device_bundle.tar.xz}"
results="$OUT/results"
started=$SECONDS
# part limits, s (a part cut at its limit still leaves its rows and the summary)
PARTS=(0_calibration_path:25 1_predict:25 1_main:75 2_timing:35 3_hooks:35 3_workload:20 4_compile:55)
total=0; for p in "${PARTS[@]}"; do total=$((total + ${p#*:})); done
echo "limits sum: $total s"
limit() { for p in "${PARTS[@]}"; do [ "${p%%:*}" = "$1" ] && echo "${p#*:}"; done; }

scale=${LIMIT_SCALE:-$([ "${REHEARSAL:-0}" = 1 ] && echo 4 || echo 1)}  # a 2-core CPU starts Ray far slower
summarize() {
  "$PY" benchmarks/gpu_summary.py "$results" "$OUT/calibration_path.json" >"$OUT/summary.md.new" 2>"$OUT/summary.log" &&
    { echo; echo "## Run"; echo "- wall: $((SECONDS - started)) s; limits sum: $total s"; sed 's/^/- /' "$OUT/exit_codes"; } \
      >>"$OUT/summary.md.new" && mv "$OUT/summary.md.new" "$OUT/summary.md"
}
sweep() {  # sweep NAME: one part, cut at its limit, then the summary rewritten
  echo "== $1 ($((SECONDS - started)) s in)"
  timeout --signal=INT --kill-after=10 "$(($(limit "$1") * scale))" "$PY" -m service.cli run "$specs/$1.yaml" \
    --results "$results" --sweep "$1" 2>&1 | tail -n 40
  echo "$1 exit ${PIPESTATUS[0]}" >>"$OUT/exit_codes"
  summarize
}
: >"$OUT/exit_codes"
timeout "$(($(limit 0_calibration_path) * scale))" "$PY" benchmarks/gpu_calibration_path.py "$OUT/calibration_path.json"
echo "0_calibration_path exit $?" >>"$OUT/exit_codes"
echo "== 1_predict ($((SECONDS - started)) s in)"  # the workload's profile on this GPU, before part 1 measures
timeout "$(($(limit 1_predict) * scale))" "$PY" -m service.cli predict "$specs/1_main.yaml" --results "$results" \
  >"$OUT/predict.txt" 2>&1
echo "1_predict exit $?" >>"$OUT/exit_codes"
sweep 1_main
sweep 3_hooks
sweep 3_workload
sweep 2_timing
sweep 4_compile
"$PY" -m service.cli report --results "$results" --out "$OUT/report.html" >"$OUT/report.log" 2>&1
"$PY" -m service.cli recommend --results "$results" --format json >"$OUT/recommend.json" 2>"$OUT/recommend.log"
"$PY" -m service.cli recommend --results "$results" >"$OUT/recommend.txt" 2>&1
summarize
cat "$OUT/summary.md"
