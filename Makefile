# streamplatform: `make demo` and `make test` do all set-up themselves (see README.md).
# Every target is idempotent: stamps (.venv/.installed, .jvm/*/.fetched) make re-runs cheap,
# and they are redone when pyproject.toml or platform/jvm/pom.xml change.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MVN := mvn -q -B -Dstyle.color=never -s platform/jvm/settings.xml -f platform/jvm/pom.xml
JVM_STAMPS := .jvm/spark/.fetched .jvm/kafka/.fetched .jvm/streams/.fetched

.PHONY: setup demo test bench lint clean tools ui browser screenshots

setup: $(VENV)/.installed $(JVM_STAMPS) browser

# Debian's chromium for the Dagster UI test (tests/dagster/test_dagster_ui.py skips, saying
# why, where it cannot be installed).
browser:
	@test -x /usr/bin/chromium || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  echo "==> Debian chromium for the UI test" && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "==> /usr/bin/chromium missing: the Dagster UI test will be skipped"

tools:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "streamplatform needs Python 3.11+ as '$(PYTHON)' (set PYTHON=...)."; exit 1; }
	@command -v java >/dev/null || { echo "streamplatform needs Java 17+ ('java' not found)."; exit 1; }
	@command -v mvn >/dev/null || { echo "streamplatform needs Maven ('mvn' not found)."; exit 1; }

$(VENV)/.installed: pyproject.toml setup.py platform/streamplatform/dsl/_dedup_core.c | tools
	@echo "==> Python virtualenv in $(VENV) with streamplatform (editable) and dev tools"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@$(BIN)/python -m pip install --quiet --editable '.[dev]'
	@# platform/ holds the library but must never shadow the standard library's `platform`.
	@cd /tmp && $(CURDIR)/$(BIN)/python -c 'import platform, sys; \
	  assert platform.__file__.startswith(sys.base_prefix), platform.__file__'
	@touch $@

.jvm/%/.fetched: platform/jvm/pom.xml platform/jvm/settings.xml | tools
	@echo "==> JVM jars for $* via Maven into .jvm/$*/"
	@rm -rf .jvm/$*
	@$(MVN) -P $* dependency:copy-dependencies
	@touch $@

demo: setup
	@$(BIN)/python demo.py

test: setup
	@$(BIN)/pytest

# The Dagster UI on http://127.0.0.1:$(UI_PORT) with its instance in $(UI_HOME), and a local
# broker (unless KAFKA_BOOTSTRAP_SERVERS points elsewhere). Ctrl-C stops dagster dev (its runs,
# their Spark JVMs, the code server), then the broker. The instance first gets its dagster.yaml
# (telemetry off, pools of one run) and the code location's pools their limits
# (demo.prepare_instance).
UI_PORT ?= 3000
UI_HOME ?= $(CURDIR)/.data/dagster
ui: setup
	@$(BIN)/python -c 'from demo import prepare_instance; prepare_instance("$(UI_HOME)")'
	@if [ -z "$$KAFKA_BOOTSTRAP_SERVERS" ]; then $(BIN)/streamplatform broker start; fi
	@trap 'if [ -z "$$KAFKA_BOOTSTRAP_SERVERS" ]; then $(BIN)/streamplatform broker stop; fi' EXIT; \
	  trap 'exit 130' INT TERM; \
	  DAGSTER_HOME=$(UI_HOME) $(BIN)/python webui.py dev -w workspace.yaml -h 127.0.0.1 \
	  -p $(UI_PORT)

# docs/images/*.png for the README: the Dagster UI on the instance `make demo` left in
# .data/dagster, photographed by headless chromium (docs/screenshots.py).
screenshots: setup
	@$(BIN)/python docs/screenshots.py

bench: setup
	@for script in bench/*_bench.py; do echo "==> $$script"; $(BIN)/python $$script || exit 1; done

lint: setup
	@$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

clean:
	@-test -x $(BIN)/streamplatform && $(BIN)/streamplatform broker stop
	rm -rf $(VENV) .jvm .data .pytest_cache .hypothesis .ruff_cache .mypy_cache \
	  platform/*.egg-info spark-warehouse metastore_db derby.log
