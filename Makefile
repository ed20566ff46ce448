# The two commands: `make run` and `make test`. Both bootstrap .venv from pinned packages.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= memory_pipeline.yaml
export HF_HUB_OFFLINE := 1
export DAGSTER_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false
# A local wheel folder (this machine's CPU torch) is used when present; nothing else is fetched at run time.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: run test bench bench-quick ui venv clean system-tools sample-media

# Programs media extraction needs at run time (OCR, decoding and keyframes) and the sample/test
# media generator (speech): installed from Debian's packages when one is missing, else nothing.
SYSTEM_TOOLS := tesseract ffmpeg espeak-ng
APT_PACKAGES := tesseract-ocr tesseract-ocr-eng ffmpeg espeak-ng
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

venv: system-tools $(STAMP)

system-tools:
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing (apt: $(APT_PACKAGES))"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(APT_PACKAGES); \
	fi

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(FIND_LINKS) -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

run: venv
	$(BIN)/memory index --config $(CONFIG)
	@echo
	@echo '$$ memory search "which vector database did we choose for the support bot"'
	@$(BIN)/memory search --config $(CONFIG) "which vector database did we choose for the support bot"

test: venv
	@set -o pipefail; $(BIN)/python -m pytest memory_pipeline_tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose" >&2; exit 1; fi; exit $$rc

bench: venv
	$(BIN)/python benchmarks/bench_index.py --out benchmarks/results.json
	$(BIN)/python benchmarks/bench_index.py --only 1 --no-warmup --corpus1-notes 700 --out benchmarks/results-throughput-large.json

bench-quick: venv
	$(BIN)/python benchmarks/bench_index.py --quick --out benchmarks/results-quick.json

# dagster dev needs job control (set -m) to stop on SIGTERM when started from a script.
ui: venv
	set -m; home=$$($(BIN)/python -c "from memory_pipeline.runner import ensure_dagster_home as h; from memory_pipeline.settings import load_settings as s; print(h(s('$(CONFIG)')))") && \
	DAGSTER_HOME=$$home MEMORY_PIPELINE_CONFIG=$(abspath $(CONFIG)) DAGSTER_DISABLE_TELEMETRY=1 \
		$(BIN)/dagster dev -h 127.0.0.1 -p $${PORT:-3000} -w workspace.yaml

# Regenerates the shipped sample media (deterministic: the same bytes every time).
sample-media: venv
	$(BIN)/python -m memory_pipeline.sample_media data/sample/media

clean:
	rm -rf data/index benchmarks/work .pytest_cache
