"""Where things are: the repository's root (manage.py, deploy/, docs/) and the test data."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
DATA = TESTS / "data"
