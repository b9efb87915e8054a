"""Reproducible installs: the lock (requirements/*.txt) pins every dependency with its hashes and
agrees with the ranges in pyproject.toml, which stay for projects that embed alwayson; `make
install` (and so CI) installs from it, `make run` needs neither root nor a browser, and CI runs
a lane on the newest versions the ranges allow (docs/how-to/development.md).

The Makefile is read through `make -n` (what it would run, run by nothing) and `make -f -`
(the Makefile on standard input, so another user needs no access to this checkout).
"""

import os
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.paths import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCKS = ROOT / "requirements"
# Each lock file and what it holds: the product's dependencies, and the extras named.
EXTRAS = {"base.txt": [], "test.txt": ["test"], "bench.txt": ["test", "bench"]}
# The Pythons the lock must hold for: make install's python3, CI's newest lane and the image's.
PYTHONS = ["3.11.7", "3.12.1"]


def entries(name):
    """(name, version, marker or None, hashes) of each requirement in a lock file, its
    continuation lines joined."""
    text = re.sub(r"\\\n", " ", (LOCKS / name).read_text())
    found = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        requirement, _, options = line.partition(" --hash=")
        requirement = Requirement(requirement)
        hashes = re.findall(r"sha256:[0-9a-f]{64}", "--hash=" + options)
        found.append((requirement, hashes))
    return found


def pins(name, python):
    """{normalized name: version} of what a lock file installs on that Python (on Linux)."""
    environment = {"python_version": python.rsplit(".", 1)[0], "python_full_version": python}
    installed = {}
    for requirement, _ in entries(name):
        if requirement.marker is None or requirement.marker.evaluate(environment):
            [spec] = requirement.specifier
            installed[canonicalize_name(requirement.name)] = spec.version
    return installed


@pytest.mark.parametrize("name", EXTRAS)
def test_every_requirement_of_the_lock_is_pinned_with_its_hashes(name):
    found = entries(name)
    assert len(found) > 10, name
    for requirement, hashes in found:
        [spec] = requirement.specifier
        assert spec.operator == "==", requirement
        assert hashes, f"{requirement} has no hash"


def wanted(extras):
    """pyproject.toml's requirements for the product and those extras."""
    project = PROJECT["project"]
    lines = [*project["dependencies"]]
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("name", EXTRAS)
def test_the_lock_pins_a_version_in_every_range_of_pyproject(name, python):
    """A range changed in pyproject.toml without `make lock` fails here."""
    installed = pins(name, python)
    environment = {"python_version": python.rsplit(".", 1)[0], "python_full_version": python}
    outside = [
        f"{requirement} (the lock has {installed.get(canonicalize_name(requirement.name))})"
        for requirement in wanted(EXTRAS[name])
        if requirement.marker is None or requirement.marker.evaluate(environment)
        if not requirement.specifier.contains(
            installed.get(canonicalize_name(requirement.name), "0"), prereleases=True
        )
    ]
    assert outside == [], f"requirements/{name} on Python {python}: run `make lock`"


def test_the_lock_files_are_one_resolution():
    """base.txt and test.txt are bench.txt's pins, only fewer: whatever a venv installs of
    them, a package has one version."""
    for python in PYTHONS:
        bench, test, base = (pins(name, python) for name in ("bench.txt", "test.txt", "base.txt"))
        assert base.items() <= test.items() <= bench.items()


def test_the_image_s_lock_holds_the_build_backend():
    requires = [Requirement(line) for line in PROJECT["build-system"]["requires"]]
    built_in = (LOCKS / "build.in").read_text().splitlines()
    assert [str(r) for r in requires] == [
        line for line in built_in if line and not line.startswith("#")
    ]
    for python in PYTHONS:
        base = pins("base.txt", python)
        assert all(r.specifier.contains(base[canonicalize_name(r.name)]) for r in requires)


def test_the_lock_is_made_for_the_oldest_python_pyproject_allows():
    """`make lock` resolves for requires-python's lower bound on (markers pick per Python)."""
    oldest = re.fullmatch(r">=(\d+\.\d+)", PROJECT["project"]["requires-python"])[1]
    assert re.search(rf"--python-version {re.escape(oldest)}\b", make_n("lock"))
    assert pins("test.txt", "3.11.7")["django"].startswith("5.2.")
    assert pins("test.txt", "3.12.1")["django"].startswith("6.")


# What a `make` above this one (`make test` runs the suite) hands its sub-makes: its variables
# (DEPS=newest in CI's newest lane) and the "Entering directory" lines. The Makefile is read
# here as a person runs it, so neither reaches it, nor the Makefile's variables from outside.
MAKE_ENVIRONMENT = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "DEPS", "ADDR", "VENV")


def make_environment():
    return {name: value for name, value in os.environ.items() if name not in MAKE_ENVIRONMENT}


