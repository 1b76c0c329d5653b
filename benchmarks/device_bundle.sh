#!/usr/bin/env bash
# Build the packages `make gpu-check` needs on a GPU machine that reaches no package registry (an air-gapped
# GPU cluster, or this project's lent H200): Ray 2.60 with train and tune and every dependency the machine's
# image lacks, as manylinux wheels for its Python, unpacked one folder per distribution, Ray stripped of what
# a CPU/GPU sweep never loads, packed with xz into one file.
#   bash benchmarks/device_bundle.sh                 # -> build/device_bundle.tar.xz (cp312, the H200 image)
#   PYVER=3.11 bash benchmarks/device_bundle.sh      # another Python (3.11: this machine, to test the bundle)
# Run on the GPU machine by benchmarks/gpu_check.sh, which puts on PYTHONPATH only the distributions that
# are not installed there already (so nothing in the image is shadowed).
# Left out:
#   - what the GPU image has (torch, numpy, pandas, pyarrow and their date libraries; matplotlib, typer,
#     rich, psutil, httpx, jinja2 are not Ray dependencies and are not downloaded);
#   - DuckDB (results.storage.reader then reads file by file) and FastAPI/uvicorn (no `ddpsweep serve` there);
#   - ray[default]: without the dashboard's packages the embedded Ray starts without its dashboard
#     (sweeps/driver/session.py), so no Ray Jobs, and a cell killed at cell_timeout_s keeps its placement group;
#   - from Ray's wheel: ray/jars (Java workers), the dashboard's client build, rllib.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
RAY_VERSION=${RAY_VERSION:-2.60.0}
OUT=${OUT_FILE:-build/device_bundle.tar.xz}
IMAGE_HAS="numpy pandas pyarrow python_dateutil pytz tzdata six"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip download --quiet --only-binary=:all: --platform manylinux2014_x86_64 --python-version "$PYVER" \
  --implementation cp -d "$work/wheels" "ray[train,tune]==$RAY_VERSION" "pyyaml>=6" 2> >(grep -v "is ignored" >&2)
for name in $IMAGE_HAS; do rm -f "$work/wheels/$name"-[0-9]*.whl; done

python3 - "$work" <<'PY'
import os, pathlib, shutil, sys, zipfile

work = pathlib.Path(sys.argv[1])
for wheel in sorted((work / "wheels").glob("*.whl")):
    dest = work / "bundle" / "site" / wheel.name.split("-")[0].lower()
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = z.extract(info, dest)
            mode = info.external_attr >> 16  # zip keeps the Unix mode here: raylet and gcs_server need +x
            if mode & 0o111:
                os.chmod(path, mode & 0o777)
ray = work / "bundle" / "site" / "ray" / "ray"
for unused in ("jars", "dashboard/client/build", "rllib"):
    shutil.rmtree(ray / unused, ignore_errors=True)
for cache in list((work / "bundle").rglob("__pycache__")):
    shutil.rmtree(cache, ignore_errors=True)
PY
echo "python $PYVER ray $RAY_VERSION" >"$work/bundle/VERSION"
mkdir -p "$(dirname "$OUT")"
tar -C "$work/bundle" -cf - . | xz -T0 -6 >"$OUT"
echo "$OUT: $(du -m "$OUT" | cut -f1) MiB, $(ls "$work/bundle/site" | wc -l) distributions"
