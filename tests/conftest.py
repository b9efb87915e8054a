"""Shared fixtures. Time is always passed explicitly: no test sleeps to move the clock."""

import os
import shutil
import tempfile
from datetime import timedelta

import pytest

from tests.support.clock import T0

# The project's tests use the kit it ships for agent authors (alwayson/testing/): its
# `harness` and `scripted_model` fixtures.
pytest_plugins = ["alwayson.testing"]

# A stranger's project with its own settings (DJANGO_SETTINGS_MODULE tests.embedded.settings):
# its suite runs in a process of its own, from tests/contracts/test_embedded_project.py.
collect_ignore = ["embedded"]


def pytest_configure(config):
    """The static files this session collects (tests/support/web.py's collect_static), and the
    production web processes it starts serve, in a directory of its own: another suite, or
    another worker of this one (`make test` runs several), rewrites its own."""
    config.alwayson_static_root = tempfile.mkdtemp(prefix="alwayson-static-")
    config.alwayson_outer_static_root = os.environ.get("ALWAYSON_STATIC_ROOT")
    os.environ["ALWAYSON_STATIC_ROOT"] = config.alwayson_static_root


def pytest_unconfigure(config):
    shutil.rmtree(config.alwayson_static_root, ignore_errors=True)
    if config.alwayson_outer_static_root is None:
        os.environ.pop("ALWAYSON_STATIC_ROOT", None)
    else:
        os.environ["ALWAYSON_STATIC_ROOT"] = config.alwayson_outer_static_root


def pytest_collection_modifyitems(config, items):
    """PostgreSQL-only tests (real parallel connections) are deselected on SQLite, not
    skipped: CI fails on any skip, and it runs the suite on both databases. Engine-free tests
    (a database of their own, or none: the same on either lane) are deselected on PostgreSQL,
    so CI, bound by CPU, runs them once. The chaos runs (the standard one and the failover,
    minutes each, clusters of their own) run only when asked for: `-m chaos`."""
    from django.conf import settings

    on_sqlite = not settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    chaos_asked = "chaos" in (config.getoption("markexpr") or "")
    keep, drop = [], []
    for item in items:
        skip = (
            (on_sqlite and item.get_closest_marker("postgres_only"))
            or (not on_sqlite and item.get_closest_marker("engine_free"))
            or (not chaos_asked and item.get_closest_marker("chaos"))
        )
        (drop if skip else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory):
    """On SQLite, a test database in a file rather than in memory. An in-memory database is
    one connection, which the live server's thread shares with the test's (pytest-django's
    live_server, as Django's LiveServerTestCase): a page's query still reading a table while
    the test's worker writes it fails at once with "database table is locked" (it did, in a
    browser test under load). In a file, each thread has its own connection, and they wait
    for each other as production's do (WAL, the busy timeout)."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        path = tmp_path_factory.mktemp("sqlite") / "test.sqlite3"
        database.setdefault("TEST", {})["NAME"] = str(path)


def pytest_sessionfinish(session, exitstatus):
    """In CI a skipped test is a failure: it hides a broken install step."""
    if os.environ.get("CI") and exitstatus == 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
        if skipped:
            reporter.write_line(f"CI: {skipped} test(s) skipped; failing the run.", red=True)
            session.exitstatus = 1


@pytest.fixture
def t0():
    return T0


@pytest.fixture
def ttl():
    from django.conf import settings

    return timedelta(seconds=settings.ALWAYSON_LEASE_TTL)


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create_user(username="owner", password="pw-owner-123")


@pytest.fixture
def make_inbox(django_user_model):
    counter = iter(range(1, 1_000_000))

    def make(slug=None, owner=None):
        from inbox.models import Inbox

        n = next(counter)
        if owner is None:
            owner, _ = django_user_model.objects.get_or_create(username=f"user-{n}")
        return Inbox.objects.create(owner=owner, slug=slug or f"inbox-{n}")

    return make


@pytest.fixture
def inbox(make_inbox):
    return make_inbox("desk")


@pytest.fixture
def loop_command():
    """A loop command sets, for the whole process, the "alwayson" log level and the default
    connection's settings (CONN_MAX_AGE, PostgreSQL's application_name): put them back."""
    import logging

    from django.db import connections

    logger = logging.getLogger("alwayson")
    level = logger.level
    db = connections.settings["default"]
    saved_db = {key: db[key] for key in ("CONN_MAX_AGE",) if key in db}
    options = db.setdefault("OPTIONS", {})
    saved_options = dict(options)
    yield
    logger.setLevel(level)
    db.update(saved_db)
    options.clear()
    options.update(saved_options)


@pytest.fixture
def messages_api(scripted_model, settings):
    """The test kit's scripted model (alwayson/testing/model.py), which the Claude agent
    reaches, with the test tools module registered and its call log emptied."""
    from tests.support import claude_tools

    settings.ALWAYSON_CLAUDE_TOOLS = ["tests.support.claude_tools"]
    claude_tools.CALLS.clear()
    claude_tools.CRASH_AFTER_REFUND.clear()
    claude_tools.WHILE_LOOKING_UP.clear()
    return scripted_model


@pytest.fixture
def claude_inbox(make_inbox):
    """An inbox whose own agent is Claude (the default agent stays the refund desk). Refunds
    under 50 run, larger ones ask; delete_account is denied."""
    from alwayson.claude.models import ModelSettings
    from alwayson.runtime.models import AgentConfig

    sent = ("max_tokens", "temperature", "thinking_budget", "tool_choice")

    def make(slug="support", **config):
        inbox = make_inbox(slug)
        config.setdefault(
            "policy",
            {
                "refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}],
                "lookup_order": "allow",
                "delete_account": "deny",
            },
        )
        settings = {name: config.pop(name) for name in sent if name in config}
        agent_config = AgentConfig.objects.create(
            inbox=inbox, agent="alwayson.claude.agent", **config
        )
        if settings:
            ModelSettings.objects.create(config=agent_config, **settings)
        return inbox

    return make


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """One busy inbox with a long history, many idle inboxes, and a little live work: what a
    worker's queries meet in production, in miniature (tests/support/plans.py builds it).
    Returns the busy inbox.

    Built once for the module inside a transaction that is rolled back at its end; each test
    runs in a savepoint within it (pytest-django nests its per-test atomic block).
    """
    from django.db import transaction

    from inbox.models import Inbox
    from tests.support.plans import build_world

    with django_db_blocker.unblock(), transaction.atomic():
        build_world()
        yield Inbox.objects.get(slug="busy")
        transaction.set_rollback(True)


# The real hasher costs most of a second of CPU per password (148 `owner`s alone): the suite
# hashes with MD5 throughout. A server the tests start in a process of its own checks with
# its real hashers: a test whose users log in there asks for `real_passwords`.
FAST_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session", autouse=True)
def fast_passwords():
    from django.test.utils import override_settings

    with override_settings(PASSWORD_HASHERS=FAST_HASHERS):
        yield


@pytest.fixture
def real_passwords(settings):
    """Django's own hashers, for users whose password a server process checks."""
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
