# decisionflow: `make run` serves the admin on 127.0.0.1:8000; `make test` runs the suite
# on SQLite and again on PostgreSQL when a server answers at TEST_POSTGRES_URL.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
TEST_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/postgres
PYTEST_ARGS ?=

# Local runs use the development secret; production sets SECRET_KEY and DEBUG=0.
export DEBUG ?= 1

.PHONY: run test test-sqlite test-postgres browser screenshots bench reliability clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# Browser tests drive Debian's Chromium; install it when missing and we are allowed to.
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's chromium for the browser tests..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "NOTE: /usr/bin/chromium is missing and cannot be installed here (not root): browser tests will be skipped."; \
	fi

# Rerun the browser tests and keep their screenshots for the README (docs/screenshots/).
screenshots: $(VENV)/.installed browser
	env -u DATABASE_URL DECISIONFLOW_SCREENSHOT_DIR=docs/screenshots $(VENV)/bin/pytest tests/browser -q

run: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py load_demo
	@echo "Serving the admin at http://127.0.0.1:8000/admin/ (Ctrl-C to stop)"
	$(PY) manage.py runserver 127.0.0.1:8000

test: $(VENV)/.installed browser
	$(MAKE) --no-print-directory test-sqlite
	$(MAKE) --no-print-directory test-postgres

test-sqlite: $(VENV)/.installed
	@echo "== pytest on SQLite =="
	env -u DATABASE_URL $(VENV)/bin/pytest $(PYTEST_ARGS)

test-postgres: $(VENV)/.installed
	@if $(PY) -c "import sys, psycopg; psycopg.connect(sys.argv[1], connect_timeout=3).close()" "$(TEST_POSTGRES_URL)" 2>/dev/null; then \
		echo "== pytest on PostgreSQL ($(TEST_POSTGRES_URL)) =="; \
		DATABASE_URL="$(TEST_POSTGRES_URL)" $(VENV)/bin/pytest $(PYTEST_ARGS); \
	elif [ "$(DECISIONFLOW_REQUIRE_POSTGRES)" = 1 ]; then \
		echo "FAILED: no PostgreSQL answers at $(TEST_POSTGRES_URL), and DECISIONFLOW_REQUIRE_POSTGRES=1" >&2; exit 1; \
	else \
		echo "SKIPPED: the PostgreSQL run (no server answers at $(TEST_POSTGRES_URL)); set TEST_POSTGRES_URL to run it"; \
	fi

# Benchmarks: ratios against raw baselines measured in the same run, written to
# docs/PERFORMANCE.md. Uses its own databases (decisionflow_bench* on BENCH_POSTGRES_URL,
# default the local server, and a temporary SQLite file); ~15 minutes on 2 cores.
BENCH_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432
BENCH_ARGS ?=
bench: $(VENV)/.installed
	BENCH_POSTGRES_URL="$(BENCH_POSTGRES_URL)" $(PY) -m bench.run $(BENCH_ARGS)

# The reliability battery (crashes at every step, two-host load, bad input, security), long
# version: 10 iterations per crash point on SQLite, 20 on PostgreSQL, 60 s of load on the
# decisionflow_load database; writes docs/RELIABILITY.md (~10-20 minutes on 2 cores).
reliability: $(VENV)/.installed
	TEST_POSTGRES_URL="$(TEST_POSTGRES_URL)" $(PY) reliability/run.py

clean:
	rm -rf $(VENV) db.sqlite3 .pytest_cache
