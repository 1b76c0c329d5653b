#!/usr/bin/env bash
# Issue 2's GPU check, for a machine with one CUDA GPU: gpt2-124m, micro-batch 12 x 1024,
# 10 warm-up + 30 timed steps, `single` and `ddp` at world size 1 over NCCL. One JSON row each.
#   bash benchmarks/gpu_check.sh > gpu_check.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
common=(--model gpt2-124m --micro-batch 12 --seq-len 1024 --warmup 10 --steps 30 --device cuda)
python -m trainers.bench --mode single "${common[@]}"
python -m torch.distributed.run --standalone --nproc_per_node=1 -m trainers.bench --mode ddp --bucket-cap-mb 25 "${common[@]}"
