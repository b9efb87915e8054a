"""`manage.py workerrole` on PostgreSQL: the role it makes reaches what a run needs and nothing
more, a second run changes nothing and takes back what was granted since, its password never
reaches the server as text, and it refuses what it cannot make safe. Each test's roles are
made inside its transaction, rolled back with it: nothing is left in the cluster."""

import base64
import io
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from alwayson.ops.workerrole import needs, reach, scram_verifier

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db]

ROLE = "alwayson_worker_unit"


def workerrole(*args, **options):
    out = io.StringIO()
    call_command("workerrole", *args, stdout=out, **options)
    return out.getvalue().splitlines()


def sql(statement, params=None):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else None


def may(privilege, table, column=None):
    if column:
        held = sql("SELECT has_column_privilege(%s, %s, %s, %s)", [ROLE, table, column, privilege])
    else:
        held = sql("SELECT has_table_privilege(%s, %s, %s)", [ROLE, table, privilege])
    return held[0][0]


def test_workerrole_makes_a_role_that_reaches_what_a_run_needs_and_nothing_more():
    lines = workerrole(ROLE, "--login")

    assert lines[0] == f"created role {ROLE} (LOGIN)"
    assert lines[1] == "revoked every privilege on the tables of schema public"
    assert "granted SELECT, UPDATE on inbox_event" in lines
    assert lines[-1] == f"checked: {ROLE} reaches what a run needs and nothing more"
    assert reach(connection, ROLE).right
    assert sql("SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = %s", [ROLE]) == [
        (True, False)
    ]
    # What an agent must not read: sessions, password hashes, login attempts, egress, admin.
    for table in ("django_session", "axes_accessattempt", "alwayson_egresscall"):
        assert not may("SELECT", table), table
    assert not may("SELECT", "django_admin_log")
    assert not may("SELECT", "auth_user", "password")
    assert not may("SELECT", "auth_user", "email")
    assert may("SELECT", "auth_user", "username")
    # What a run does, and only that.
    assert may("UPDATE", "inbox_event") and not may("DELETE", "inbox_event")
    assert not may("INSERT", "inbox_event")  # a run stores no event
    assert may("INSERT", "outbox_outboxmessage") and not may("UPDATE", "outbox_outboxmessage")
    assert not may("SELECT", "outbox_channel")  # the dispatcher's, with its URLs
    assert not may("SELECT", "alwayson_passwordresetrequest")


def test_workerrole_again_changes_nothing_and_takes_back_what_was_granted_since():
    first = workerrole(ROLE, "--login")
    sql(f"GRANT SELECT ON django_session TO {ROLE}")
    sql(f"GRANT DELETE, TRUNCATE ON inbox_event TO {ROLE}")
    sql(f"GRANT SELECT (password) ON auth_user TO {ROLE}")
    sql(f"REVOKE UPDATE ON inbox_lease FROM {ROLE}")
    found = reach(connection, ROLE)
    assert found.excess[:2] == [
        "auth_user.password: SELECT (password hashes)",
        "django_session: SELECT (the web's sessions: a session key logs in as its user)",
    ]
    assert "inbox_event: DELETE" in found.excess and "inbox_event: TRUNCATE" in found.excess
    assert found.missing == ["inbox_lease: UPDATE"]

    again = workerrole(ROLE)

    assert again[0] == f"role {ROLE} exists"
    assert again[1:] == first[1:]
    assert reach(connection, ROLE).right


def test_the_check_says_what_the_role_reaches_beyond_and_lacks_and_what_fixes_it():
    workerrole(ROLE)
    sql(f"GRANT SELECT ON django_session TO {ROLE}")
    sql(f"REVOKE UPDATE ON inbox_event FROM {ROLE}")

    problem = reach(connection, ROLE).problem()

    assert problem == (
        f"the worker's database role {ROLE} reaches what a run must not (django_session: "
        "SELECT (the web's sessions: a session key logs in as its user)) and lacks what a "
        "run needs (inbox_event: UPDATE): run `manage.py workerrole "
        f"{ROLE}` as the tables' owner after migrate "
        "(docs/how-to/egress.md#the-workers-database-role)"
    )


def test_the_check_refuses_a_superuser_a_role_maker_and_a_member_of_the_owner():
    assert reach(connection).grave == ["is a superuser"]  # the test's own connection
    assert "is a superuser, so it reaches every table" in reach(connection).problem()
    sql("CREATE ROLE alwayson_worker_maker CREATEROLE")
    assert reach(connection, "alwayson_worker_maker").grave == ["may create roles (CREATEROLE)"]
    workerrole(ROLE)
    [[owner]] = sql("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'inbox_event'")
    sql(f"GRANT {connection.ops.quote_name(owner)} TO {ROLE}")
    assert reach(connection, ROLE).grave == [f"is a member of {owner}, their owner"]


