# Two commands on a fresh clone: `make run` (set up, migrate, start the whole product on SQLite)
# and `make test`. DATABASE_URL switches the database (default: SQLite file alwayson.sqlite3).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Where `make run` serves: `make run ADDR=0.0.0.0:8000` to be reached from other hosts.
ADDR ?= 127.0.0.1:8000

.PHONY: install run scenarios test lint format bench bench-quick

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

install: $(VENV)/.installed
	@# The browser tests drive Debian's Chromium; Playwright cannot download a browser here.
	@# The bench's web rows (and their tests) drive Debian's wrk, a C load generator.
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)

run: install
	$(PY) manage.py runall --demo --addr $(ADDR)

scenarios: install
	$(PY) manage.py migrate --verbosity 0
	$(PY) manage.py scenarios

test: install
	$(PY) manage.py makemigrations --check --dry-run --verbosity 0
	$(PY) -m pytest

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	@# The layers (docs/explanation/architecture.md): no upward import, no cycle.
	$(VENV)/bin/lint-imports

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# Speed, side by side with each measure's reference in one run (PostgreSQL; BENCH_DATABASE_URL
# names a database the bench makes and drops, default .../bench): the table under fresh and
# marked statistics, each rate as a fraction of pgbench's ceiling, the web rows (wrk against
# the production web and gunicorn's sync workers), the live pages, then issue 36's goals;
# writes JSON. `make bench ONLY=webhook,live` runs those rows only (bench/run.py --help).
# The references (procrastinate) are a benchmark-only extra.
$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(PY) bench/run.py --json bench-results.json $(if $(ONLY),--only $(ONLY))

bench-quick: $(VENV)/.bench-installed
	$(PY) bench/run.py --quick --json bench-results.json $(if $(ONLY),--only $(ONLY))