def make_n(*args):
    """What `make` would run for these targets and variables, forced (-B), run by nothing."""
    done = subprocess.run(
        ["make", "-n", "-B", *args, "VENV=/nonexistent/venv"],
        cwd=ROOT,
        env=make_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_make_install_installs_the_lock_with_hashes_then_alwayson_without_dependencies():
    commands = make_n("install").splitlines()
    pips = [line for line in commands if " -m pip install " in line]
    assert [p.split(" -m pip install ", 1)[1].split(None, 2)[-1] for p in pips] == [
        "--require-hashes -r requirements/test.txt",
        "--no-deps --no-build-isolation -e .",
    ]


def test_make_install_deps_newest_installs_from_the_ranges():
    pips = [line for line in make_n("install", "DEPS=newest").splitlines() if "pip install" in line]
    assert [p.split(" -m pip install ", 1)[1].split(None, 2)[-1] for p in pips] == [
        "--upgrade -r requirements/build.in",  # the build backend, from its range
        "--upgrade --upgrade-strategy eager --no-build-isolation -e '.[test]'",
    ]


def test_make_bench_installs_the_bench_lock_on_the_test_lock():
    pips = [line for line in make_n("bench").splitlines() if "pip install" in line]
    assert [line.rsplit(" -r ", 1)[-1] for line in pips if " -r " in line] == [
        "requirements/test.txt",
        "requirements/bench.txt",
    ]


def test_an_unknown_deps_is_refused_naming_the_choices():
    done = subprocess.run(
        ["make", "-n", "install", "DEPS=latest"],
        cwd=ROOT,
        env=make_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "DEPS must be lock (the default) or newest, not 'latest'" in done.stderr


def test_make_run_installs_nothing_outside_python_and_serves_where_addr_says():
    commands = make_n("run", "ADDR=127.0.0.1:8123")
    assert "apt-get" not in commands and "chromium" not in commands and "wrk" not in commands
    assert commands.splitlines()[-1].endswith("manage.py runall --demo --addr 127.0.0.1:8123")


def test_make_test_sees_to_chromium_and_wrk_then_runs_the_suite():
    commands = make_n("test")
    assert "apt-get install -y -qq chromium" in commands
    assert "apt-get install -y -qq wrk" in commands
    # On every core by default (pytest-xdist); WORKERS=0 keeps pytest's own process.
    assert commands.splitlines()[-1].endswith("-m pytest -n auto")
    assert make_n("test", "WORKERS=0").splitlines()[-1].endswith("-m pytest -n 0")


def run_as_another_user(argv, **kwargs):
    """argv as `nobody` when this is root (where apt-get would work), else as this user."""
    prefix = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*prefix, *argv],
        env=make_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


def test_make_test_without_root_or_chromium_says_in_one_line_what_to_install():
    missing = "/nonexistent/chromium"
    done = run_as_another_user(
        ["make", "-s", "-f", "-", "chromium", f"ALWAYSON_TEST_CHROMIUM={missing}"],
        input=(ROOT / "Makefile").read_text(),
        cwd="/",
    )
    assert done.returncode == 0, done.stderr  # the suite runs, and its browser tests fail
    [line] = done.stdout.splitlines()
    assert f"no Chromium at {missing}" in line
    assert "apt-get install chromium" in line and "ALWAYSON_TEST_CHROMIUM" in line
    assert done.stderr == ""


def test_ci_runs_the_suite_from_the_lock_and_on_the_newest_versions_the_ranges_allow():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "the newest versions pyproject.toml's ranges allow" in ci
    assert re.search(r'make install PYTHON="\$PY312" VENV=\.venv312 DEPS=newest', ci)
    assert re.search(r'make test PYTHON="\$PY312" VENV=\.venv312 DEPS=newest', ci)
    # The lock's lanes are `make test` with the default DEPS.
    assert re.search(r'suite "\$LOCKED_SQLITE" make test( |\n)', ci)
    assert re.search(r'suite "\$LOCKED_PG" env DATABASE_URL="\$PG_URL" make test( |\n)', ci)


def test_the_newest_lane_names_the_releases_the_lock_does_not_have(tmp_path):
    """.ci/newer_than_lock.py against a lock that pins this venv's pytest at another version."""
    from importlib.metadata import version

    lock = tmp_path / "lock.txt"
    lock.write_text(
        "pytest==0.0.1 \\\n    --hash=sha256:" + "0" * 64 + "\n"
        f"django=={version('django')} ; python_full_version >= '3.0'\n"
        "no-such-dist==1.0 ; sys_platform == 'no-such-platform'\n"
    )
    done = subprocess.run(
        [sys.executable, ROOT / ".ci" / "newer_than_lock.py", lock],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"  pytest {version('pytest')} (the lock has 0.0.1)" in done.stdout.splitlines()
    assert not re.search(r"^  django ", done.stdout, re.M)  # as the lock pins it