def test_a_privilege_granted_to_public_is_refused_not_hidden():
    sql("GRANT SELECT ON django_session TO PUBLIC")

    with pytest.raises(CommandError) as refused:
        workerrole(ROLE)

    assert str(refused.value) == (
        f"{ROLE} still reaches what a run must not once its own grants are revoked "
        "(django_session: SELECT (the web's sessions: a session key logs in as its user)): "
        "granted to PUBLIC or to a role it is a member of; revoke them there "
        "(docs/how-to/egress.md#the-workers-database-role)"
    )
    # Rolled back: nothing was made.
    assert sql("SELECT 1 FROM pg_roles WHERE rolname = %s", [ROLE]) == []


def stored_verifier(role):
    [[verifier]] = sql("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [role])
    return verifier


def same_password(verifier, password):
    """Whether `verifier` was made of `password`: made again with its own salt."""
    iterations, salt = re.match(r"SCRAM-SHA-256\$(\d+):([^$]+)\$", verifier).groups()
    return scram_verifier(password, base64.b64decode(salt), int(iterations)) == verifier


def test_the_verifier_is_the_one_postgresql_makes_of_the_same_password():
    sql(f"CREATE ROLE {ROLE} PASSWORD 'correct horse battery staple'")
    made_by_postgresql = stored_verifier(ROLE)
    assert same_password(made_by_postgresql, "correct horse battery staple")
    assert not same_password(made_by_postgresql, "correct horse battery stapler")


def test_the_password_comes_from_the_environment_and_reaches_the_server_hashed(monkeypatch):
    monkeypatch.setenv("WORKER_DB_PASSWORD", "s3cret-from-env")

    lines = workerrole(ROLE, "--login", "--password-from-env", "WORKER_DB_PASSWORD")

    assert lines[0] == f"created role {ROLE} (LOGIN, password set)"
    assert same_password(stored_verifier(ROLE), "s3cret-from-env")
    assert "s3cret-from-env" not in "\n".join(lines)


def test_without_a_name_the_role_is_the_user_of_the_workers_database_url(settings):
    settings.ALWAYSON_WORKER_DATABASE_URL = (
        f"postgres://{ROLE}:p%40ss-w0rd@127.0.0.1:5432/{connection.settings_dict['NAME']}"
    )

    lines = workerrole()

    assert lines[0] == f"created role {ROLE} (LOGIN, password set)"
    assert same_password(stored_verifier(ROLE), "p@ss-w0rd")
    assert reach(connection, ROLE).right


@pytest.mark.parametrize(
    "args, says",
    [
        ((), "name the role (manage.py workerrole alwayson_worker), or set "),
        (("Worker",), "role must be a lower-case name of letters, digits and _"),
        (("pg_worker",), "role must be a lower-case name"),
        ((ROLE, "--password-from-env", "NOT_SET_ANYWHERE"), "NOT_SET_ANYWHERE is not set"),
    ],
)
def test_workerrole_refuses_what_it_cannot_make(args, says, settings):
    settings.ALWAYSON_WORKER_DATABASE_URL = ""
    with pytest.raises(CommandError, match=re.escape(says)):
        workerrole(*args)


def test_workerrole_refuses_the_user_it_connects_as_and_a_superuser():
    [[me]] = sql("SELECT current_user")
    with pytest.raises(CommandError, match=f"role {me} is the user this command connects as"):
        workerrole(me)
    sql("CREATE ROLE alwayson_worker_super SUPERUSER")
    with pytest.raises(CommandError) as refused:
        workerrole("alwayson_worker_super")
    assert str(refused.value) == (
        "role alwayson_worker_super is a superuser: no grant can limit what it reaches; name "
        "a role of the worker's own (docs/how-to/egress.md#the-workers-database-role)"
    )


def test_without_the_right_to_make_roles_it_says_what_is_needed():
    sql("CREATE ROLE alwayson_worker_nobody")
    sql("SET ROLE alwayson_worker_nobody")
    try:
        with pytest.raises(CommandError) as refused:
            workerrole(ROLE)
    finally:
        sql("RESET ROLE")
    assert str(refused.value) == (
        "permission denied to create role: run workerrole as the tables' owner (the user "
        "migrate runs as), with the right to create roles (CREATEROLE) while the role is missing"
    )


def test_every_table_a_run_needs_exists_after_migrate():
    tables = {table for [table] in sql("SELECT tablename FROM pg_tables")}
    assert {wanted.table for wanted in needs()} <= tables
