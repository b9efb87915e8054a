"""Every management command under bad arguments: a CommandError naming the argument, never a
traceback, and nothing changed. One table through call_command; a few rows again through a
real `manage.py` process, for the exit code and what stderr says.
"""

import os
import re
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from alwayson.ops.models import Process
from approvals.models import Approval
from inbox.models import Event, Inbox, Lease
from inbox.services import ingest
from outbox.models import Notice, OutboxMessage
from tests.chaos.command import Command as ChaosCommand
from tests.support.paths import ROOT as BASE_DIR
from timers.models import Timer

pytestmark = pytest.mark.django_db

MODELS = (Inbox, Lease, Event, Timer, Approval, OutboxMessage, Notice, Process)
HUGE = "w" * 201


def snapshot():
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in MODELS}


# (command, arguments, what the CommandError says). Loop commands get --once where they take
# it, so a check that is missing fails the row instead of looping forever.
ROWS = {
    "runworker-interval-zero": ("runworker", ["--once", "--interval", "0"], "--interval must be"),
    "runworker-interval-neg": ("runworker", ["--once", "--interval=-1"], "--interval must be"),
    "runworker-interval-nan": ("runworker", ["--once", "--interval", "nan"], "--interval must"),
    "runworker-interval-inf": ("runworker", ["--once", "--interval", "inf"], "--interval must"),
    "runworker-interval-huge": ("runworker", ["--once", "--interval", "1e300"], "at most 86400"),
    "runworker-interval-text": ("runworker", ["--once", "--interval", "soon"], "--interval"),
    "runworker-concurrency-0": ("runworker", ["--once", "--concurrency", "0"], "--concurrency"),
    "runworker-concurrency-neg": ("runworker", ["--once", "--concurrency=-3"], "--concurrency"),
    "runworker-concurrency-1.5": ("runworker", ["--once", "--concurrency", "1.5"], "--concurrency"),
    "runworker-max-runs-0": ("runworker", ["--once", "--max-runs", "0"], "--max-runs must be"),
    "runworker-worker-id-blank": ("runworker", ["--once", "--worker-id", " "], "--worker-id must"),
    "runworker-worker-id-long": ("runworker", ["--once", "--worker-id", HUGE], "--worker-id is"),
    "runworker-agent-unknown": (
        "runworker",
        ["--once", "--agent", "no.such.Agent"],
        "--agent: cannot",
    ),
    "runworker-agent-module": (
        "runworker",
        ["--once", "--agent", "os"],
        "--agent: 'os' is a module, not a callable",
    ),
    "runworker-agent-value": (
        "runworker",
        ["--once", "--agent", "os.sep"],
        "--agent: 'os.sep' is not",
    ),
    "runworker-agent-empty": ("runworker", ["--once", "--agent", "."], "--agent: cannot import"),
    "runworker-unknown-flag": ("runworker", ["--once", "--speed", "2"], "unrecognized argum"),
    "runscheduler-interval-0": ("runscheduler", ["--once", "--interval", "0"], "--interval must"),
    "runscheduler-interval-nan": ("runscheduler", ["--once", "--interval", "nan"], "--interval"),
    "runscheduler-worker-id": ("runscheduler", ["--once", "--worker-id", HUGE], "--worker-id is"),
    "rundispatcher-interval-neg": ("rundispatcher", ["--once", "--interval=-5"], "--interval"),
    "rundispatcher-interval-inf": ("rundispatcher", ["--once", "--interval", "inf"], "--interval"),
    "rundispatcher-worker-id": ("rundispatcher", ["--once", "--worker-id", "\t"], "--worker-id"),
    "runall-addr": ("runall", ["--addr", "not an address"], "--addr must be [address:]port"),
    "runall-addr-empty": ("runall", ["--addr", ""], "--addr must be"),
    "runall-concurrency-0": ("runall", ["--concurrency", "0"], "--concurrency must be at least"),
    "runall-concurrency-text": ("runall", ["--concurrency", "two"], "--concurrency"),
    "runall-production-concurrency": (
        "runall",
        ["--production", "--concurrency", "2"],
        "--concurrency is for development",
    ),
    "runegress-port-0": ("runegress", ["--port", "0"], "--port must be 1-65535"),
    "runegress-port-big": ("runegress", ["--port", "70000"], "--port must be 1-65535"),
    "runegress-port-neg": ("runegress", ["--port=-1"], "--port must be 1-65535"),
    "runegress-port-text": ("runegress", ["--port", "http"], "--port"),
    "runegress-no-port": ("runegress", [], "--port must be 1-65535 (or set ALWAYSON_EGRESS_PORT)"),
    "runegress-addr-public": ("runegress", ["--port", "9", "--addr", "0.0.0.0"], "loopback"),
    "runegress-addr-name": ("runegress", ["--port", "9", "--addr", "example.com"], "loopback"),
    "runegress-inbox": ("runegress", ["--port", "9", "--inbox", "nobody"], "unknown inbox"),
    "runegress-inbox-empty": ("runegress", ["--port", "9", "--inbox", ""], "unknown inbox"),
    "chaos-seconds-0": ("chaos", ["--seconds", "0"], "--seconds must be positive"),
    "chaos-seconds-nan": ("chaos", ["--seconds", "nan"], "--seconds must be positive"),
    "chaos-seconds-short": ("chaos", ["--seconds", "5"], "seconds must be at least"),
    "chaos-rate-nan": ("chaos", ["--rate", "nan"], "--rate must be positive"),
    "chaos-rate-inf": ("chaos", ["--rate", "inf"], "--rate must be positive"),
    "chaos-inboxes-neg": ("chaos", ["--inboxes=-1"], "--inboxes must be positive"),
    "chaos-workers-0": ("chaos", ["--workers", "0"], "--workers must be positive"),
    "chaos-concurrency-text": ("chaos", ["--concurrency", "x"], "--concurrency"),
    "chaos-outage-neg": ("chaos", ["--outage=-1"], "outage must be positive"),
    "chaos-outage-nan": ("chaos", ["--outage", "nan"], "--outage must be finite"),
    "chaos-drain-neg": ("chaos", ["--drain-timeout=-1"], "--drain-timeout must be positive"),
    "chaos-drain-nan": ("chaos", ["--drain-timeout", "nan"], "--drain-timeout must be positive"),
    "chaos-seed-text": ("chaos", ["--seed", "lucky"], "--seed"),
    "chaos-recheck-missing": ("chaos", ["--recheck", "/nonexistent/chaos"], "--recheck"),
    "deadletters-requeue-unknown": ("deadletters", ["--requeue", "987654"], "not dead events"),
    "deadletters-requeue-text": ("deadletters", ["--requeue", "x"], "--requeue"),
    "deadletters-requeue-huge": (
        "deadletters",
        ["--requeue", "99999999999999999999999"],
        "out of range for an id",
    ),
    "deadletters-requeue-pending": ("deadletters", ["--requeue", "{pending}"], "not dead events"),
    "deadletters-resend-unknown": ("deadletters", ["--resend", "987654"], "not failed outbox"),
    "deadletters-resend-notices": ("deadletters", ["--resend-notices", "0"], "not failed notices"),
    "deadletters-inbox-unknown": ("deadletters", ["--inbox", "nobody"], "--inbox: unknown inbox"),
    "deadletters-inbox-empty": ("deadletters", ["--inbox", ""], "--inbox: unknown inbox"),
    "deadletters-requeue-other-inbox": (
        "deadletters",
        ["--inbox", "other", "--requeue", "{dead}"],
        "not dead events",
    ),
    "startagent-name-digit": ("startagent", ["2fast"], "'2fast' is not a module name"),
    "startagent-name-keyword": ("startagent", ["class"], "'class' is a Python keyword"),
    "startagent-name-taken": ("startagent", ["inbox"], "a module Python imports already"),
    "startagent-directory": (
        "startagent",
        ["desk", "--directory", "/nonexistent/agents"],
        "--directory: /nonexistent/agents is not a directory",
    ),
    "startagent-no-name": ("startagent", [], "the following arguments are required: name"),
    "status-unknown-flag": ("status", ["--verbose-all"], "unrecognized arguments"),
    "scenarios-unknown-flag": ("scenarios", ["--fast"], "unrecognized arguments"),
    "replay-no-budget": ("replay", [], "the following arguments are required: --budget"),
    "replay-budget-neg": ("replay", ["--budget=-1"], "--budget must be 0 or more"),
    "replay-limit-0": ("replay", ["--budget", "1", "--limit", "0"], "--limit must be"),
    "replay-inbox-unknown": ("replay", ["--budget", "1", "--inbox", "nope"], "--inbox: no inbox"),
    "replay-since-text": ("replay", ["--budget", "1", "--since", "soon"], "--since: 'soon'"),
    "replay-outcome": ("replay", ["--budget", "1", "--outcome", "fine"], "outcome: fine is not"),
    "replay-agent-unknown": (
        "replay",
        ["--budget", "0", "--agent", "no.such.agent"],
        "--agent: cannot import 'no.such.agent'",
    ),
}


