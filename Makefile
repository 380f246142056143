# decisionflow: `make run` serves the admin on 127.0.0.1:8000, beside the reference helpdesk and
# a task worker; `make test` runs the suite on SQLite and again on PostgreSQL when a server
# answers at TEST_POSTGRES_URL.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
TEST_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/postgres
PYTEST_ARGS ?=
# Each suite runs on this many pytest-xdist workers, a test file to a worker (0: in one process).
TEST_WORKERS ?= 2
PYTEST = $(VENV)/bin/pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# Local runs use the development secret; production sets SECRET_KEY and DEBUG=0.
export DEBUG ?= 1

.PHONY: run test test-sqlite test-postgres lint lock browser graphviz pgbouncer postgresql-server haproxy redis screenshots bench reliability clean helpdesk

# Each purpose installs its own locked set (requirements/*.txt, with hashes); test and bench
# are supersets of runtime, so their stamps also mark runtime as installed.
PIP_INSTALL = $(PY) -m pip install --quiet --disable-pip-version-check --require-hashes

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.runtime: requirements/runtime.txt | $(PY)
	$(PIP_INSTALL) -r requirements/runtime.txt
	touch $@

$(VENV)/.test: requirements/test.txt | $(PY)
	$(PIP_INSTALL) -r requirements/test.txt
	touch $@ $(VENV)/.runtime

$(VENV)/.bench: requirements/bench.txt | $(PY)
	$(PIP_INSTALL) -r requirements/bench.txt
	touch $@ $(VENV)/.runtime

# Ruff (lint and format), mypy, the import layers, and no model change without its migration.
lint: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) manage.py makemigrations --check --dry-run

