"""The sealed worker under its own database role, as real processes: `runegress`, and
`runworker --once` connecting as a role `manage.py workerrole` made, over events that use
every verb a run has (say, ask alone and in a group, schedule, session state, defer), a
Claude agent's tool calls and their approval, dead events' alert, a lost run's record, the
live pages' triggers, the heartbeat and the metrics: every run completes. Agents that reach
for the web's sessions, password hashes, login attempts, the egress app's calls or the admin
log get PostgreSQL's refusal, fail as an agent that raises does, and leak nothing."""

import json
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection

from alwayson.claude.models import ModelCall, ToolResult
from alwayson.demo.models import Refund
from alwayson.egress.models import EgressCall
from alwayson.ops.models import DeadAlert, MetricTotal, Process
from alwayson.runtime.models import AgentConfig
from alwayson.testing.model import ScriptedModel, message, tool_use
from alwayson.web.models import LiveChange, LiveWatch
from approvals.models import Approval
from approvals.services import answer_approval
from inbox import clock
from inbox.models import Event, Inbox, Lease, Membership, Role, RunRecord, Session
from inbox.services import ingest
from outbox.models import Notice, OutboxMessage
from tests.support.sealed import SealedDeployment
from tests.support.workerrole import FORBIDDEN_READS, worker_role
from timers.models import Timer

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

RUN = 90  # seconds for `runworker --once` to seal itself, check its role and drain
VERBS = "tests.support.workerrole.verbs_agent"
FORBIDDEN = "tests.support.workerrole.forbidden_agent"


@pytest.fixture
def role():
    with worker_role() as made:
        yield made


@pytest.fixture
def api():
    model = ScriptedModel().start()
    yield model
    model.stop()


@pytest.fixture
def deployment(tmp_path, role, api):
    """A sealed deployment whose worker connects as `role`: the owner's URL goes to every
    process, the worker's own in ALWAYSON_WORKER_DATABASE_URL, which sealing swaps in. Failed
    runs are retried an hour later: each `--once` drains every run exactly once."""
    _, url = role
    sealed = SealedDeployment(
        tmp_path,
        "http://127.0.0.1:9",
        ALWAYSON_WORKER_DATABASE_URL=url,
        ALWAYSON_RETRY_BASE="3600",
        ANTHROPIC_BASE_URL=api.url,
        ALWAYSON_CLAUDE_TOOLS="tests.support.claude_tools",
    )
    yield sealed
    sealed.stop()


def drain(deployment, name, agent):
    """`runworker --once` as `name`, sealed, after `runegress` is up; its exit code 0."""
    if "egress" not in deployment.processes:
        gateway = deployment.start("egress", "runegress")
        from tests.support.processes import wait_for

        wait_for(lambda: deployment.socket.exists() or gateway.poll() is not None, RUN, "socket")
        assert gateway.poll() is None, deployment.log("egress")
    worker = deployment.start(name, "runworker", "--once", "--worker-id", name, "--agent", agent)
    code = worker.wait(RUN)
    assert code == 0, deployment.log(name)
    return worker


def said(inbox):
    return list(
        OutboxMessage.objects.filter(inbox=inbox).order_by("id").values_list("body", flat=True)
    )


def statuses(inbox):
    return dict(Event.objects.filter(inbox=inbox).values_list("source_id", "status"))


@pytest.fixture
def people(django_user_model):
    owner = django_user_model.objects.create_user("olive", password="owner-password-1")
    ann = django_user_model.objects.create_user(
        "ann", first_name="Ann", password="approver-password-2"
    )
    operator = django_user_model.objects.create_user(
        "otto", password="operator-password-3", is_staff=True
    )
    operator.user_permissions.add(Permission.objects.get(codename="view_event"))
    return owner, ann, operator


def inbox_with(slug, owner, agent=None, **config):
    inbox = Inbox.objects.create(slug=slug, owner=owner)
    if agent:
        AgentConfig.objects.create(inbox=inbox, agent=agent, **config)
    return inbox


