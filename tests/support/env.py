"""A `manage.py` process started with the environment a case needs: production keys, the
HTTPS variables cleared, `check --deploy`."""

import os
import secrets
import subprocess
import sys

from tests.support.paths import ROOT

# What this branch's settings read to pick the HTTPS behaviour: cleared for the default cases.
SECURITY_VARIABLES = (
    "DEBUG",
    "SECRET_KEY",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "CSRF_TRUSTED_ORIGINS",
    "SECURE_PROXY_SSL_HEADER",
)


def strong_key():
    return secrets.token_urlsafe(50)


def environment(**overrides):
    env = {k: v for k, v in os.environ.items() if k not in SECURITY_VARIABLES}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    env.update(DJANGO_SETTINGS_MODULE="alwayson.settings", **overrides)
    return env


def manage(*args, env, timeout=60):
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check_deploy(env):
    """`manage.py check --deploy` failing on any message it reports, down to DEBUG (a silenced
    check reports none): (exit code, its output)."""
    done = manage("check", "--deploy", "--fail-level", "DEBUG", env=env)
    return done.returncode, done.stdout + done.stderr
