#!/usr/bin/env bash
# Issue 11's GPU check of the network fingerprint, on a machine with CUDA GPUs (no Ray needed):
# prints this node's `network` fingerprint (interfaces, IB ports, GPUs, nvidia-smi topo -m) and the
# row fingerprint's GPU fields, as JSON.   bash benchmarks/gpu_fingerprint.sh > fingerprint.json
set -euo pipefail
cd "$(dirname "$0")/.."
${PYTHON:-python3} - <<'PY'
import json, socket
import torch
from sweeps.worker.fingerprint import collect, network

ip = socket.gethostbyname(socket.gethostname())
row = collect(torch.device("cuda"))
print(json.dumps({"network": network(ip), "accelerator": row["accelerator"], "accelerators": row["accelerators"],
                  "driver_version": row["driver_version"], "nccl_version": row["nccl_version"],
                  "topology": row["topology"]}, indent=1))
PY