@pytest.fixture
def rows(inbox, make_inbox, t0):
    make_inbox("other")
    ingest(inbox, "chat", "dead", {}, now=t0)
    ingest(inbox, "chat", "pending", {}, now=t0)
    Event.objects.filter(source_id="dead").update(status=Event.Status.DEAD)
    return {e.source_id: e.pk for e in Event.objects.all()}


@pytest.mark.parametrize(
    "command, args, message", [pytest.param(*row, id=name) for name, row in ROWS.items()]
)
def test_a_bad_argument_is_a_command_error_naming_it(rows, settings, command, args, message):
    settings.ALWAYSON_EGRESS_PORT = 0
    args = [arg.format(**rows) for arg in args]
    before = snapshot()

    with pytest.raises(CommandError, match=re.escape(message)):
        # The chaos run is a tool beside the product, not one of its commands.
        call_command(ChaosCommand() if command == "chaos" else command, *args)

    assert snapshot() == before


def test_deadletters_checks_every_id_before_changing_any(rows):
    """A typo among good ids: the good ones are not requeued either."""
    before = snapshot()
    with pytest.raises(CommandError, match=r"not dead events \(or unknown\): \[987654\]"):
        call_command("deadletters", "--requeue", str(rows["dead"]), "987654")
    assert snapshot() == before


