"""The demo login's password: made once, kept in a file, the same on every `make run`.

A new password on every run logged out a browser that was logged in (a session is tied to
the password it was opened with). The password is kept beside the SQLite database (git-ignored
with it: `/*.sqlite3-*`), or for another database in the checkout (`/.demo-password`), readable
by its owner only; whichever database `demologin` runs against, its demo user gets that
password. Delete the file for a new one. Development only: `demologin` refuses with DEBUG off.
"""

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.db import connection


def password_file(database=None) -> Path:
    """Where the password of `database` (default: the default database's settings) is kept."""
    database = database or connection.settings_dict
    name = str(database.get("NAME") or "")
    in_memory = name in ("", ":memory:") or "mode=memory" in name
    if database["ENGINE"].endswith("sqlite3") and not in_memory:
        path = Path(name)
        return path.with_name(f"{path.name}-demo-password")
    return Path(settings.BASE_DIR) / ".demo-password"


def demo_password() -> str:
    """The kept password, made and written (mode 0600) the first time."""
    path = password_file()
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept
    password = secrets.token_urlsafe(9)
    # Created for its owner only, never through a file another user made readable first.
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(password + "\n")
    return password
