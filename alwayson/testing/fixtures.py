"""The pytest fixtures of alwayson.testing (registered by `pytest_plugins =
["alwayson.testing"]`). They need pytest-django: `harness` asks for its `db` fixture, so a
test that uses it gets the database (and `@pytest.mark.django_db(transaction=True)` is
honoured); `scripted_model` sets its settings through pytest-django's `settings`.

Without Django settings pytest-django skips every such test ("no Django settings"), and a run
of skips exits 0, reading as a pass: the kit stops the run instead, saying what to set."""

import os
import sys

import pytest

FIXTURES = ("harness", "scripted_model", "scripted_mcp_server")

NO_SETTINGS = (
    "alwayson.testing: no Django settings, so pytest-django would skip every test that uses"
    " the kit. Name them: DJANGO_SETTINGS_MODULE=alwayson.settings python -m pytest ..."
    " (your project's settings module in a project of your own), or --ds=..., or"
    ' DJANGO_SETTINGS_MODULE = "..." under [tool.pytest.ini_options]'
    " (docs/how-to/testing-agents.md#setting-it-up)"
)
NO_PYTEST_DJANGO = (
    "alwayson.testing needs pytest-django (pip install pytest-django, or alwayson's `test`"
    " extra) and Django settings (docs/how-to/testing-agents.md#setting-it-up)"
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Stop the run, before any test, when a selected test uses the kit and pytest-django
    cannot give it a database (last, so a test deselected by -k or -m does not count)."""
    if not any(name in FIXTURES for item in items for name in getattr(item, "fixturenames", ())):
        return
    if not config.pluginmanager.hasplugin("django"):
        raise pytest.UsageError(NO_PYTEST_DJANGO)
    if not _django_settings_named():
        raise pytest.UsageError(NO_SETTINGS)


def _django_settings_named() -> bool:
    # pytest-django's own test (lazy_django.django_settings_is_configured): its --ds and ini
    # option land in this variable; a conftest may call settings.configure() instead.
    if os.environ.get("DJANGO_SETTINGS_MODULE"):
        return True
    from django.conf import settings

    return settings.configured


@pytest.fixture
def scripted_mcp_server(settings):
    """A ScriptedMcpServer named "tracker", started, that ALWAYSON_MCP_SERVERS names (with a
    time-out of 2 seconds: the time-out's test waits that long)."""
    from .mcp import ScriptedMcpServer

    server = ScriptedMcpServer("tracker").start()
    server.connect(settings, timeout=2)
    yield server
    server.stop()


@pytest.fixture
def scripted_model(settings):
    """A ScriptedModel the Claude agent reaches for the test; a request past its script
    fails the test."""
    from .model import ScriptedModel, forget_clients

    model = ScriptedModel().start()
    for name, value in model.settings.items():
        setattr(settings, name, value)
    forget_clients()
    yield model
    model.stop()
    forget_clients()
    assert not model.unexpected, f"the model got requests past its script: {model.unexpected}"


@pytest.fixture
def harness(request, db):
    """A started Harness, its clock pinned for the test. With `scripted_model` in the same
    test, `tool_calls()` reads that model's requests."""
    from .harness import Harness

    model = (
        request.getfixturevalue("scripted_model")
        if "scripted_model" in request.fixturenames
        else None
    )
    with Harness(model=model) as started:
        yield started


def pytest_terminal_summary(terminalreporter):
    """Every eval's table (alwayson/testing/evals.py), once more at the end of the session."""
    evals = sys.modules.get("alwayson.testing.evals")
    if evals is None or not evals.REPORTS:
        return
    terminalreporter.section("alwayson evals")
    for report in evals.REPORTS:
        terminalreporter.write_line(report.table())
        terminalreporter.write_line("")
