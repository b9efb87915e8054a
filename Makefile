# Two commands on a fresh clone: `make run` (set up, migrate, start the whole product on SQLite)
# and `make test`. DATABASE_URL switches the database (default: SQLite file alwayson.sqlite3).
# The options (docs/how-to/development.md): ADDR, where `make run` serves (`make run
# ADDR=0.0.0.0:8000` to be reached from other hosts); PYTHON and VENV, which Python and which
# virtualenv; DEPS=newest, the newest versions pyproject.toml's ranges allow instead of the lock;
# WORKERS, how many processes `make test` runs the suite in (pytest-xdist's -n: auto, one per
# core; 0, in pytest's own process, for a debugger).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ADDR ?= 127.0.0.1:8000
DEPS ?= lock
WORKERS ?= auto
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: install run scenarios test chromium wrk lint format bench bench-quick lock

ifeq ($(filter $(DEPS),lock newest),)
$(error DEPS must be lock (the default) or newest, not '$(DEPS)')
endif

# The virtualenv, remade when pyproject.toml or the lock changes. From the lock
# (requirements/test.txt: the product's dependencies and the test extra, each pinned with its
# hashes), then alwayson itself, editable and without dependencies; the build backend is in
# the lock too, so nothing unpinned is fetched. DEPS=newest installs what pyproject.toml's
# ranges allow, newest first: what a project that embeds alwayson gets (CI runs a lane of it).
# Both build in the venv, not in an isolated one: that wrote alwayson.egg-info into the
# checkout, whose version, never updated, shadows the installed one for anything run from here
# (manage.py, pytest); an old one is removed.
$(VENV)/.installed-lock: pyproject.toml requirements/test.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) --require-hashes -r requirements/test.txt
	rm -rf alwayson.egg-info
	$(PIP) --no-deps --no-build-isolation -e .
	touch $@

$(VENV)/.installed-newest: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade -r requirements/build.in
	rm -rf alwayson.egg-info
	$(PIP) --upgrade --upgrade-strategy eager --no-build-isolation -e '.[test]'
	touch $@

# Python only: no root, no browser. The tools the tests need besides Python are `make test`'s.
install: $(VENV)/.installed-$(DEPS)

run: install
	$(PY) manage.py runall --demo --addr $(ADDR)

scenarios: install
	$(PY) manage.py migrate --verbosity 0
	$(PY) manage.py scenarios

# The tools outside Python that some tests drive: Debian's Chromium (tests/browser/, through
# Playwright, which cannot download a browser here) and wrk (the bench's web rows and their
# tests). Installed with apt where this runs as root on Debian; anywhere else one line says
# what to install, and the tests that need the tool then fail (they never skip).
CHROMIUM := $(or $(ALWAYSON_TEST_CHROMIUM),/usr/bin/chromium)
APT := [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq

chromium:
	@[ -x "$(CHROMIUM)" ] || { $(APT) chromium || echo "make test: no Chromium at $(CHROMIUM), so the browser tests (tests/browser/) will fail: install it as root (Debian: apt-get install chromium) or set ALWAYSON_TEST_CHROMIUM to a Chromium or Chrome binary"; }

wrk:
	@command -v wrk >/dev/null || { $(APT) wrk || echo "make: wrk is not installed, so the bench's web rows and their tests (tests/bench/test_web_bench.py) will fail: install it as root (Debian: apt-get install wrk; macOS: brew install wrk)"; }

test: install chromium wrk
	$(PY) manage.py makemigrations --check --dry-run --verbosity 0
	$(PY) -m pytest -n $(WORKERS)

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
# The references (procrastinate) are a benchmark-only extra, locked in requirements/bench.txt.
$(VENV)/.bench-installed-lock: $(VENV)/.installed-lock requirements/bench.txt
	$(PIP) --require-hashes -r requirements/bench.txt
	touch $@

$(VENV)/.bench-installed-newest: $(VENV)/.installed-newest
	$(PIP) --upgrade --upgrade-strategy eager --no-build-isolation -e '.[test,bench]'
	touch $@

bench: $(VENV)/.bench-installed-$(DEPS) wrk
	$(PY) bench/run.py --json bench-results.json $(if $(ONLY),--only $(ONLY))

bench-quick: $(VENV)/.bench-installed-$(DEPS) wrk
	$(PY) bench/run.py --quick --json bench-results.json $(if $(ONLY),--only $(ONLY))

# The lock, requirements/: base.txt (the product's dependencies and its build backend: the
# image installs it), test.txt (and the test extra: make install, CI) and bench.txt (and the
# bench extra). One resolution (bench.txt's; the others are constrained to it) that holds on
# every Python the project supports: where a pin differs by Python, a marker picks it (Django
# 5.2 below 3.12, 6.x from it). `make lock` resolves again to the newest versions the ranges in
# pyproject.toml allow, with uv (in a virtualenv of its own); review the diff, `make test`,
# commit. Only the lock's making needs uv: installing from it needs pip alone.
UV_VERSION := 0.13.9
LOCK_VENV := .venv-lock
COMPILE := $(LOCK_VENV)/bin/uv pip compile --quiet --upgrade --universal --python-version 3.11 \
	--generate-hashes --annotation-style line --custom-compile-command "make lock"

lock:
	[ -x $(LOCK_VENV)/bin/uv ] && $(LOCK_VENV)/bin/uv --version | grep -q " $(UV_VERSION) " \
		|| { $(PYTHON) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install --quiet uv==$(UV_VERSION); }
	$(COMPILE) pyproject.toml --extra test --extra bench -o requirements/bench.txt
	$(COMPILE) pyproject.toml --extra test -c requirements/bench.txt -o requirements/test.txt
	$(COMPILE) pyproject.toml requirements/build.in -c requirements/bench.txt -o requirements/base.txt