def test_a_sealed_worker_under_its_own_role_completes_every_kind_of_run(
    deployment, role, api, people
):
    name, url = role
    owner, ann, operator = people
    now = clock.database_now()
    # desk: every verb in one run; its approvals tell ann, an approver (the owner hears
    # from the agent itself).
    desk = inbox_with("desk", owner)
    Membership.objects.create(inbox=desk, user=ann, role=Role.APPROVER)
    for key, do in [
        ("say-1", "say"),
        ("ask-1", "ask"),
        ("group-1", "ask-group"),
        ("group-2", "ask-group"),
        ("schedule-1", "schedule"),
        ("remember-1", "remember"),
    ]:
        ingest(desk, "chat", key, {"do": do})
    # dying: an event out of attempts is parked dead by the claim, and the operator is told.
    dying = inbox_with("dying", owner)
    ingest(dying, "chat", "poison", {"do": "say"})
    ingest(dying, "chat", "healthy", {"do": "say"})
    Event.objects.filter(source_id="poison").update(attempts=3, error="Boom: the last error")
    # lost: a run whose worker vanished: the next take records it lost.
    lost = inbox_with("lost", owner)
    ingest(lost, "chat", "orphan", {"do": "say"})
    ingest(lost, "chat", "fresh", {"do": "say"})
    Lease.objects.filter(inbox=lost).update(
        holder="vanished", generation=1, until=now - timedelta(minutes=5)
    )
    Event.objects.filter(source_id="orphan").update(status="running", claim_gen=1, attempts=1)
    # later: a run that defers.
    later = inbox_with("later", owner)
    ingest(later, "chat", "defer-1", {"do": "defer"})
    # support: the Claude agent; one call allowed, one asked of an approver.
    support = inbox_with(
        "support",
        owner,
        "alwayson.claude.agent",
        policy={"lookup_order": "allow", "refund": "ask"},
    )
    Membership.objects.create(inbox=support, user=ann, role=Role.APPROVER)
    api.reply(
        message(
            "Looking, then refunding.",
            tool_use("lookup_order", {"order": "7"}),
            tool_use("refund", {"order": "7", "amount": 5}),
        )
    )
    ingest(support, "chat", "m-1", {"text": "refund order 7 please"})
    # A page watches every inbox: the triggers notify, as well as write their change rows.
    LiveWatch.objects.create(inbox_id=LiveWatch.EVERY_INBOX, listener=1)
    # A day-old heartbeat: the worker's start prunes it.
    Process.objects.create(
        kind=Process.Kind.WORKER,
        worker_id="long-gone",
        host="h",
        pid=1,
        started=now - timedelta(days=3),
        last_beat=now - timedelta(days=2),
    )
    changes_before = LiveChange.objects.count()

    drain(deployment, "role-1", VERBS)

    # It ran as its role, and never held the owner's URL: sealing swapped its own in.
    report = json.loads(said(desk)[-1])
    assert report == {"role": name, "database_url": url, "state": {"remembered": 1}}
    assert said(desk)[0] == "said for say-1"
    assert set(statuses(desk).values()) == {"done"}
    asked = Approval.objects.filter(inbox=desk).order_by("request_id")
    assert [a.request_id for a in asked] == ["ask-ask-1", "ask-group-1", "ask-group-2"]
    assert Timer.objects.filter(inbox=desk, key="remind-schedule-1").exists()
    assert Timer.objects.filter(inbox=desk).count() == 4  # the reminder, three expiries
    assert Session.objects.get(inbox=desk).state == {"remembered": 1}
    notices = Notice.objects.filter(inbox=desk).order_by("topic")
    assert [(n.recipient, n.topic) for n in notices] == [
        (ann, "approval:ask-ask-1"),
        (ann, "approval:turn-1"),
    ]
    assert notices[0].body.startswith("Ann,")
    assert "2 calls of one turn" in notices[1].subject

    assert statuses(dying) == {"poison": "dead", "healthy": "done"}
    alert = DeadAlert.objects.get(inbox=dying)
    assert alert.alerts == 1
    [notice] = Notice.objects.filter(inbox=dying)
    assert (notice.recipient, notice.topic) == (operator, "dead-events:1")
    assert "Boom: the last error" in notice.body

    assert RunRecord.objects.get(inbox=lost, generation=1).outcome == RunRecord.Outcome.LOST
    assert statuses(lost) == {"orphan": "pending", "fresh": "done"}

    assert statuses(later) == {"defer-1": "pending"}
    assert Event.objects.get(source_id="defer-1").error == "the service is down"
    assert RunRecord.objects.get(inbox=later).outcome == RunRecord.Outcome.DEFERRED

    [lookup] = ToolResult.objects.filter(inbox=support, tool="lookup_order")
    assert lookup.result is not None and lookup.decision == "allow"
    assert ModelCall.objects.filter(inbox=support).count() == 1
    [refund_asked] = Approval.objects.filter(inbox=support)
    assert Notice.objects.filter(inbox=support, recipient=ann).count() == 1

    # Every run committed with its record, through the triggers, with the heartbeat.
    done = RunRecord.objects.filter(outcome=RunRecord.Outcome.DONE, worker="role-1")
    assert set(done.values_list("inbox__slug", flat=True)) == {"desk", "dying", "lost", "support"}
    assert not Event.objects.filter(status="running").exists()
    assert LiveChange.objects.count() > changes_before
    assert not Process.objects.filter(worker_id="long-gone").exists()
    beat = Process.objects.get(worker_id="role-1")
    assert beat.stopped is not None and beat.runs == 5
    # Only a worker counts runs: added at its beat and its exit.
    assert MetricTotal.objects.filter(name__startswith="alwayson_run_events", value__gt=0)

    # The answers come back as events; a second worker runs them: the refund runs now.
    answer_approval(desk, "ask-ask-1", "yes", by=ann)
    answer_approval(support, refund_asked.request_id, "yes", by=ann)
    api.reply(
        message(tool_use("send_message", {"text": "Refunded order 7."})),
        message("Done."),
    )

    drain(deployment, "role-2", VERBS)

    assert said(desk)[-2] == "ask-ask-1 was answered yes"
    asked_owner, refunded = said(support)
    assert asked_owner.startswith("Approval needed: refund order 7 (5 EUR).")
    assert refunded == "Refunded order 7."
    refund = ToolResult.objects.get(inbox=support, tool="refund")
    assert refund.approved and refund.result is not None
    assert Refund.objects.filter(order="7").count() == 1
    assert set(statuses(support).values()) == {"done"}
    assert not api.unexpected


