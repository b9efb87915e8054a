"""A sealed deployment as real processes: the worker is started with every credential in its
environment, re-executes itself without them, and its agent, looking everywhere it can
(os.environ, every /proc/<pid>/environ of its user, the settings, run.http), finds none;
yet its calls to a service and to the Messages API arrive with the credential added by
`runegress`. Both run as one Unix user (nobody, when the test is root), as a deployment on
one host does."""

import json
from pathlib import Path

import pytest

from alwayson.testing.model import ScriptedModel, message, presented_key, tool_use
from inbox.models import Event, Inbox, Lease
from inbox.services import ingest
from outbox.models import OutboxMessage
from tests.support.egress import SECRET
from tests.support.loopback import Loopback
from tests.support.processes import wait_for
from tests.support.sealed import PLANTED, SealedDeployment, findings
from tests.support.workerrole import worker_role

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

START = 30  # seconds for a process to start (the worker starts twice: sealed by an exec)


def echo(request):
    # Reflects the credential it was given, as a careless service does: it must come back
    # scrubbed, and the test reads what arrived from its own record.
    seen = request["headers"].get("Authorization", "")
    return 200, {"X-Seen": seen}, json.dumps({"seen": seen}).encode()


@pytest.fixture
def service():
    with Loopback(echo) as server:
        yield server


@pytest.fixture
def deployment(tmp_path, service):
    """Sealed deployments whose worker connects as a role of its own (a sealed worker refuses
    to start as the tables' owner: tests/processes/test_worker_role_pg.py)."""
    made = []
    with worker_role() as (_, url):

        def make(**env):
            env = {"ALWAYSON_WORKER_DATABASE_URL": url, **env}
            deployment = SealedDeployment(tmp_path, service.url(), **env)
            made.append(deployment)
            return deployment

        yield make
        for deployment in made:
            deployment.stop()


def start_sealed(deployment, agent):
    gateway = deployment.start("egress", "runegress")
    wait_for(lambda: deployment.socket.exists() or gateway.poll() is not None, START, "socket")
    assert gateway.poll() is None, deployment.log("egress")
    worker = deployment.start(
        "worker", "runworker", "--worker-id", "sealed-1", "--interval", "0.1", "--agent", agent
    )
    wait_for(
        lambda: "sealing the worker" in deployment.log("worker") or worker.poll() is not None,
        START,
        "the worker to seal itself",
    )
    return gateway, worker


def first_said(inbox, sealed, worker):
    """The inbox's first outbox message, once the sealed worker's agent has said it."""
    said = wait_for(
        lambda: OutboxMessage.objects.filter(inbox=inbox).first() or worker.poll() is not None,
        START,
        f"a message from {inbox.slug}'s agent",
    )
    assert worker.poll() is None, sealed.log("worker")
    return said


def environ_of(pid) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


def test_the_sealed_workers_agent_finds_no_credential_and_its_call_carries_one(
    deployment, service, django_user_model
):
    inbox = Inbox.objects.create(slug="desk", owner=django_user_model.objects.create(username="o"))
    sealed = deployment()
    gateway, worker = start_sealed(sealed, "tests.support.sealed.snooping_agent")
    ingest(inbox, "chat", "m-1", {"text": "hello"})

    said = first_said(inbox, sealed, worker)
    report = json.loads(said.body)
    assert report["found"] == [], report["found"]
    assert report["status"] == 200
    # The exec kept the process: the PID the launcher watches is the sealed worker's.
    assert report["pid"] == worker.pid
    assert "sealing the worker: restarting without" in sealed.log("worker")
    # Read from outside (as root, when the test is): nothing in the worker's environment.
    assert findings(environ_of(worker.pid), "the worker's environ") == []
    # The gateway added the credential and scrubbed the echo.
    [request] = service.requests
    assert request["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert Event.objects.get(source_id="m-1").status == Event.Status.DONE


def test_the_sealed_workers_claude_agent_reaches_the_model_with_a_key_it_never_held(
    deployment, django_user_model
):
    from alwayson.claude.models import ModelCall
    from alwayson.runtime.models import AgentConfig

    api = ScriptedModel().start()
    try:
        inbox = Inbox.objects.create(
            slug="support", owner=django_user_model.objects.create(username="o")
        )
        AgentConfig.objects.create(inbox=inbox, agent="alwayson.claude.agent")
        call = tool_use("send_message", {"text": "Order 7 was delivered."})
        api.reply(message("Telling them.", call), message("Done."))
        sealed = deployment(ANTHROPIC_BASE_URL=api.url)
        gateway, worker = start_sealed(sealed, "tests.support.sealed.snooping_agent")
        ingest(inbox, "chat", "m-1", {"text": "is order 7 delivered?"})

        said = first_said(inbox, sealed, worker)
        assert said.body == "Order 7 was delivered."
        # runegress checked the key at start (GET /v1/models), then the two model calls.
        assert [r.path.split("?")[0] for r in api.requests] == [
            "/v1/models",
            "/v1/messages",
            "/v1/messages",
        ]
        assert {presented_key(r.headers) for r in api.requests} == {PLANTED["ANTHROPIC_API_KEY"]}
        assert ModelCall.objects.filter(inbox=inbox).count() == 2
        assert "ANTHROPIC_API_KEY" not in environ_of(worker.pid)
        assert findings(environ_of(worker.pid), "the worker's environ") == []
        assert not api.unexpected
    finally:
        api.stop()


def test_a_run_fenced_off_mid_run_cannot_spend_the_credential(
    deployment, service, django_user_model
):
    """The gateway checks the lease, not the worker: a run whose lease is taken over between
    two calls is refused the second, though it still runs in the worker."""
    inbox = Inbox.objects.create(slug="desk", owner=django_user_model.objects.create(username="o"))
    sealed = deployment()
    gateway, worker = start_sealed(sealed, "tests.support.sealed.two_calls_agent")
    ingest(inbox, "chat", "m-1", {"text": "go"})
    wait_for(lambda: len(service.requests) == 1, START, "the first call")
    lease = Lease.objects.get(inbox=inbox)
    Lease.objects.filter(inbox=inbox).update(generation=lease.generation + 1)
    (sealed.socket_dir / "go-on").touch()
    second = sealed.socket_dir / "second-call"
    wait_for(second.exists, START, "the run's second call")
    assert second.read_text().startswith("refused: ")
    assert "does not hold its lease" in second.read_text()
    assert len(service.requests) == 1
    assert gateway.poll() is None
