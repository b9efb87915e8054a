"""A worker whose database connections go silent loses its run within the lease, and spends
nothing after its deadline (PostgreSQL, real `runworker` processes).

Every connection of the worker goes through a userspace TCP proxy (tests/support/tcp_proxy.py)
that, mid-run, stops forwarding and leaves the sockets open: the worker's kernel still gets its
segments acknowledged, so keepalives and tcp_user_timeout see a healthy peer, the heartbeat's
renewal and the agent's own statements wait, and only the run's own deadline
(alwayson/runtime/run.py) can tell that the lease is gone. The agents spend through alwayson
(`run.http` to a loopback "outside" service; the Claude agent's model calls to a loopback
Messages API and its tool calls); each spend names its run.

The test's own session is direct. Real time passes here: a lease's TTL, a little more, and the
worker's start.
"""

import json
import threading
import time
from datetime import datetime

import pytest
from django.db import connection

from alwayson.testing.model import API_KEY, ScriptedModel, message, tool_use
from inbox.models import Event
from inbox.services import ingest
from tests.support.loopback import Loopback
from tests.support.processes import database_url, wait_for
from tests.support.tcp_proxy import TcpProxy
from tests.support.workers import make_inboxes

pytestmark = [pytest.mark.postgres_only]

TTL = 3  # seconds: the lease (the heartbeat renews every 0.75 s)
SILENCE = TTL + 3  # seconds the network stays silent: well past the deadline
SLACK = 0.5  # seconds: a call started just before the deadline may arrive this much later
BOUND = 1.0  # seconds: the loss is known this soon after the deadline


class Spends:
    """The loopback "outside" service: every spend, with when it arrived."""

    def __init__(self):
        self.received = []
        self._lock = threading.Lock()
        self.server = Loopback(self._answer)

    def _answer(self, request):
        with self._lock:
            self.received.append((time.time(), json.loads(request["body"])))
        return 200, {"Content-Type": "application/json"}, b"{}"

    def of(self, generation):
        with self._lock:
            return [(at, body) for at, body in self.received if body["generation"] == generation]

    def spending(self, at_least=5):
        """The generation of the newest run once it has spent `at_least` times, else None.
        Not the first run's: on a machine busy enough that its heartbeat misses the 3 s TTL
        before the silence (CI's suites side by side), that run is lost for the load, and
        the next one is the run to silence."""
        with self._lock:
            if not self.received:
                return None
            newest = max(body["generation"] for _, body in self.received)
            spent = sum(1 for _, body in self.received if body["generation"] == newest)
        return newest if spent >= at_least else None


class TimedModel(ScriptedModel):
    """The scripted Messages API, each request's arrival time kept."""

    def __init__(self):
        super().__init__()
        self.times = []

    def _next(self, request):
        if request.path.startswith("/v1/messages"):
            self.times.append(time.time())
        return super()._next(request)


@pytest.fixture
def outside():
    spends = Spends()
    with spends.server:
        yield spends


@pytest.fixture
def proxy():
    db = connection.settings_dict
    with TcpProxy(db["HOST"] or "127.0.0.1", db["PORT"] or 5432) as running:
        yield running


def through(proxy) -> str:
    """The test database's URL, through the proxy."""
    db = connection.settings_dict
    return database_url().replace(f":{db['PORT'] or 5432}/", f":{proxy.port}/")


def worker_env(proxy, outside, **more):
    services = {"outside": {"base_url": outside.server.url(), "methods": ["POST"]}}
    return {
        "DATABASE_URL": through(proxy),
        "ALWAYSON_LEASE_TTL": str(TTL),
        "ALWAYSON_LOG_FORMAT": "json",
        "ALWAYSON_EGRESS_SERVICES": json.dumps(services),
        **more,
    }


def logged(worker):
    """The worker's JSON log lines, as (unix time, message)."""
    lines = []
    for text in worker.log().splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        lines.append((datetime.fromisoformat(line["time"]).timestamp(), line["message"]))
    return lines


def losses(worker, generation):
    return [
        (at, text)
        for at, text in logged(worker)
        if text.startswith("lease lost: ") and f" gen={generation}:" in text
    ]


