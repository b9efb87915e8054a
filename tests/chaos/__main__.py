"""`python -m tests.chaos [--seconds 60] [--seed N] ...`, from the repository's root."""

import os
import sys

import django


def main(argv):
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alwayson.settings")
    django.setup()
    # The run's modules read the models, which exist only once Django is set up.
    from .command import Command

    Command().run_from_argv(["python -m tests.chaos", "chaos", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