@pytest.fixture
def planted(people):
    """What an agent must not get: a signed-in session, password hashes, a login attempt,
    an egress call, an admin log entry; each value searched for afterwards."""
    owner, _, _ = people
    session = SessionStore()
    session["_auth_user_id"] = str(owner.pk)
    session["planted"] = "planted-session-value-51e2"
    session.create()
    EgressCall.objects.create(
        service="payments",
        method="POST",
        path="/v1/planted-egress-path-9c1",
        outcome="sent",
        status=200,
        at=clock.database_now(),
    )
    AccessAttempt.objects.create(
        username="planted-login-attempt-7d3",
        ip_address="192.0.2.1",
        user_agent="ua",
        http_accept="*/*",
        path_info="/accounts/login/",
        get_data="",
        post_data="",
        failures_since_start=1,
    )
    LogEntry.objects.create(
        user=owner, object_repr="planted-admin-log-4a8", action_flag=ADDITION, change_message=""
    )
    return [
        session.session_key,
        "planted-session-value-51e2",
        owner.password,
        "planted-egress-path-9c1",
        "planted-login-attempt-7d3",
        "planted-admin-log-4a8",
    ]


def test_an_agent_under_the_role_cannot_read_sessions_password_hashes_or_egress_calls(
    deployment, role, people, planted
):
    owner, _, _ = people
    readers = {}
    for what in [*FORBIDDEN_READS, "users"]:
        readers[what] = inbox_with(f"reads-{what}", owner)
        ingest(readers[what], "chat", f"read-{what}", {"read": what})
    # In the same worker process, a run that reads nothing forbidden.
    fine = inbox_with("fine", owner, VERBS)
    ingest(fine, "chat", "say-1", {"do": "say"})

    drain(deployment, "role-1", FORBIDDEN)

    tables = {
        "sessions": "django_session",
        "passwords": "auth_user",
        "users": "auth_user",
        "login-attempts": "axes_accessattempt",
        "egress": "alwayson_egresscall",
        "admin-log": "django_admin_log",
    }
    for what, inbox in readers.items():
        [event] = Event.objects.filter(inbox=inbox)
        # Failed as an agent that raises: back to pending with the error, its attempt counted.
        assert (event.status, event.attempts) == ("pending", 1), what
        assert f"permission denied for table {tables[what]}" in event.error, event.error
        assert RunRecord.objects.get(inbox=inbox).outcome == RunRecord.Outcome.ERROR
        assert said(inbox) == []
    assert said(fine)[0] == "said for say-1"
    assert statuses(fine) == {"say-1": "done"}
    # Nowhere: not in what the runs wrote, nor in the worker's log.
    written = [
        *Event.objects.values_list("error", flat=True),
        *RunRecord.objects.values_list("error", flat=True),
        *OutboxMessage.objects.values_list("body", flat=True),
        *(json.dumps(state) for state in Session.objects.values_list("state", flat=True)),
        deployment.log("role-1"),
    ]
    for value in planted:
        assert not [text for text in written if value in text], value
    assert RunRecord.objects.filter(outcome="error").count() == len(readers)