def ended(worker, generation):
    return [
        (at, text)
        for at, text in logged(worker)
        if text.startswith("run inbox=") and f" gen={generation} " in text
    ]


def go_silent(proxy, worker, generation):
    """Silence the network mid-run for SILENCE seconds, then heal it: when it went silent,
    and the loss the worker logged (by then it must have)."""
    silent_at = time.time()
    proxy.blackhole()
    try:
        # The lease's deadline passes in this silence; nothing may be waited for but time.
        time.sleep(TTL + BOUND)
        lost = losses(worker, generation)
    finally:
        time.sleep(max(silent_at + SILENCE - time.time(), 0))
        proxy.heal()
    return silent_at, lost


@pytest.mark.django_db(transaction=True)
def test_a_silent_network_loses_the_run_within_the_ttl_and_no_spend_follows(
    spawn, django_user_model, proxy, outside
):
    [inbox] = make_inboxes(django_user_model, "silent", 1)
    worker = spawn(
        "silent-a",
        "--interval",
        "0.2",
        env=worker_env(proxy, outside, ALWAYSON_AGENT="tests.support.agents.spending_agent"),
    )
    ingest(inbox, "chat", "m1", {})
    generation = wait_for(outside.spending, 20, "the run to spend")

    silent_at, lost = go_silent(proxy, worker, generation)

    # Lost within the TTL (from the last renewal before the silence) plus a small bound,
    # while the network was still silent: nothing else could have told it.
    [(lost_at, text)] = lost
    assert "no renewal succeeded by the lease's deadline" in text
    assert silent_at + TTL / 2 - SLACK <= lost_at <= silent_at + TTL + BOUND
    # The run ends fenced once the database answers again, and not one spend after the
    # deadline: not during the silence, not after it.
    wait_for(lambda: ended(worker, generation), 20, "the lost run to end")
    [(_, end)] = ended(worker, generation)
    assert "outcome=refused (fenced off mid-run" in end, end
    late = [at for at, _ in outside.of(generation) if at > lost_at + SLACK]
    assert late == [], f"{len(late)} spend(s) after the deadline"
    assert max(at for at, _ in outside.of(generation)) < silent_at + TTL + SLACK
    assert not Event.objects.filter(inbox=inbox, status="done", claim_gen=generation).exists()


@pytest.mark.django_db(transaction=True)
def test_a_claude_agent_on_a_silent_network_makes_no_model_or_tool_call_after_its_deadline(
    spawn, django_user_model, proxy, outside
):
    model = TimedModel().start()
    model.reply(*(message(tool_use("spend", {"n": n})) for n in range(3000)))
    [inbox] = make_inboxes(django_user_model, "silent-claude", 1)
    try:
        worker = spawn(
            "silent-c",
            "--interval",
            "0.2",
            env=worker_env(
                proxy,
                outside,
                ALWAYSON_AGENT="alwayson.claude.agent",
                ANTHROPIC_API_KEY=API_KEY,
                ANTHROPIC_BASE_URL=model.url,
                ALWAYSON_CLAUDE_TOOLS="tests.support.spending_tools",
                ALWAYSON_CLAUDE_POLICY=json.dumps({"spend": "allow"}),
                ALWAYSON_CLAUDE_MAX_CALLS="3000",
            ),
        )
        ingest(inbox, "chat", "m1", {"text": "spend", "from": "owner"})
        generation = wait_for(outside.spending, 30, "the agent's tool calls")

        silent_at, lost = go_silent(proxy, worker, generation)

        [(lost_at, _)] = lost
        assert silent_at + TTL / 2 - SLACK <= lost_at <= silent_at + TTL + BOUND
        wait_for(lambda: ended(worker, generation), 20, "the lost run to end")
        [(ended_at, end)] = ended(worker, generation)
        assert "outcome=refused (fenced off mid-run" in end, end
        # No tool call of the lost run after its deadline, and no model call from the
        # deadline until it ended (the next run's may follow).
        assert [at for at, _ in outside.of(generation) if at > lost_at + SLACK] == []
        assert [at for at in model.times if lost_at + SLACK < at <= ended_at] == []
    finally:
        model.stop()
