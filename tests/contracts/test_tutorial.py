"""The tutorial cannot rot: every code block of docs/tutorial/first-agent.md is put there by
docs/tutorial/build.py from the files beside it, which run as tests (testpaths); the MCP
how-to shows the demo's MCP server as its file holds it (the browser test runs that file).
Plain file reads, no database."""

import importlib.util
import re

import pytest

from tests.support.paths import ROOT

TUTORIAL = ROOT / "docs" / "tutorial"


def builder():
    spec = importlib.util.spec_from_file_location("tutorial_build", TUTORIAL / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_shows_exactly_what_its_files_hold():
    build = builder()
    page = build.PAGE.read_text(encoding="utf-8")
    assert build.built(page) == page, "run python docs/tutorial/build.py"
    assert build.main(["--check"]) == 0


def test_every_code_block_on_the_page_comes_from_a_file():
    page = (TUTORIAL / "first-agent.md").read_text(encoding="utf-8")
    fences = re.findall(r"^(.*)\n```python$", page, re.MULTILINE)
    assert fences, "the page shows no code"
    assert all(line.startswith("<!-- code: ") for line in fences), fences


def test_every_file_the_page_shows_is_run_as_tests():
    import tomllib

    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"
    ]["testpaths"]
    assert "docs/tutorial" in testpaths
    page = (TUTORIAL / "first-agent.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"<!-- code: ([\w.-]+)", page))
    tests = {path.name for path in TUTORIAL.glob("test_*.py")}
    # Each module the page shows has its tests there, and every test file is shown.
    assert tests <= shown
    assert {f"test_{name}" for name in shown if not name.startswith("test_")} == tests


def test_a_stale_page_is_found_and_rebuilt(tmp_path, monkeypatch):
    build = builder()
    page = build.PAGE.read_text(encoding="utf-8")
    stale = page.replace("run.say(f\"Hello {event.payload['from']}", 'run.say(f"Hi {x}', 1)
    assert stale != page
    assert build.built(stale) == page
    monkeypatch.setattr(build, "PAGE", tmp_path / "first-agent.md")
    build.PAGE.write_text(stale, encoding="utf-8")
    assert build.main(["--check"]) == 1
    assert build.main([]) == 0
    assert build.PAGE.read_text(encoding="utf-8") == page


def test_a_region_that_is_not_marked_once_is_an_error():
    with pytest.raises(ValueError, match="region 'nowhere' must be marked once"):
        builder().code("desk_1_reply.py", "nowhere")


def test_the_mcp_how_to_shows_the_demo_server_as_its_file_holds_it():
    page = (ROOT / "docs" / "how-to" / "mcp-demo-inbox.md").read_text(encoding="utf-8")
    source = (ROOT / "alwayson" / "demo" / "orders_mcp.py").read_text(encoding="utf-8")
    assert f"```python\n{source}```\n" in page, "copy alwayson/demo/orders_mcp.py into the page"
