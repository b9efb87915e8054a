#!/usr/bin/env python
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alwayson.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A bad setting is the operator's to fix, and the message says what to set: one line
        # and exit status 1, as Django prints a CommandError, not a traceback through its
        # start-up. --traceback shows where it was raised.
        if "--traceback" in sys.argv:
            raise
        sys.exit(f"ImproperlyConfigured: {exc}")


if __name__ == "__main__":
    main()
