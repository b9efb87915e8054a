"""The sealed worker's database role from a test: made by `manage.py workerrole` under a name
no other test run uses (roles are the cluster's, not the database's), dropped afterwards;
and agents that use every verb a run has, or reach for what the role must keep from them."""

import contextlib
import io
import json
import os
import secrets
from urllib.parse import quote

from django.core.management import call_command
from django.db import connection

from tests.support.processes import database_url


def role_url(role) -> str:
    """The test database's URL, as `role` connects to it."""
    owner = database_url()
    return f"postgres://{quote(role, safe='')}@{owner.split('@', 1)[1]}"


@contextlib.contextmanager
def worker_role():
    """A role made by `workerrole` for this test run alone: (its name, its URL). Dropped at
    the end with every grant it holds, whatever the test did."""
    role = f"alwayson_worker_t{os.getpid()}_{secrets.token_hex(4)}"
    out = io.StringIO()
    call_command("workerrole", role, "--login", stdout=out)
    try:
        yield role, role_url(role)
    finally:
        drop_role(role)


def drop_role(role):
    """Drop a role this test run made: its grants in the test database, then the role."""
    name = connection.ops.quote_name(role)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        if cursor.fetchone() is None:
            return
        # Its sessions first: a role that is connected cannot be dropped.
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        cursor.execute(f"DROP OWNED BY {name}")
        cursor.execute(f"DROP ROLE {name}")


# --- agents --------------------------------------------------------------------------------------


def current_user() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        return cursor.fetchone()[0]


def verbs_agent(run):
    """Each event's payload says which verb to use; the run then says, as its last message,
    which database role it ran as and what it saw of its session state."""
    for event in run.events:
        do = event.payload.get("do")
        if do == "say":
            run.say(f"said for {event.source_id}")
        elif do == "ask":
            run.ask(f"ask-{event.source_id}", "refund order 7", 3600, details={"amount": 5})
        elif do == "ask-group":
            run.ask(f"ask-{event.source_id}", "refund order 8", 3600, group="turn-1")
        elif do == "schedule":
            run.schedule(f"remind-{event.source_id}", delay=3600, payload={"about": "7"})
        elif do == "remember":
            run.state["remembered"] = run.state.get("remembered", 0) + 1
        elif do == "defer":
            run.defer("the service is down", delay=3600)
        elif event.source == "approval":
            run.say(f"{event.source_id} was answered {event.payload.get('answer')}")
        run.renew()
    run.say(
        json.dumps(
            {
                "role": current_user(),
                "database_url": os.environ.get("DATABASE_URL"),
                "state": run.state,
            }
        )
    )


# What the agent below reaches for, by the event's payload: each must be refused.
FORBIDDEN_READS = {
    "sessions": "SELECT session_key, session_data FROM django_session",
    "passwords": "SELECT username, password FROM auth_user",
    "login-attempts": "SELECT username, ip_address FROM axes_accessattempt",
    "egress": "SELECT service, path FROM alwayson_egresscall",
    "admin-log": "SELECT object_repr, change_message FROM django_admin_log",
}


def forbidden_agent(run):
    """Reads what its event names (FORBIDDEN_READS, or every user through the ORM, which
    loads the password hash), and says whatever it got."""
    from django.contrib.auth import get_user_model

    for event in run.events:
        what = event.payload["read"]
        if what == "users":
            got = [(user.username, user.password) for user in get_user_model().objects.all()]
        else:
            with connection.cursor() as cursor:
                cursor.execute(FORBIDDEN_READS[what])
                got = cursor.fetchall()
        run.say(json.dumps(got, default=str))
