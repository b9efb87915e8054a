#!/usr/bin/env python
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alwayson.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db import OperationalError

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A bad setting is the operator's to fix, and the message says what to set: one line
        # and exit status 1, as Django prints a CommandError, not a traceback through its
        # start-up. --traceback shows where it was raised.
        if "--traceback" in sys.argv:
            raise
        sys.exit(f"ImproperlyConfigured: {exc}")
    except OperationalError as exc:
        # So is a database that does not exist, met by any command (migrate first): the line
        # says how to create it, the same line a loop command prints.
        from alwayson.ops.database import missing_database

        message = missing_database(exc)
        if message is None or "--traceback" in sys.argv:
            raise
        sys.exit(f"CommandError: {message}")


if __name__ == "__main__":
    main()
