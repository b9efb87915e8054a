"""A sealed deployment from a test: `runegress` on a Unix socket and a `runworker` started with
every credential in its environment, both as one Unix user other than the test's, and an
agent that looks everywhere it can for the credentials."""

import base64
import contextlib
import json
import os
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.conf import settings

from alwayson.testing.model import API_KEY
from tests.support.egress import SECRET
from tests.support.paths import ROOT
from tests.support.processes import database_url

# One distinctive value per credential a deployment holds; each is searched for afterwards.
PLANTED = {
    "SECRET_KEY": "planted-secret-key-9d8f7e6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e",
    "PAYMENTS_TOKEN": SECRET,
    "ANTHROPIC_API_KEY": API_KEY,
    "ALWAYSON_GITHUB_SECRETS": "planted-github-webhook-secret-51c0",
    "ALWAYSON_OUTBOX_SIGNING_SECRETS": json.dumps(
        {"desk": ["whsec_" + base64.b64encode(b"planted-outbox-signing-key!").decode()]}
    ),
    "ALWAYSON_METRICS_TOKEN": "planted-metrics-token-7a1e4c",
    "EMAIL_URL": "smtp://mailer:planted-smtp-password-2b9@127.0.0.1:2525",
    "ALWAYSON_SLACK_BOT_TOKEN": "xoxb-planted-slack-bot-token-66e1",
    "ALWAYSON_EGRESS_TOKEN": "planted-egress-port-token-0f3c",
    "ACME_CRM_KEY": "planted-team-crm-key-a41b",  # a team's own, in ALWAYSON_WORKER_WITHHOLD
}
# What each planted variable's value contains that must not be found (the signing secret's
# key, not the JSON around it).
SEARCHED = {
    name: (json.loads(value)["desk"][0] if name == "ALWAYSON_OUTBOX_SIGNING_SECRETS" else value)
    for name, value in PLANTED.items()
}
NOBODY = 65534


def findings(text, where):
    return [f"{name} in {where}" for name, value in SEARCHED.items() if value in text]


def snooping_agent(run):
    """Everything an agent in the worker can read, searched for the credentials; then one call
    through the gateway, whose answer is searched too. The findings are what it says."""
    from alwayson.egress.exceptions import EgressFailed
    from alwayson.egress.services import configured_services

    found = findings(repr(dict(os.environ)), "os.environ")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        for part in ("environ", "cmdline"):
            try:
                text = (entry / part).read_bytes().decode(errors="replace")
            except OSError:
                continue  # another user's process, or a non-dumpable one: what sealing wants
            found += findings(text, f"/proc/{entry.name}/{part}")
    every_setting = {name: getattr(settings, name) for name in dir(settings) if name.isupper()}
    found += findings(repr(every_setting), "django.conf.settings")
    found += findings(repr(vars(run.http)), "run.http")
    for service in configured_services().values():
        with contextlib.suppress(EgressFailed):  # no credential to be had: what sealing wants
            found += findings(service.credential(), f"{service.name}.credential()")
    answer = run.http.post("payments", "/v1/echo")
    found += findings(answer.text + repr(answer.headers), "the service's answer")
    run.say(json.dumps({"found": found, "status": answer.status, "pid": os.getpid()}))


def two_calls_agent(run):
    """One call, then a pause until the test says go on (having taken the lease over), then
    another; what the second got is written beside the socket for the test to read."""
    from alwayson.egress.exceptions import EgressRefused

    run.http.post("payments", "/v1/echo")
    here = Path(settings.ALWAYSON_EGRESS_SOCKET).parent
    deadline = time.monotonic() + 30
    while not (here / "go-on").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        outcome = f"sent {run.http.post('payments', '/v1/echo').status}"
    except EgressRefused as exc:
        outcome = f"refused: {exc}"
    (here / "second-call").write_text(outcome)


def runnable_python():
    """An interpreter another user may run: this one, or the system's of the same version."""
    here = Path(sys.executable).resolve()
    if closed_to_others(here) is None:
        return str(here)
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        raise RuntimeError(f"no interpreter another user can run (tried {here} and {system})")
    return str(system)


def closed_to_others(path):
    """The first of `path` and its parents that another user may not enter, or None."""
    return next((p for p in [path, *path.parents] if not p.stat().st_mode & stat.S_IXOTH), None)


def readable_by_others(checkout):
    """Refuse, saying why, a checkout another user cannot read: the deployment runs as
    nobody, who would otherwise fail with a bare "Permission denied" on manage.py (a clone
    made under `mktemp -d`, mode 0700, or a home directory closed to others)."""
    closed = closed_to_others(checkout)
    if closed is not None:
        raise RuntimeError(
            f"the sealed deployment runs as user nobody, who cannot enter {closed} (mode"
            f" {closed.stat().st_mode & 0o777:o}): run the tests from a checkout others may"
            f" read (chmod o+rx {closed})"
        )


class SealedDeployment:
    """`runegress` and `runworker` of one sealed deployment, started by `start(...)`."""

    def __init__(self, log_dir, service_url, **env):
        self.log_dir = log_dir
        self.as_root = os.geteuid() == 0
        self.socket_dir = Path(tempfile.mkdtemp(prefix="sealed-"))
        self.socket = self.socket_dir / "egress.sock"
        if self.as_root:
            # A user of its own for both (a deployment runs them as one user): the worker's
            # agent then has no privilege the test's root would give it.
            os.chown(self.socket_dir, NOBODY, NOBODY)
        self.env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.socket_dir),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), *site.getsitepackages()]),
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "alwayson.settings",
            "ALWAYSON_EGRESS_SOCKET": str(self.socket),
            "ALWAYSON_EGRESS_SERVICES": json.dumps(
                {
                    "payments": {
                        "base_url": service_url,
                        "methods": ["POST"],
                        "paths": ["/v1/echo"],
                        "secret_env": "PAYMENTS_TOKEN",
                    }
                }
            ),
            "ALWAYSON_WORKER_WITHHOLD": "ACME_CRM_KEY",
            "ALWAYSON_RETRY_BASE": "1",
            **PLANTED,
            **env,
        }
        self.processes = {}

    def start(self, name, *args):
        prefix = []
        if self.as_root:
            readable_by_others(ROOT)
            prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 — kept open for the child
        self.processes[name] = subprocess.Popen(
            [*prefix, runnable_python(), "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self.processes[name]

    def log(self, name):
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop(self):
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        shutil.rmtree(self.socket_dir, ignore_errors=True)
