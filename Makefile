# Two commands for a fresh clone (each sets everything up on first use, then is a no-op for set-up):
#   make smoke   the smoke sweep on the embedded local Ray, then its summary
#   make test    the test suite (what CI runs)
#   make check   the fast tier for every edit: ruff, then the tests that start no Ray, server rig or browser
# The manual steps they perform are in README.md.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: smoke test check lint setup clean browser gpu-check device-bundle docs

setup: $(STAMP)

# CPU torch from local disk first, with pip (its configuration finds the local wheel): an unpinned torch would
# pull a multi-GB CUDA build. The rest with uv: the same packages as pip in about 25 s, not 45, their bytecode
# compiled as pip does (this machine sets PYTHONDONTWRITEBYTECODE: without it every Ray worker compiles Ray).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0 uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[test]'
	touch $(STAMP)

smoke: $(STAMP)
	$(BIN)/ddpsweep run smoke

# The docs site into build/site/: the references generated from the code first, then MkDocs, strict
docs: $(STAMP)
	$(BIN)/python docs/docgen.py docs/reference
	$(BIN)/mkdocs build --strict

# The browser tier needs Debian's chromium + chromium-driver; installed here when possible (root, apt),
# otherwise that tier skips and says why.
browser:
	@command -v chromedriver >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
	  >/dev/null 2>&1; } || echo "chromium not installed: the browser tests will skip"

# Everything: the fast tier on two processes (pytest-xdist), then the tiers that start Ray, a server rig or a
# browser one at a time (they measure, and two sweeps on one machine would measure each other).
FAST := not ray and not slow and not timing and not netns and not browser and not s3

test: $(STAMP) browser
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -n 2 -m "$(FAST)"
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -m "not ($(FAST))"

check: $(STAMP) lint
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -n 2 -m "$(FAST)"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The GPU path in one command (benchmarks/gpu_check.sh): on a machine without CUDA it says so and exits 0.
# Needs no set-up (a GPU machine may reach no registry): Ray and the rest come from the device bundle.
gpu-check:
	PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) bash benchmarks/gpu_check.sh

# build/device_bundle.tar.xz for the GPU machine (cp312 wheels from the registry here)
device-bundle:
	bash benchmarks/device_bundle.sh

clean:
	rm -rf $(VENV)