# Re-lock every set from its short input file; CONTRIBUTING.md says how to upgrade one package.
PIP_COMPILE = cd requirements && ../$(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
	--strip-extras --no-emit-index-url --no-emit-find-links $(LOCK_ARGS)
lock: $(VENV)/.test
	$(PIP_COMPILE) -o runtime.txt runtime.in
	$(PIP_COMPILE) -o test.txt test.in
	$(PIP_COMPILE) -o bench.txt bench.in
	$(PIP_COMPILE) -o peer.txt peer.in
	$(PIP_COMPILE) -o dbos.txt dbos.in

# Browser tests drive Debian's Chromium; install it when missing and we are allowed to.
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's chromium for the browser tests..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "NOTE: /usr/bin/chromium is missing and cannot be installed here (not root): browser tests will be skipped."; \
	fi

# The review and history pages draw the workflow with Graphviz's `dot` (Debian's graphviz);
# without it they show the case's state as text and say how to add the picture.
graphviz:
	@if command -v dot >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's graphviz for the workflow picture..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; \
	else \
		echo "NOTE: Graphviz (dot) is missing and cannot be installed here (not root): the review and history pages"; \
		echo "      will show where a case stands as text only. To add the picture: sudo apt-get install graphviz"; \
		echo "      (or brew install graphviz), then restart the server."; \
	fi

# The pooler tests (tests/reliability/test_pooler.py) and `make reliability` run the load
# through Debian's PgBouncer, started as a private child process (never the system service).
# Without it those tests skip, or fail when DECISIONFLOW_REQUIRE_POSTGRES=1 (CI).
pgbouncer:
	@if [ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's pgbouncer for the pooler tests..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null; \
	else \
		echo "NOTE: pgbouncer is missing and cannot be installed here (not root): the pooler tests will be skipped"; \
		echo "      (they fail instead with DECISIONFLOW_REQUIRE_POSTGRES=1). To add it: sudo apt-get install pgbouncer"; \
	fi

# `make reliability`'s replica step (reliability/replica.py) makes a streaming pair of its own
# with Debian's initdb, pg_ctl and pg_basebackup (/usr/lib/postgresql/*/bin), run as the
# postgres user; it never copies the shared server. Without them that step is skipped, or
# fails when DECISIONFLOW_REQUIRE_POSTGRES=1 (CI).
postgresql-server:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's postgresql server binaries for the replica step..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null; \
	else \
		echo "NOTE: PostgreSQL's server binaries (initdb) are missing and cannot be installed here (not root): the"; \
		echo "      replica step of make reliability will be skipped. To add them: sudo apt-get install postgresql"; \
	fi

# `make reliability` puts three hosts behind Debian's haproxy (reliability/balancer.py, its
# config rendered from deploy/haproxy.cfg), started as a private child process (never the
# system service). Without it that step is skipped (failed with DECISIONFLOW_REQUIRE_POSTGRES=1),
# and so are the haproxy tests of tests/reliability/test_balancer.py (a few seconds).
haproxy:
	@if [ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's haproxy for the load balancer step of make reliability..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy >/dev/null; \
	else \
		echo "NOTE: haproxy is missing and cannot be installed here (not root): the load balancer step of"; \
		echo "      make reliability will fail. To add it: sudo apt-get install haproxy"; \
	fi

# The RQ task backend's tests (tests/delivery/test_rq_backend.py) and `make reliability`'s broker
# step start a private redis-server of Debian's (a free port, nothing saved), never the system
# service. Without it those tests skip, or fail when DECISIONFLOW_REQUIRE_POSTGRES=1 (CI).
redis:
	@if command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's redis-server for the RQ task backend's tests..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null; \
	else \
		echo "NOTE: redis-server is missing and cannot be installed here (not root): the RQ backend's tests will be skipped"; \
		echo "      (they fail instead with DECISIONFLOW_REQUIRE_POSTGRES=1). To add it: sudo apt-get install redis-server"; \
	fi

# Rerun the browser tests and keep their screenshots for the README and docs/ (docs/screenshots/).
screenshots: $(VENV)/.test browser graphviz
	env -u DATABASE_URL DECISIONFLOW_SCREENSHOT_DIR=docs/screenshots $(VENV)/bin/pytest tests/browser -q

# The server, the reference helpdesk (127.0.0.1:8025) and one task worker that delivers the
# approved replies to it (docs/DELIVERY.md); Ctrl-C stops all three (deploy/run-local.sh).
run: $(VENV)/.runtime graphviz
	$(PY) manage.py migrate --noinput
	$(PY) manage.py load_demo
	@PY="$(PY)" HELPDESK_TOKEN="$(HELPDESK_TOKEN)" deploy/run-local.sh

# The reference helpdesk that approved replies are delivered to (helpdesk/README.md), on
# 127.0.0.1:8025 with its own SQLite file, fault switches on (for the demo). Standard library
# only: it needs no installed set. Its bearer token must be the one decisionflow sends.
HELPDESK_TOKEN ?= dev-helpdesk-token
helpdesk: | $(PY)
	HELPDESK_TOKEN="$(HELPDESK_TOKEN)" $(PY) -m helpdesk --port 8025 --db var/helpdesk.sqlite3 --faults

# Both suites at once, each to its own log, printed when it ends, then a summary; the exit
# status fails when either fails (tests/run_both.sh). Together they take about as long as the
# slower one alone (figures in CONTRIBUTING.md). `make test-sqlite` or `make test-postgres`
# runs one, streaming its output.
test: $(VENV)/.test browser graphviz pgbouncer haproxy redis
	@MAKE="$(MAKE)" tests/run_both.sh

test-sqlite: $(VENV)/.test redis
	@echo "== pytest on SQLite =="
	env -u DATABASE_URL $(PYTEST) $(PYTEST_ARGS)

test-postgres: $(VENV)/.test pgbouncer haproxy redis
	@if $(PY) -c "import sys, psycopg; psycopg.connect(sys.argv[1], connect_timeout=3).close()" "$(TEST_POSTGRES_URL)" 2>/dev/null; then \
		echo "== pytest on PostgreSQL ($(TEST_POSTGRES_URL)) =="; \
		DATABASE_URL="$(TEST_POSTGRES_URL)" $(PYTEST) $(PYTEST_ARGS); \
	elif [ "$(DECISIONFLOW_REQUIRE_POSTGRES)" = 1 ]; then \
		echo "FAILED: no PostgreSQL answers at $(TEST_POSTGRES_URL), and DECISIONFLOW_REQUIRE_POSTGRES=1" >&2; exit 1; \
	else \
		echo "SKIPPED: the PostgreSQL run (no server answers at $(TEST_POSTGRES_URL)); set TEST_POSTGRES_URL to run it"; \
	fi

# Benchmarks: ratios against raw baselines measured in the same run, written to
# docs/PERFORMANCE.md. Uses its own databases (decisionflow_bench* on BENCH_POSTGRES_URL,
# default the local server, and a temporary SQLite file). Budget: 30 minutes on 2 cores; it
# prints its own wall time and each part's at the end. BENCH_ARGS="--only side" runs one part.
# The side-by-side benchmark runs the LangGraph peer (bench/peer/) in its own venv, .venv-peer,
# from requirements/peer.txt, and the DBOS peer (bench/peer/dbos/) in .venv-dbos, from
# requirements/dbos.txt; neither is ever installed in the project's venv.
BENCH_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432
BENCH_ARGS ?=
bench: $(VENV)/.bench .venv-peer/.installed .venv-dbos/.installed
	BENCH_POSTGRES_URL="$(BENCH_POSTGRES_URL)" $(PY) -m bench.run $(BENCH_ARGS)

.venv-peer/.installed: requirements/peer.txt
	$(PYTHON) -m venv .venv-peer
	.venv-peer/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements/peer.txt
	touch $@

.venv-dbos/.installed: requirements/dbos.txt
	$(PYTHON) -m venv .venv-dbos
	.venv-dbos/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements/dbos.txt
	touch $@

# The reliability battery (crashes at every step, two-host load, bad input, security), long
# version: 10 iterations per crash point on SQLite, 20 on PostgreSQL, 60 s of load on the
# decisionflow_load database, then 30 s of the same load through PgBouncer in transaction and
# in session mode, then 30 s of it with a private streaming replica whose standby stops mid-run,
# then 45 s of three hosts behind haproxy, PgBouncer and a streaming pair with one host killed
# (reliability/balancer.py), then 45 s of deliveries and notifications through two RQ workers
# on a private redis-server, one killed mid-send (reliability/broker.py); writes
# docs/RELIABILITY.md (~22-30 minutes on 2 cores).
reliability: $(VENV)/.bench pgbouncer postgresql-server haproxy redis
	TEST_POSTGRES_URL="$(TEST_POSTGRES_URL)" $(PY) reliability/run.py

clean:
	rm -rf $(VENV) .venv-peer .venv-dbos db.sqlite3 .pytest_cache .mypy_cache .ruff_cache
