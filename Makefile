# Every target installs what it needs into .venv first; only Python >= 3.11 and the OS are assumed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo web test lint sql bench chaos scale clean

BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS  ?=
CHAOS_ARGS  ?=
SCALE_ARGS  ?=

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,embedded,web,metrics,schedules]'
	touch $(STAMP)

# The browser tests (tests/web/) drive Debian's chromium: installed here when it is missing.
install: $(STAMP)
	sh tools/install-chromium.sh

demo: $(STAMP)
	$(BIN)/bgq demo

# The operator console on the embedded PostgreSQL with demo data, open on loopback only.
web: $(STAMP)
	$(BIN)/bgq web --demo --no-auth --host 127.0.0.1 --port 8080

# The suite in TEST_WORKERS processes (pytest-xdist; most tests wait on servers and workers, so more
# processes than cores pay). TEST_WORKERS=0 runs it in this process, e.g. to debug one test.
# --dist worksteal: a process that runs out of tests takes pending ones from another, so a few
# long tests (real worker processes, tens of seconds) do not leave the others idle at the end.
TEST_WORKERS ?= 3
test: $(STAMP)
	sh tools/install-chromium.sh
	$(BIN)/python -m tools.scale --packages-only
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check bgq tests tools
	$(BIN)/ruff format --check bgq tests tools
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/sqlfluff lint db/mysql --dialect mysql
	$(BIN)/sqlfluff lint db/postgres --dialect postgres

# The rendered SQL of what install-procs installs (table background_job), checked in under
# docs/sql/ for DBAs and reviewers; tests/test_sql_rendering.py fails when it is not current.
sql: $(STAMP)
	rm -rf docs/sql
	$(BIN)/bgq sql --dialect mysql --write docs/sql/mysql
	$(BIN)/bgq sql --dialect postgres --write docs/sql/postgres

$(BENCH_STAMP): pyproject.toml tools/bench/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/pip install --quiet -e '.[dev]' -r tools/bench/requirements.txt
	touch $(BENCH_STAMP)

# bgq side by side with procrastinate, pgqueuer and celery; writes docs/benchmarks.md (~40 min on
# 2 cores). A smoke run: BENCH_ARGS="--quick --out /tmp/bench.md". The speed issue's table alone
# (~25 min): BENCH_ARGS="--cases a,b,c,d,f,cron --systems floor,bgq-pg-work,bgq-pg-broker:d,
# bgq-pg-cron,bgq-my-work,bgq-my-broker:d,bgq-my-cron,pgqueuer,procrastinate,celery,celery-confirm
# --latency 0 --no-head-timing" (one line; see tools/bench/run.py --help).
bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python tools/bench/run.py $(BENCH_ARGS)

# Fault injection judged by an independent oracle (tools/chaos/): the full preset, every mode, both
# dialects; writes docs/reliability.md. The reduced CI run: make chaos CHAOS_ARGS="--preset ci".
chaos: $(STAMP)
	$(BIN)/python -m tools.chaos --preset full $(CHAOS_ARGS)

# bgq on the engines users scale out to (tools/scale/): PgBouncer in transaction pooling, a
# PostgreSQL primary with a streaming standby, a 3-node MariaDB Galera cluster, a 3-node RabbitMQ
# cluster, each started on loopback ports (its Debian packages installed when missing), run through
# the chaos harness with its own faults and stopped by pid; writes docs/scale-out.md. The reduced
# CI run: make scale SCALE_ARGS="--preset ci".
scale: $(STAMP)
	$(BIN)/python -m tools.scale --preset full $(SCALE_ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) build dist *.egg-info .pytest_cache