# --- through a real process -------------------------------------------------------------------

# Each row is a Python start-up (seconds on a loaded host): few, one per kind of answer.
PROCESS_ROWS = {
    # A CommandError: exit 1, "CommandError: <message>" on stderr.
    "runworker-interval": (["runworker", "--once", "--interval=-1"], 1, "--interval must be"),
    "chaos-seconds-nan": (["chaos", "--seconds", "nan"], 1, "--seconds must be positive"),
    # A usage error (argparse): exit 2, the usage line and the argument it could not read.
    "rundispatcher-interval-text": (
        ["rundispatcher", "--interval", "soon"],
        2,
        "argument --interval: invalid float value: 'soon'",
    ),
}


@pytest.mark.parametrize(
    "argv, code, message", [pytest.param(*row, id=name) for name, row in PROCESS_ROWS.items()]
)
def test_a_bad_argument_exits_non_zero_with_the_message_and_no_traceback(
    tmp_path, argv, code, message
):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "ALWAYSON_EGRESS_PORT": "0",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if argv[0] == "chaos":
        command = [sys.executable, "-m", "tests.chaos", *argv[1:]]
    else:
        command = [sys.executable, str(BASE_DIR / "manage.py"), *argv]
    done = subprocess.run(
        command,
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    if code == 1:
        assert done.stderr.startswith("CommandError: "), done.stderr
