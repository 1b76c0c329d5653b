# Sourced by benchmarks/gpu_check.sh: unpack a bundle built by benchmarks/device_bundle.sh and put on
# PYTHONPATH the distributions in it that this Python does not have (nothing installed is shadowed).
#   source benchmarks/device_env.sh [BUNDLE]     (default: build/device_bundle.tar.xz; absent: nothing done)
_bundle=${1:-build/device_bundle.tar.xz}
_site=${DEVICE_SITE:-${TMPDIR:-/tmp}/ddpsweep-device-site}
if [ -f "$_bundle" ]; then
  rm -rf "$_site" && mkdir -p "$_site"
  "${PYTHON:-python3}" -c 'import sys, tarfile
kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}  # modes kept: raylet and gcs_server need +x
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)' "$_bundle" "$_site"
  _paths=$("${PYTHON:-python3}" - "$_site/site" <<'PY'
import pathlib, sys
from importlib import metadata

picked = []
for folder in sorted(pathlib.Path(sys.argv[1]).iterdir()):
    info = next(folder.glob("*.dist-info"), None)
    name = info.name.split("-")[0] if info else folder.name
    try:
        metadata.version(name)  # installed here already: the image's copy wins
    except metadata.PackageNotFoundError:
        picked.append(str(folder))
print(":".join(picked))
PY
)
  export PYTHONPATH="$PWD${_paths:+:$_paths}${PYTHONPATH:+:$PYTHONPATH}"
  echo "device bundle: $(cat "$_site/VERSION"); on PYTHONPATH: $(echo "$_paths" | tr ':' '\n' | grep -c .) distributions"
fi
