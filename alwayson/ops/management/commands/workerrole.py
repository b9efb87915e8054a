"""`manage.py workerrole [ROLE]`: the sealed worker's PostgreSQL role, reaching only what a run
needs (alwayson/ops/workerrole.py). Run as the tables' owner after every migrate: a release
that adds a table a run needs grants it here."""

import os

import environ
from django.conf import settings
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from psycopg import errors, sql

from alwayson.command import AlwaysonCommand
from alwayson.ops.workerrole import DOCS, ROLE_NAME, grants, reach, scram_verifier


class Command(AlwaysonCommand):
    help = (
        "Make (if missing) the sealed worker's PostgreSQL role and grant it exactly the tables, "
        "columns and sequences a run needs, revoking the rest; then check it. Idempotent; run "
        "it as the tables' owner after migrate."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "role",
            nargs="?",
            help="the role's name; default: the user of ALWAYSON_WORKER_DATABASE_URL, made a "
            "login role with that URL's password",
        )
        parser.add_argument(
            "--login", action="store_true", help="the role may log in (a role named here)"
        )
        parser.add_argument(
            "--password-from-env",
            metavar="NAME",
            help="set the role's password from this environment variable (never from the "
            "command line, which other users can read)",
        )

    def handle(self, *args, role, login, password_from_env, **options):
        if connection.vendor != "postgresql":
            raise CommandError(
                "workerrole needs PostgreSQL: SQLite has no roles, and whoever can read its "
                "file reads every table"
            )
        role, login, password = self.wanted(role, login, password_from_env)
        verifier = None
        if password is not None:
            try:
                verifier = scram_verifier(password)
            except ValueError as exc:
                raise CommandError(f"the role's password: {exc}") from None
        try:
            with transaction.atomic():
                done = self.make_role(role, login, verifier)
                for statement, said in grants(connection, role):
                    with connection.cursor() as cursor:
                        cursor.execute(statement)
                    if said:
                        done.append(said)
                found = reach(connection, role)
                if found.excess and not found.grave:
                    # Rolled back: a role that would still reach too much is left as it was.
                    raise CommandError(
                        f"{role} still reaches what a run must not once its own grants are "
                        f"revoked ({'; '.join(found.excess)}): granted to PUBLIC or to a role "
                        f"it is a member of; revoke them there ({DOCS})"
                    )
                if found.grave:
                    raise CommandError(
                        f"role {role} {'; '.join(found.grave)}: no grant can limit what it "
                        f"reaches; name a role of the worker's own ({DOCS})"
                    )
                if not found.right:
                    raise CommandError(found.problem())
        except DatabaseError as exc:
            raise CommandError(self.refused(exc)) from None
        for line in done:
            self.stdout.write(line)
        self.stdout.write(f"checked: {role} reaches what a run needs and nothing more")

    def wanted(self, role, login, password_from_env):
        """The role's name, whether it logs in, and its password (None: left as it is)."""
        password = None
        if password_from_env:
            password = os.environ.get(password_from_env)
            if not password:
                raise CommandError(f"--password-from-env: {password_from_env} is not set")
        if role is None:
            url = settings.ALWAYSON_WORKER_DATABASE_URL
            if not url:
                raise CommandError(
                    "name the role (manage.py workerrole alwayson_worker), or set "
                    f"ALWAYSON_WORKER_DATABASE_URL to the URL the worker connects with ({DOCS})"
                )
            # Read as the settings read it (they refused a URL without a user at start-up).
            config = environ.Env.db_url_config(url)
            role, login = config["USER"], True
            if password is None and config.get("PASSWORD"):
                password = config["PASSWORD"]  # percent-decoded already
        if not ROLE_NAME.fullmatch(role):
            raise CommandError(
                f"role must be a lower-case name of letters, digits and _ (not starting with "
                f"pg_, at most 63), not {role!r}"
            )
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            [me] = cursor.fetchone()
        if role == me:
            raise CommandError(
                f"role {role} is the user this command connects as (the tables' owner): the "
                "worker needs a role of its own"
            )
        return role, login, password

    def make_role(self, role, login, verifier) -> list[str]:
        """Create the role if it is missing, or set what was asked of an existing one; what
        was done, in words."""
        name = sql.Identifier(role)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            exists = cursor.fetchone() is not None
            options = sql.SQL(" LOGIN" if login else "")
            if verifier is not None:
                options += sql.SQL(" PASSWORD {}").format(sql.Literal(verifier))
            said = ", ".join(
                filter(None, ["LOGIN" if login else "", "password set" if verifier else ""])
            )
            if not exists:
                if not login:
                    options += sql.SQL(" NOLOGIN")
                cursor.execute(sql.SQL("CREATE ROLE {}{}").format(name, options).as_string())
                return [f"created role {role} ({said or 'NOLOGIN'})"]
            if login or verifier is not None:
                cursor.execute(sql.SQL("ALTER ROLE {}{}").format(name, options).as_string())
                return [f"role {role} exists: {said}"]
            return [f"role {role} exists"]

    def refused(self, exc) -> str:
        cause = exc.__cause__
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(cause, errors.InsufficientPrivilege):
            return (
                f"{message}: run workerrole as the tables' owner (the user migrate runs as), "
                "with the right to create roles (CREATEROLE) while the role is missing"
            )
        return message