def refusal(deployment, name):
    """A sealed `runworker --once` that must refuse to start: its last line of output."""
    worker = deployment.start(name, "runworker", "--once", "--worker-id", name, "--agent", VERBS)
    assert worker.wait(RUN) == 1, deployment.log(name)
    return deployment.log(name).strip().splitlines()[-1]


def test_a_sealed_worker_whose_role_lacks_a_grant_refuses_to_start_naming_it(
    deployment, role, people
):
    name, _ = role
    owner, _, _ = people
    ingest(inbox_with("desk", owner), "chat", "m-1", {"do": "say"})
    with connection.cursor() as cursor:
        cursor.execute(f"REVOKE UPDATE ON inbox_lease FROM {name}")

    line = refusal(deployment, "role-1")

    assert line == (
        f"CommandError: the worker's database role {name} lacks what a run needs (inbox_lease: "
        f"UPDATE): run `manage.py workerrole {name}` as the tables' owner after migrate "
        "(docs/how-to/egress.md#the-workers-database-role)"
    )
    # Refused before anything ran: no heartbeat, no claim.
    assert not Process.objects.exists()
    assert statuses(Inbox.objects.get(slug="desk")) == {"m-1": "pending"}


def test_a_sealed_worker_connected_as_the_owner_refuses_to_start(tmp_path, people):
    """The deployment of before: the sealed worker held the owner's URL, and its agents could
    read every table."""
    sealed = SealedDeployment(tmp_path, "http://127.0.0.1:9")
    try:
        line = refusal(sealed, "owner-1")
    finally:
        sealed.stop()
    owner = connection.settings_dict["USER"]
    assert line.startswith(f"CommandError: the worker's database role {owner} ")
    assert "so it reaches every table an agent must not (sessions, password hashes)" in line
    assert line.endswith(
        "give the worker a role of its own, `manage.py workerrole <role>` run as the tables' "
        "owner after migrate, and name it in ALWAYSON_WORKER_DATABASE_URL "
        "(docs/how-to/egress.md#the-workers-database-role)"
    )
