"""The wheel carries what alwayson's apps read from their own folders: their templates, the
pages' static files, the inbox's SQL and startagent's templates; a project that installs
alwayson from it needs nothing of the checkout (docs/how-to/embed-in-a-project.md).

The wheel is built offline from a copy of the sources, with this venv's setuptools (the test
extra's), in about a second."""

import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version

from tests.support.paths import ROOT

PACKAGES = ["alwayson", "inbox", "timers", "approvals", "outbox"]
# Folders of data, not modules, that the apps read at run time.
DATA_FOLDERS = ["templates", "static", "sql", "agent_templates"]


def data_files():
    """Every file inside a data folder of a package, as the wheel names it."""
    found = set()
    for package in PACKAGES:
        for folder in (ROOT / package).rglob("*"):
            if folder.is_dir() and folder.name in DATA_FOLDERS:
                found |= {
                    p.relative_to(ROOT).as_posix()
                    for p in folder.rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts
                }
    return found


def build_wheel(tmp_path) -> set[str]:
    source = tmp_path / "source"
    source.mkdir()
    for name in ["pyproject.toml", "README.md"]:
        shutil.copy(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "--quiet", "--wheel-dir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [wheel] = out.glob("alwayson-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_carries_every_app_s_templates_and_static_files(tmp_path):
    setuptools = version("setuptools")
    assert int(setuptools.split(".")[0]) >= 77, f"setuptools {setuptools}: run `make install`"
    expected = data_files()
    assert {
        "alwayson/web/templates/alwayson/base.html",
        "alwayson/web/static/alwayson/site.css",
        "approvals/templates/approvals/detail.html",
        "inbox/templates/admin/inbox/event/change_form.html",
        "inbox/sql/claim.sql",
    } <= expected

    wheel = build_wheel(tmp_path)

    assert sorted(expected - wheel) == []
    # The project's own templates (templates/ at the top) and the suite stay out.
    assert not any(name.startswith(("templates/", "tests/")) for name in wheel)
