"""What the sealed worker's environment holds: no credential alwayson knows, none a service
names, none a team withholds; and every secret the settings read is on the list."""

import ast
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from alwayson.egress.sealing import CREDENTIAL_VARIABLES, SEALED, seal_worker, sealed_environment
from tests.support.egress import services_for
from tests.support.paths import ROOT
from tests.support.sealed import readable_by_others

# Secret-looking settings the sealed worker keeps, and why.
KEPT = {
    # Public by Sentry's design (browsers send it); the worker reports its errors with it.
    "SENTRY_DSN",
}
SECRET_NAME = re.compile(r"SECRET|_KEY$|TOKEN$|PASSWORD$|_DSN$")


def env_names_read(path):
    """(parser, variable) for each `env.<parser>("NAME", ...)` in a settings module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "env"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            yield node.func.attr, node.args[0].value


def secret_envs_named_in_code():
    for path in (ROOT / "alwayson").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.keyword)
                and node.arg == "secret_env"
                and isinstance(node.value, ast.Constant)
                and node.value.value
            ):
                yield node.value.value


def test_every_secret_the_settings_read_is_withheld_from_the_sealed_worker():
    secrets = set()
    for module in (ROOT / "alwayson" / "settings").glob("*.py"):
        for parser, name in env_names_read(module):
            if parser in ("bearer_token", "email_config") or SECRET_NAME.search(name):
                secrets.add(name)
    assert {
        "SECRET_KEY",
        "ALWAYSON_GITHUB_SECRETS",
        "ALWAYSON_OUTBOX_SIGNING_SECRETS",
        "ANTHROPIC_API_KEY",
        "EMAIL_URL",
    } <= secrets
    assert secrets - KEPT <= CREDENTIAL_VARIABLES, sorted(secrets - KEPT - CREDENTIAL_VARIABLES)


def test_every_credential_the_code_reads_from_the_environment_is_withheld():
    named = set(secret_envs_named_in_code())
    assert {"ALWAYSON_SLACK_BOT_TOKEN", "ALWAYSON_TELEGRAM_BOT_TOKEN"} <= named
    assert named <= CREDENTIAL_VARIABLES


@pytest.fixture
def planted(settings):
    settings.ALWAYSON_EGRESS_SERVICES = services_for("http://127.0.0.1:9")
    settings.ALWAYSON_WORKER_WITHHOLD = ["ACME_CRM_KEY"]
    return {
        **{name: f"planted-{name.lower()}" for name in CREDENTIAL_VARIABLES},
        "PAYMENTS_TOKEN": "planted-payments",
        "MAPS_KEY": "planted-maps",
        "ACME_CRM_KEY": "planted-crm",
        "DATABASE_URL": "postgres://worker@db/alwayson",
        "ALWAYSON_EGRESS_SERVICES": '{"payments": {"secret_env": "PAYMENTS_TOKEN"}}',
        "PATH": "/usr/bin",
    }


def test_the_sealed_environment_holds_no_credential(planted):
    sealed = sealed_environment(planted)
    assert not [value for value in sealed.values() if value.startswith("planted-")]
    assert set(sealed) - {SEALED, "SECRET_KEY"} == {
        "DATABASE_URL",
        "ALWAYSON_EGRESS_SERVICES",
        "PATH",
    }
    assert sealed["DATABASE_URL"] == planted["DATABASE_URL"]
    assert sealed[SEALED] == "1"


def test_the_sealed_worker_connects_with_its_own_database_url_not_the_owners(planted):
    own = "postgres://alwayson_worker:its-own@db/alwayson"
    sealed = sealed_environment(
        {**planted, "ALWAYSON_WORKER_DATABASE_URL": own, "POSTGRES_PASSWORD": "planted-owner"}
    )
    assert sealed["DATABASE_URL"] == own
    assert "ALWAYSON_WORKER_DATABASE_URL" not in sealed
    assert planted["DATABASE_URL"] not in sealed.values()
    assert "POSTGRES_PASSWORD" not in sealed


def test_the_sealed_worker_gets_a_secret_key_of_its_own_each_time(planted):
    first, second = sealed_environment(planted), sealed_environment(planted)
    assert first["SECRET_KEY"] != planted["SECRET_KEY"]
    assert len(first["SECRET_KEY"]) >= 50 and first["SECRET_KEY"] != second["SECRET_KEY"]


def test_a_sealed_worker_handed_a_credential_refuses_to_start(planted, monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setenv(SEALED, "1")
    monkeypatch.setenv("PAYMENTS_TOKEN", planted["PAYMENTS_TOKEN"])
    with pytest.raises(ImproperlyConfigured, match="holds PAYMENTS_TOKEN") as refused:
        seal_worker()
    assert planted["PAYMENTS_TOKEN"] not in str(refused.value)


def test_a_sealed_worker_with_nothing_withheld_starts(planted, monkeypatch):
    monkeypatch.setenv(SEALED, "1")
    for name in (*CREDENTIAL_VARIABLES, "PAYMENTS_TOKEN", "MAPS_KEY", "ACME_CRM_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SECRET_KEY", "its-own-random-key")
    assert seal_worker() is None  # returns: no exec


def test_a_checkout_closed_to_other_users_is_refused_naming_the_directory():
    # Under /tmp, which everyone may enter (pytest's tmp_path is under a directory of mode 700).
    clone = Path(tempfile.mkdtemp(prefix="clone-", dir="/tmp"))
    try:
        (clone / "alwayson").mkdir()
        clone.chmod(0o700)
        with pytest.raises(RuntimeError, match=f"cannot enter {clone} \\(mode 700\\)"):
            readable_by_others(clone / "alwayson")

        clone.chmod(0o755)
        readable_by_others(clone / "alwayson")
    finally:
        shutil.rmtree(clone)
