"""What a run may be granted, on either database: never a table an agent must not reach, never
the password hashes; and `workerrole` and the sealed worker's check on SQLite, which has no
roles. The grants themselves: test_workerrole_pg.py; a worker under them:
tests/processes/test_worker_role_pg.py."""

import logging
from types import SimpleNamespace

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session as LoginSession
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection

from alwayson.egress.models import EgressCall
from alwayson.ops.workerrole import (
    INSERT,
    SELECT,
    UPDATE,
    Reach,
    forbidden_tables,
    need,
    needs,
    scram_verifier,
)
from alwayson.runtime.management.commands.runworker import check_reach
from inbox.models import Event, Inbox, person_fields


@pytest.mark.parametrize(
    "model, privileges, fields, says",
    [
        (LoginSession, (SELECT,), None, "django_session (the web's sessions"),
        (EgressCall, (INSERT,), None, "alwayson_egresscall (the egress app's tables)"),
        (LogEntry, (SELECT,), None, "django_admin_log (the admin log)"),
        ("axes.AccessAttempt", (SELECT,), None, "axes_accessattempt (login attempts)"),
        (get_user_model(), (SELECT,), None, "the user table's password column"),
        (get_user_model(), (SELECT,), ["username", "password"], "password column"),
        (Inbox, ("TRUNCATE",), None, "privileges must be some of SELECT, INSERT"),
        (Inbox, (), None, "privileges must be some of"),
        (Inbox, (SELECT, INSERT), ["slug"], "a column list is for SELECT alone"),
    ],
)
def test_what_no_worker_may_reach_cannot_be_declared(model, privileges, fields, says):
    with pytest.raises(ValueError) as refused:
        need(model, *privileges, fields=fields)
    assert says in str(refused.value)


def test_a_table_declared_again_gets_both_declarations_privileges(monkeypatch):
    from alwayson.ops import workerrole

    monkeypatch.setattr(workerrole, "_needs", dict(workerrole._needs))
    # A team whose agent also stores events in its own inbox, outside its run.
    need(Event, INSERT, why="the agent stores follow-ups")
    [events] = [wanted for wanted in needs() if wanted.model is Event]
    assert events.privileges == (SELECT, INSERT, UPDATE)
    assert events.why.endswith("; the agent stores follow-ups")
    with pytest.raises(ValueError, match="declared once with a column list and once without"):
        need(Inbox, SELECT, fields=["slug"])


def test_nothing_a_run_needs_is_what_an_agent_must_not_reach():
    declared = {wanted.table for wanted in needs()}
    assert declared & set(forbidden_tables()) == set()
    [users] = [wanted for wanted in needs() if wanted.model is get_user_model()]
    assert "password" not in users.columns
    assert {"django_session", "alwayson_egresscall", "django_admin_log"} <= set(forbidden_tables())


def test_the_worker_reads_of_a_person_who_they_are_and_not_their_password():
    assert person_fields() == (
        "id",
        "username",
        "first_name",
        "last_name",
        "is_active",
        "is_staff",
        "is_superuser",
    )


def test_the_password_verifier_is_made_of_ascii_passwords_only():
    assert scram_verifier("pencil").startswith("SCRAM-SHA-256$4096:")
    assert scram_verifier("pencil") != scram_verifier("pencil")  # salted
    with pytest.raises(ValueError, match="must be ASCII"):
        scram_verifier("pâte")


def test_workerrole_on_sqlite_is_refused(monkeypatch):
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with pytest.raises(CommandError, match="workerrole needs PostgreSQL: SQLite has no roles"):
        call_command("workerrole", "alwayson_worker")


def test_a_sealed_worker_on_sqlite_says_it_reaches_every_table(monkeypatch, caplog):
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with caplog.at_level(logging.WARNING, logger="alwayson.worker"):
        check_reach()
    [line] = [r.getMessage() for r in caplog.records if r.name == "alwayson.worker"]
    assert line.startswith("a sealed worker on SQLite reaches every table")


def test_a_sealed_worker_waits_for_the_database_before_it_checks_its_role(monkeypatch, caplog):
    from alwayson.runtime.management.commands import runworker

    answers = [OperationalError("connection refused\nis the server running?"), Reach("worker")]

    def reach(conn):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    slept = []
    monkeypatch.setattr(connection, "vendor", "postgresql")
    monkeypatch.setattr(runworker, "reach", reach)
    monkeypatch.setattr(runworker, "time", SimpleNamespace(sleep=slept.append))
    with caplog.at_level(logging.INFO, logger="alwayson.worker"):
        check_reach()

    assert slept == [0.5]
    assert [r.getMessage() for r in caplog.records if r.name == "alwayson.worker"] == [
        "could not check the worker's database role (connection refused); again in 0.5s",
        "database role worker: reaches what a run needs and nothing more",
    ]
