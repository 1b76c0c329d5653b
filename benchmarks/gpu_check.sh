#!/usr/bin/env bash
# make gpu-check (issue 22): the GPU path in one command, for one CUDA GPU, no network, <= 6 minutes.
# Through the real CLI on the embedded Ray, NCCL, use_gpu: true (specs in benchmarks/gpu_check/):
#   1_main       gpt2-124m 12x1024: single + ddp, buckets 1/25/500 MB, gas 1 and 4 with no_sync, 3 rounds,
#                calibrate, trace_comm
#   2_timing     one DDP cell timed by sync, events and loop, interleaved, 5 rounds
#   3_hooks      comm hooks none/bf16/powersgd;  3_workload: a user workload;  3_isolation: the cell alone
#   4_compile    eager vs torch.compile x optimize_ddp {ddp_optimizer, python_reducer}, buckets 1 and 25 MB
# Before part 1, `ddpsweep predict` profiles gpt2-124m on the GPU (issue 37); the summary sets part 1's cells
# beside the overlap model's step (world size 1: no communication, the prediction is the profile alone).
# Every DDP measurement also checks its gradient (trainers.gradcheck): exact under NCCL with bf16 autocast for
# hook none, the bf16 and PowerSGD hooks' errors; the summary has a section for it.
# then `ddpsweep report` and `ddpsweep recommend`, and a markdown summary (benchmarks/gpu_summary.py).
# REHEARSAL=1 runs the same flow on CPU (tiny model, gloo, fp16 for bf16) to check the script itself.
# Everything lands under $OUT (default build/gpu-check): results/, report.html, recommend.json, summary.md.
# Packages the machine lacks (Ray, ...) come from build/device_bundle.tar.xz (benchmarks/device_bundle.sh).
# The parts' limits add up to 560 s, the profile's 45 s beside them (4_compile: 225 s, Inductor compiling five wrappers of gpt2-124m) (+ 60 s at most for part 0, typically seconds), report and recommend
# ~20 s: within 10 minutes. Part 0 (benchmarks/gpu_calibration_path.py) runs the calibration code on a 1-rank
# NCCL group outside Ray: a sweep calibrates only groups of >= 2 ranks, which one GPU cannot form.
# On this project's lent H200: `make device-bundle` here, then the device tool with
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
      -e 's/^compile_backend: inductor/compile_backend: aot_eager/' "$f" >"$specs/$(basename "$f")"
  done
elif ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "make gpu-check needs a CUDA GPU (torch.cuda.is_available() is not True here): nothing run"
  exit 0
fi
mkdir -p "$OUT"
source benchmarks/device_env.sh "${DEVICE_BUNDLE:-build/device_bundle.tar.xz}"
results="$OUT/results"
started=$SECONDS

scale=${LIMIT_SCALE:-$([ "${REHEARSAL:-0}" = 1 ] && echo 3 || echo 1)}  # a 2-core CPU starts Ray far slower
sweep() {  # sweep SPEC LIMIT_S: one part, cut at LIMIT_S so that the summary is always written
  echo "== $1 ($((SECONDS - started)) s in)"
  timeout --signal=INT --kill-after=30 "$(($2 * scale))" "$PY" -m service.cli run "$specs/$1.yaml" \
    --results "$results" --sweep "$1" 2>&1 | tail -n 40
  echo "$1 exit ${PIPESTATUS[0]}" >>"$OUT/exit_codes"
}
: >"$OUT/exit_codes"
timeout 60 "$PY" benchmarks/gpu_calibration_path.py "$OUT/calibration_path.json"
echo "0_calibration_path exit $?" >>"$OUT/exit_codes"
echo "== 1_predict ($((SECONDS - started)) s in)"  # the workload's profile on this GPU, before part 1 measures
timeout 45 "$PY" -m service.cli predict "$specs/1_main.yaml" --results "$results" >"$OUT/predict.txt" 2>&1
echo "1_predict exit $?" >>"$OUT/exit_codes"
sweep 1_main 110
sweep 2_timing 65
sweep 3_hooks 40
sweep 3_workload 40
sweep 3_isolation 80
sweep 4_compile 225
"$PY" -m service.cli report --results "$results" --out "$OUT/report.html" >"$OUT/report.log" 2>&1
"$PY" -m service.cli recommend --results "$results" --format json >"$OUT/recommend.json" 2>"$OUT/recommend.log"
"$PY" -m service.cli recommend --results "$results" >"$OUT/recommend.txt" 2>&1
"$PY" benchmarks/gpu_summary.py "$results" "$OUT/calibration_path.json" >"$OUT/summary.md"
{ echo; echo "## Run"; echo "- wall: $((SECONDS - started)) s"; sed 's/^/- /' "$OUT/exit_codes"; } >>"$OUT/summary.md"
cat "$OUT/summary.md"
