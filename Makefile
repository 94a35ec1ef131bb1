# streamplatform: `make demo`, `make test` and `make test-all` do all set-up themselves (see
# README.md).
# Every target is idempotent: stamps (.venv/.installed, .jvm/*/.fetched) make re-runs cheap,
# and they are redone when pyproject.toml or platform/jvm/pom.xml change.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MVN := mvn -q -B -Dstyle.color=never -s platform/jvm/settings.xml -f platform/jvm/pom.xml
JVM_STAMPS := .jvm/spark/.fetched .jvm/kafka/.fetched .jvm/streams/.fetched .jvm/registry/.fetched \
  .jvm/s3/.fetched
PROMETHEUS := .tools/prometheus/usr/bin/prometheus

.PHONY: setup demo test test-all bench lint clean tools ui browser screenshots

# Everything local to the checkout: the virtualenv, the JVM jars and a Prometheus server (for
# the metrics test). Nothing system-wide.
setup: $(VENV)/.installed $(JVM_STAMPS) .tools/prometheus/.fetched

# Debian's prometheus package, unpacked into .tools/prometheus (not installed): the server the
# metrics test scrapes a running job with (tests/test_metrics_scrape.py). Without it that test
# is skipped, saying why (under CI=true it fails).
.tools/prometheus/.fetched:
	@echo "==> Prometheus (Debian's package, unpacked) into .tools/prometheus/"
	@rm -rf .tools/prometheus && mkdir -p .tools/prometheus/deb
	@cd .tools/prometheus/deb && { apt-get download prometheus >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 \
	       && apt-get download prometheus >/dev/null 2>&1; }; } \
	  && dpkg-deb -x prometheus_*.deb .. && rm -rf ../deb && touch ../.fetched \
	  || echo "==> prometheus not fetched (apt-get download prometheus failed): the metrics test \
	will be skipped"

# Debian's chromium for the Dagster UI test (tests/dagster/test_dagster_ui.py, marker `browser`)
# and `make screenshots`. It installs SYSTEM-WIDE (apt-get, when run as root), so it is not part
# of `setup` or `make test`; `make test-all` runs it, saying so first. NO_BROWSER=1 skips it.
# Without /usr/bin/chromium the UI test is skipped, saying why (under CI=true it fails).
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ -n "$(NO_BROWSER)" ]; then \
	  echo "==> NO_BROWSER is set: chromium not installed; the Dagster UI test will be skipped"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "==> Installing Debian's chromium SYSTEM-WIDE for the Dagster UI test:"; \
	  echo "    apt-get update && apt-get install -y chromium   (NO_BROWSER=1 skips this)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	    >/dev/null; } || echo "==> chromium not installed: the Dagster UI test will be skipped"; \
	else \
	  echo "==> /usr/bin/chromium missing (as root: apt-get install chromium, or make browser):"; \
	  echo "    the Dagster UI test will be skipped"; \
	fi

tools:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "streamplatform needs Python 3.11+ as '$(PYTHON)' (set PYTHON=...)."; exit 1; }
	@command -v java >/dev/null || { echo "streamplatform needs Java 17+ ('java' not found)."; exit 1; }
	@command -v mvn >/dev/null || { echo "streamplatform needs Maven ('mvn' not found)."; exit 1; }

$(VENV)/.installed: pyproject.toml setup.py platform/streamplatform/dsl/_cores.h platform/streamplatform/dsl/_dedup_core.c platform/streamplatform/dsl/_window_core.c platform/streamplatform/dsl/_join_core.c platform/streamplatform/dsl/_table_join_core.c platform/streamplatform/dsl/_session_core.c platform/streamplatform/dsl/_sliding_core.c platform/streamplatform/runtime/_kafka_rows.c platform/streamplatform/runtime/_task_loop.c platform/streamplatform/state/_sorted_keys.c platform/streamplatform/registry/_avro_core.c | tools
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

# The local Schema Registry (Apicurio's Quarkus app, a tar.gz of ~160 MB): unpacked, not copied,
# so .jvm/registry/quarkus-run.jar is the server (streamplatform/registry/local_registry.py). It
# runs on Java 21+, found beside the Java 17 that is enough for the rest (docs/schema-registry.md).
.jvm/registry/.fetched: platform/jvm/pom.xml platform/jvm/settings.xml | tools
	@echo "==> Local Schema Registry (Apicurio) via Maven into .jvm/registry/"
	@rm -rf .jvm/registry
	@$(MVN) -P registry dependency:unpack-dependencies
	@touch $@

demo: setup
	@$(BIN)/python demo.py

# Markers of tests that start heavy processes of their own (pyproject.toml; tests/conftest.py
# fails the run when a test lacks its marker).
HEAVY_MARKERS := child_process or cluster or connect_server or dagster_dev or browser
FAST_TESTS := not (slow or $(HEAVY_MARKERS))
PYTEST_ARGS ?=

# The fast tier (~10 min on 2 cores): unit tests and in-process integration on the run's one
# broker and one SparkSession; property tests draw a third of their examples
# (tests/property_budget.py). Installs nothing system-wide.
test: setup
	@STREAMPLATFORM_TEST_TIER=fast $(BIN)/pytest -m "$(FAST_TESTS)" $(PYTEST_ARGS)

# Everything, every marker (~70 min on 2 cores): child drivers, Spark clusters, Spark Connect,
# dagster dev, the browser test, the slow tests. CI runs it (.ci/run).
test-all: setup browser
	@$(BIN)/pytest $(PYTEST_ARGS)

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
screenshots: setup browser
	@$(BIN)/python docs/screenshots.py

bench: setup
	@for script in bench/*_bench.py; do echo "==> $$script"; $(BIN)/python $$script || exit 1; done

lint: setup
	@$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

clean:
	@-test -x $(BIN)/streamplatform && $(BIN)/streamplatform broker stop
	@-test -x $(BIN)/streamplatform && $(BIN)/streamplatform registry stop
	rm -rf $(VENV) .jvm .tools .data .pytest_cache .hypothesis .ruff_cache .mypy_cache \
	  platform/*.egg-info spark-warehouse metastore_db derby.log
