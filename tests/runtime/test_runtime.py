"""The agent interface: Run's verbs, its idempotency keys, renew() and LeaseLost, the heartbeat.

Tests of the verbs build a Run over a real claim and pass `now` to finish. Tests that go
through Worker.step or renew() use the database's clock (as the worker does): their rows are
made with `now=None`, and time is moved by updating rows, never by sleeping.
"""

from datetime import timedelta

import pytest

from alwayson.runtime.api import (
    acquire,
    answer_approval,
    ingest,
    request_approval,
    run_scheduler,
)
from alwayson.runtime.loading import load_agent
from alwayson.runtime.run import KeepState, LeaseLost
from alwayson.runtime.worker import Heartbeat, Worker
from approvals.models import Approval
from inbox.clock import database_now
from inbox.models import Event, Lease, Session
from inbox.services import SaveState
from outbox.models import OutboxMessage
from tests.support.runs import finish_run, session_state, start_run
from timers.models import Timer

SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)


def lease(inbox):
    return Lease.objects.get(inbox=inbox)


def nothing_written(inbox):
    return (
        not OutboxMessage.objects.filter(inbox=inbox).exists()
        and not Approval.objects.filter(inbox=inbox).exists()
        and not Timer.objects.filter(inbox=inbox).exists()
    )


def take_over(inbox, holder="B") -> int:
    """Another worker takes the inbox: the lease lapses (moved into the past) and B acquires."""
    Lease.objects.filter(inbox=inbox).update(until=database_now() - HOUR)
    gen = acquire(inbox, holder)
    assert gen is not None
    return gen


# --- the verbs are effects of the fenced finish ----------------------------------------------


@pytest.mark.django_db
def test_verbs_write_nothing_before_the_finish(inbox, t0):
    ingest(inbox, "chat", "m1", {"text": "hi"}, now=t0)
    run = start_run(inbox, "A", now=t0)

    run.say("hello")
    run.ask("refund-1", "refund order 1", 3600)
    run.schedule("follow-up", delay=60)
    run.state["step"] = 1

    assert nothing_written(inbox)
    assert session_state(inbox) == {}
    assert Event.objects.get(source_id="m1").status == "running"


@pytest.mark.django_db
def test_the_verbs_options_are_their_effects_and_no_others(inbox, t0):
    """run.schedule and run.ask state no options of their own: Schedule's and Ask's reach
    the rows, and a name neither knows is refused at the call, before anything is recorded."""
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'delai'"):
        run.schedule("follow-up", delai=60)
    with pytest.raises(TypeError, match="unexpected keyword argument 'approver'"):
        run.ask("refund-1", "refund order 1", 3600, approver=2)
    with pytest.raises(ValueError, match="payload must be"):
        run.schedule("follow-up", delay=60, payload=[])
    assert (run.scheduled, run.asked) == (0, 0)

    run.schedule("digest", t0 + HOUR, every=3600, policy="catch_up", catch_up_max=3)
    run.ask("refund-1", "refund order 1", 3600, {"tool": "refund"}, approvers=2, group="g-1")
    assert finish_run(run, now=t0) is True

    timer = Timer.objects.get(inbox=inbox, key="digest")
    assert (timer.every, timer.policy, timer.catch_up_max) == (3600, "catch_up", 3)
    approval = Approval.objects.get(inbox=inbox, request_id="refund-1")
    assert (approval.details["tool"], approval.approvers_needed, approval.group) == (
        "refund",
        2,
        "g-1",
    )


@pytest.mark.django_db
def test_say_becomes_outbox_messages_with_their_urgent_flag(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    run.say("digest line")
    run.say("refund needs approval", urgent=True)
    finished_at = t0 + 30 * SECOND

    assert finish_run(run, now=finished_at) is True

    rows = OutboxMessage.objects.filter(inbox=inbox).order_by("id")
    assert list(rows.values_list("body", "urgent", "created", "sent_at")) == [
        ("digest line", False, finished_at, None),
        ("refund needs approval", True, finished_at, None),
    ]
    assert run.summary == "said 2"
    assert Event.objects.get(source_id="m1").status == "done"


@pytest.mark.django_db
def test_ask_becomes_an_approval_and_its_expiry_timer(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    run.ask("refund-881", "refund order 881", timedelta(hours=4))
    finished_at = t0 + 30 * SECOND

    assert finish_run(run, now=finished_at) is True

    approval = Approval.objects.get(inbox=inbox)
    assert (approval.request_id, approval.action, approval.answer) == (
        "refund-881",
        "refund order 881",
        "",
    )
    assert (approval.requested_at, approval.expires_at) == (finished_at, finished_at + 4 * HOUR)
    timer = Timer.objects.get(inbox=inbox)
    assert (timer.key, timer.due, timer.every, timer.done) == (
        "expire:refund-881",
        finished_at + 4 * HOUR,
        None,
        False,
    )
    # The expiry fires under the answer's own key, so only one of them is ever stored.
    assert (timer.event_source, timer.event_id) == ("approval", "refund-881")
    assert timer.payload["answer"] == "expired"
    assert run.summary == "asked 1"


# A request id names one request for good: asked again while it waits it is the same request
# (test_approvals.py); once answered, asking it again raises, naming it, rather than finishing
# as "asked 1" with no new card and no answer ever to come.
TAKEN = "request_id 'refund-881' was answered already"


@pytest.mark.django_db
@pytest.mark.parametrize("answer", ["yes", "no"])
def test_asking_an_answered_request_id_again_raises_at_the_call_naming_it(inbox, t0, answer):
    request_approval(inbox, "refund-881", "refund order 881", 4 * HOUR, now=t0)
    answer_approval(inbox, "refund-881", answer, now=t0 + HOUR)
    ingest(inbox, "chat", "m2", {"text": "refund order 881"}, now=t0 + 2 * HOUR)
    run = start_run(inbox, "A", now=t0 + 2 * HOUR)

    with pytest.raises(ValueError, match=rf"^{TAKEN} \({answer}\).* new request_id"):
        run.ask("refund-881", "refund order 881", timedelta(hours=4))

    assert run.asked == 0
    run.ask(f"refund-881-{run.events[0].pk}", "refund order 881", timedelta(hours=4))
    assert finish_run(run, now=t0 + 2 * HOUR) is True
    assert Approval.objects.filter(inbox=inbox, answer="").count() == 1


@pytest.mark.django_db
def test_an_expired_request_id_is_answered_too(inbox, t0):
    request_approval(inbox, "refund-881", "refund order 881", 4 * HOUR, now=t0)
    run_scheduler(now=t0 + 5 * HOUR)  # the expiry stores "expired" under the answer's key
    ingest(inbox, "chat", "m2", {}, now=t0 + 5 * HOUR)
    run = start_run(inbox, "A", now=t0 + 5 * HOUR)

    with pytest.raises(ValueError, match=rf"^{TAKEN} \(expired\)"):
        run.ask("refund-881", "refund order 881", timedelta(hours=4))


@pytest.mark.django_db
def test_an_answer_that_lands_before_the_finish_refuses_the_ask_at_the_finish(inbox, t0):
    request_approval(inbox, "refund-881", "refund order 881", 4 * HOUR, now=t0)
    ingest(inbox, "chat", "m2", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    run.say("asked again")
    run.ask("refund-881", "refund order 881", timedelta(hours=4))  # waiting: the same request
    answer_approval(inbox, "refund-881", "no", now=t0 + 10 * SECOND)

    with pytest.raises(ValueError, match=rf"^{TAKEN} \(no\)"):
        finish_run(run, now=t0 + 20 * SECOND)

    assert not OutboxMessage.objects.filter(inbox=inbox).exists()  # nothing of the run
    assert Event.objects.get(source_id="m2").status == "running"


@pytest.mark.django_db
def test_a_request_waiting_past_its_deadline_is_answered_at_the_finish(inbox, t0):
    """The expiry stands once the deadline passed, even before its timer fired."""
    request_approval(inbox, "refund-881", "refund order 881", 30 * SECOND, now=t0)
    ingest(inbox, "chat", "m2", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    run.ask("refund-881", "refund order 881", timedelta(hours=4))

    with pytest.raises(ValueError, match=rf"^{TAKEN} \(expired\)"):
        finish_run(run, now=t0 + 30 * SECOND)


@pytest.mark.django_db
def test_an_answer_event_that_outlived_its_request_s_row_keeps_the_id_taken(inbox, t0):
    """A new request under it could never store its own answer."""
    request_approval(inbox, "refund-881", "refund order 881", 4 * HOUR, now=t0)
    ingest(inbox, "chat", "m2", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    run.ask("refund-881", "refund order 881", timedelta(hours=4))  # waiting: the same request
    answer_approval(inbox, "refund-881", "yes", now=t0 + 10 * SECOND)
    Approval.objects.filter(inbox=inbox).delete()  # pruned before its answer event

    with pytest.raises(ValueError, match=rf"^{TAKEN} \(yes\)"):
        run.ask("refund-881", "refund order 881", timedelta(hours=4))
    with pytest.raises(ValueError, match=rf"^{TAKEN} \(yes\)"):
        finish_run(run, now=t0 + 20 * SECOND)
    assert not Approval.objects.exists()


@pytest.mark.django_db
def test_schedule_with_due_or_delay_counts_delay_from_the_finish(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    run.schedule("at-noon", t0 + 6 * HOUR, payload={"task": "noon"})
    run.schedule("follow-up", delay=90)
    run.schedule("hourly", delay=timedelta(minutes=5), every=3600)
    finished_at = t0 + 30 * SECOND

    assert finish_run(run, now=finished_at) is True

    timers = Timer.objects.filter(inbox=inbox).order_by("key")
    assert list(timers.values_list("key", "due", "every", "payload")) == [
        ("at-noon", t0 + 6 * HOUR, None, {"task": "noon"}),
        ("follow-up", finished_at + 90 * SECOND, None, {}),
        ("hourly", finished_at + 5 * 60 * SECOND, 3600, {}),
    ]
    assert run.summary == ""  # said nothing


@pytest.mark.django_db
def test_state_is_saved_to_the_session_by_the_finish(inbox, t0):
    Session.objects.filter(inbox=inbox).update(state={"awaiting": {"refund-1": "1"}})
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    assert run.state == {"awaiting": {"refund-1": "1"}}
    run.state["awaiting"].pop("refund-1")
    run.state["seen"] = ["m1"]
    # The run's state is a copy: the session row is untouched until the finish.
    assert session_state(inbox) == {"awaiting": {"refund-1": "1"}}
    finished_at = t0 + 30 * SECOND

    assert finish_run(run, now=finished_at) is True

    saved = Session.objects.get(inbox=inbox)
    assert (saved.state, saved.updated) == ({"awaiting": {}, "seen": ["m1"]}, finished_at)


@pytest.mark.django_db
def test_replaced_state_is_what_the_finish_saves(inbox, t0):
    Session.objects.filter(inbox=inbox).update(state={"old": True})
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    run.state = {"new": 1}

    assert finish_run(run, now=t0) is True
    assert session_state(inbox) == {"new": 1}


@pytest.mark.django_db
def test_finish_with_an_error_drops_every_verb(inbox, t0):
    Session.objects.filter(inbox=inbox).update(state={"keep": 1})
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)
    run.say("x", urgent=True)
    run.ask("r1", "do it", 60)
    run.schedule("later", delay=5)
    run.state["keep"] = 2

    assert finish_run(run, now=t0, error="boom") is True

    assert nothing_written(inbox)
    assert session_state(inbox) == {"keep": 1}
    assert Event.objects.values_list("status", "error").get() == ("pending", "boom")


# --- a run whose agent raises, or whose finish is refused (through Worker.step) ---------------


@pytest.mark.django_db
def test_agent_exception_puts_the_events_back_with_the_traceback(inbox):
    Session.objects.filter(inbox=inbox).update(state={"keep": 1})
    ingest(inbox, "chat", "m1", {"text": "a"})
    ingest(inbox, "chat", "m2", {"text": "b"})

    def agent(run):
        run.say("half done", urgent=True)
        run.ask("r1", "do it", 60)
        run.schedule("later", delay=5)
        run.state["keep"] = 2
        raise RuntimeError("payment tool exploded (order 881)")

    result = Worker("w1", agent).step()

    assert result.outcome == "error: RuntimeError: payment tool exploded (order 881)"
    events = list(Event.objects.filter(inbox=inbox).order_by("id"))
    assert [(e.source_id, e.status, e.attempts) for e in events] == [
        ("m1", "pending", 1),
        ("m2", "pending", 1),
    ]
    for e in events:
        assert e.error.startswith("Traceback (most recent call last):")
        assert "RuntimeError: payment tool exploded (order 881)" in e.error
        assert "in agent" in e.error  # the frame that raised
        assert e.available_at > e.updated  # backing off before the next attempt
    assert nothing_written(inbox)
    assert session_state(inbox) == {"keep": 1}
    assert lease(inbox).until is None  # released


@pytest.mark.django_db
def test_run_whose_finish_is_refused_writes_nothing(inbox):
    Session.objects.filter(inbox=inbox).update(state={"keep": 1})
    ingest(inbox, "chat", "m1", {})
    taken = {}

    def agent(run):
        run.say("done", urgent=True)
        run.ask("r1", "do it", 60)
        run.schedule("later", delay=5)
        run.state["keep"] = 2
        taken["gen"] = take_over(run.inbox)  # the worker stalls; B takes the inbox

    result = Worker("A", agent).step()

    assert result.outcome == "refused"
    assert nothing_written(inbox)
    assert session_state(inbox) == {"keep": 1}
    row = Event.objects.get(source_id="m1")
    assert (row.status, row.attempts, row.claim_gen, row.error) == (
        "running",
        1,
        result.generation,
        "",
    )
    # A's release after the refused finish does not free B's lease.
    held = lease(inbox)
    assert (held.holder, held.generation) == ("B", taken["gen"])
    assert held.until is not None


# --- key() -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_key_is_the_same_on_a_retry_of_the_same_events(inbox, t0, ttl):
    ingest(inbox, "chat", "m1", {}, now=t0)
    first = start_run(inbox, "A", now=t0)  # A dies mid-run
    later = t0 + ttl + 60 * SECOND
    retry = start_run(inbox, "B", now=later)

    assert [e.source_id for e in retry.events] == ["m1"]
    assert (retry.holder, retry.generation, retry.events[0].attempts) == ("B", 2, 2)
    assert retry.key("refund") == first.key("refund")
    assert retry.key("refund", retry.events[0]) == first.key("refund", first.events[0])


@pytest.mark.django_db
def test_key_differs_per_name_per_event_and_per_inbox(make_inbox, t0):
    a, b = make_inbox(), make_inbox()
    for inbox in (a, b):
        ingest(inbox, "chat", "m1", {}, now=t0)
        ingest(inbox, "chat", "m2", {}, now=t0)
    run_a, run_b = start_run(a, "A", now=t0), start_run(b, "A", now=t0)
    m1, m2 = run_a.events

    keys = {
        run_a.key("refund"),
        run_a.key("email"),
        run_a.key("refund", m1),
        run_a.key("refund", m2),
        run_a.key("email", m1),
        run_b.key("refund"),
        run_b.key("refund", run_b.events[0]),
    }
    assert len(keys) == 7
    assert run_a.key("refund").startswith("refund-")
    assert run_a.key("refund") == run_a.key("refund")  # stable within a run
    # Short enough for an idempotency-key column (payments' is 100 characters).
    assert len(run_a.key("refund", m1)) <= 50


@pytest.mark.django_db
def test_key_of_an_event_survives_rebatching(inbox, t0, settings):
    settings.ALWAYSON_RETRY_BASE = 10
    ingest(inbox, "chat", "m1", {}, now=t0)
    ingest(inbox, "chat", "m2", {}, now=t0)
    batch = start_run(inbox, "A", now=t0)
    assert [e.source_id for e in batch.events] == ["m1", "m2"]
    per_event = batch.key("refund", batch.events[0])
    per_batch = batch.key("refund")
    assert finish_run(batch, now=t0, error="crash") is True

    # The retry of m1 is claimed alone: a different batch.
    later = t0 + HOUR
    retry = start_run(inbox, "A", now=later)
    assert [e.source_id for e in retry.events] == ["m1"]

    assert retry.key("refund", retry.events[0]) == per_event
    assert retry.key("refund") != per_batch


# --- renew() and LeaseLost -------------------------------------------------------------------


@pytest.mark.django_db
def test_renew_moves_the_lease_forward(inbox):
    ingest(inbox, "chat", "m1", {})
    run = start_run(inbox, "A")
    soon = database_now() + 5 * SECOND
    Lease.objects.filter(inbox=inbox).update(until=soon)

    run.renew()

    held = lease(inbox)
    assert (held.holder, held.generation) == ("A", run.generation)
    assert held.until > soon
    assert run.lost is False


@pytest.mark.django_db
def test_renew_raises_lease_lost_after_a_takeover(inbox):
    ingest(inbox, "chat", "m1", {})
    run = start_run(inbox, "A")
    gen_b = take_over(inbox)
    taken = lease(inbox).until

    with pytest.raises(LeaseLost, match="lost"):
        run.renew()

    assert run.lost is True
    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("B", gen_b, taken)
    # Once lost, always lost: no second chance even if the row looked renewable.
    with pytest.raises(LeaseLost):
        run.renew()


@pytest.mark.django_db
def test_worker_reports_fenced_and_does_not_finish_when_renew_raises(inbox):
    ingest(inbox, "chat", "m1", {})
    seen = []

    def agent(run):
        run.say("step one done", urgent=True)
        take_over(run.inbox)
        run.renew()
        seen.append("after renew")  # never reached

    result = Worker("A", agent).step()

    assert result.outcome == "fenced"
    assert seen == []
    row = Event.objects.get(source_id="m1")
    assert (row.status, row.claim_gen, row.error) == ("running", result.generation, "")
    assert nothing_written(inbox)
    assert lease(inbox).holder == "B"


# --- bad verb arguments fail at the call ------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "verb",
    [
        lambda run: run.say(""),
        lambda run: run.say("   "),
        lambda run: run.say(None),
        lambda run: run.ask("r1", "refund order 1", 0),
        lambda run: run.ask("r1", "refund order 1", -5),
        lambda run: run.ask("r1", "refund order 1", timedelta(0)),
        lambda run: run.ask("", "refund order 1", 60),
        lambda run: run.ask("r1", "", 60),
        lambda run: run.schedule("k", due=None, delay=None),
        lambda run: run.schedule("k", due=None, delay=-1),
        lambda run: run.schedule("", delay=5),
    ],
)
def test_bad_verb_arguments_raise_at_the_call(inbox, t0, verb):
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)

    with pytest.raises(ValueError):
        verb(run)

    assert (run.said, run.asked) == (0, 0)
    # Nothing to commit: no verb was recorded and the state is as the claim read it.
    assert run.effects() == []
    assert finish_run(run, now=t0) is True
    assert nothing_written(inbox)


@pytest.mark.django_db
def test_schedule_with_both_due_and_delay_raises(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0)

    with pytest.raises(ValueError, match="not both"):
        run.schedule("k", t0 + HOUR, delay=60)
    with pytest.raises(ValueError, match="aware"):
        run.schedule("k", t0.replace(tzinfo=None))

    assert run.effects() == []


@pytest.mark.django_db
def test_a_run_that_leaves_the_state_alone_writes_no_session_row(inbox, t0):
    Session.objects.filter(inbox=inbox).update(state={"seen": 1}, updated=t0)
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0 + SECOND)
    run.state = {"seen": 1}  # replaced by an equal value: still nothing to write

    assert run.effects() == []
    assert finish_run(run, now=t0 + SECOND)
    assert Session.objects.filter(inbox=inbox).values_list("state", "updated").get() == (
        {"seen": 1},
        t0,
    )


@pytest.mark.django_db
def test_a_state_changed_in_place_is_saved_with_the_finish(inbox, t0):
    Session.objects.filter(inbox=inbox).update(state={"seen": 1}, updated=t0)
    ingest(inbox, "chat", "m1", {}, now=t0)
    run = start_run(inbox, "A", now=t0 + SECOND)
    run.state["seen"] += 1

    # The state is kept for a replay of the next run too (SavedState).
    assert [type(e) for e in run.effects()] == [SaveState, KeepState]
    assert finish_run(run, now=t0 + SECOND)
    assert Session.objects.filter(inbox=inbox).values_list("state", "updated").get() == (
        {"seen": 2},
        t0 + SECOND,
    )


# --- the heartbeat ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_heartbeat_renews_tracked_runs(make_inbox):
    a, b = make_inbox(), make_inbox()
    for inbox in (a, b):
        ingest(inbox, "chat", "m1", {})
    run_a = start_run(a, "A")
    start_run(b, "A")
    soon = database_now() + 5 * SECOND
    Lease.objects.update(until=soon)
    heartbeat = Heartbeat()
    heartbeat.track(run_a)

    heartbeat.beat()

    assert lease(a).until > soon
    assert lease(b).until == soon  # not tracked, not renewed
    assert run_a.lost is False

    heartbeat.untrack(run_a)
    Lease.objects.update(until=soon)
    heartbeat.beat()
    assert lease(a).until == soon


@pytest.mark.django_db
def test_heartbeat_marks_a_run_lost_when_its_lease_was_taken_over(inbox):
    ingest(inbox, "chat", "m1", {})
    run = start_run(inbox, "A")
    gen_b = take_over(inbox)
    taken = lease(inbox).until
    heartbeat = Heartbeat()
    heartbeat.track(run)

    heartbeat.beat()

    assert run.lost is True
    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("B", gen_b, taken)
    with pytest.raises(LeaseLost):
        run.renew()


@pytest.mark.django_db
def test_run_marked_lost_by_the_heartbeat_is_fenced_at_its_next_renew(inbox):
    ingest(inbox, "chat", "m1", {})
    heartbeat = Heartbeat()

    def agent(run):
        run.say("partial", urgent=True)
        take_over(run.inbox)
        heartbeat.beat()  # the heartbeat notices first
        assert run.lost
        run.renew()

    result = Worker("A", agent, heartbeat).step()

    assert result.outcome == "fenced"
    assert nothing_written(inbox)
    assert Event.objects.get(source_id="m1").status == "running"


def test_heartbeat_beats_four_times_per_ttl(settings):
    settings.ALWAYSON_LEASE_TTL = 60
    assert Heartbeat().interval == 15


# --- load_agent ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "no.such.module.agent",
        "alwayson.demo.refund_desk.no_such_agent",
        "not-a-dotted-path",
        "alwayson.demo.refund_desk.APPROVAL_WINDOW",  # importable, not callable
    ],
)
def test_load_agent_with_a_bad_path_raises_value_error(path):
    with pytest.raises(ValueError, match="ALWAYSON_AGENT"):
        load_agent(path)


EXAMPLE = "such as 'myapp.agent.agent' (the function agent in myapp/agent.py)"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        # A module whose agent is the function `agent`: the path to name instead.
        (
            "alwayson.demo.refund_desk",
            "ALWAYSON_AGENT: 'alwayson.demo.refund_desk' is a module, not a callable: name the"
            " function (or other callable) in it that takes a Run, such as"
            " 'alwayson.demo.refund_desk.agent'",
        ),
        (
            "alwayson.demo",
            "ALWAYSON_AGENT: 'alwayson.demo' is a module, not a callable: name the function"
            f" (or other callable) in it that takes a Run, {EXAMPLE}",
        ),
        (
            "alwayson.demo.refund_desk.APPROVAL_WINDOW",
            "ALWAYSON_AGENT: 'alwayson.demo.refund_desk.APPROVAL_WINDOW' is not callable (a"
            f" timedelta): it must be the dotted path to a callable that takes a Run, {EXAMPLE}",
        ),
        (
            "refund_desk",
            "ALWAYSON_AGENT: cannot import 'refund_desk': refund_desk doesn't look like a module"
            f" path. It must be the dotted path to a callable that takes a Run, {EXAMPLE}",
        ),
    ],
)
def test_load_agent_says_what_the_path_names_and_what_it_must_name(path, message):
    with pytest.raises(ValueError) as refused:
        load_agent(path)

    assert str(refused.value) == message


def test_an_agent_whose_module_imports_a_missing_package_is_named_right(tmp_path, monkeypatch):
    (tmp_path / "acme_desk.py").write_text("import acme_payments_sdk\n\ndef agent(run): pass\n")
    monkeypatch.syspath_prepend(tmp_path)

    with pytest.raises(ValueError) as refused:
        load_agent("acme_desk.agent")

    # The path is right: no advice to change it.
    assert str(refused.value) == (
        "ALWAYSON_AGENT: cannot import 'acme_desk.agent': No module named 'acme_payments_sdk'"
    )


def test_load_agent_defaults_to_the_setting(settings):
    settings.ALWAYSON_AGENT = "tests.support.agents.worker_echo_agent"
    from tests.support.agents import worker_echo_agent

    assert load_agent() is worker_echo_agent
    assert load_agent("alwayson.demo.refund_desk.agent").__name__ == "agent"


@pytest.mark.django_db
def test_an_agents_own_effect_commits_with_the_finish_and_not_with_a_refused_one(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    ingest(inbox, "chat", "m2", {}, now=t0)
    seen = []

    def write(now):
        seen.append(now)
        Session.objects.filter(inbox=inbox).update(state={"written": True}, updated=now)

    run = start_run(inbox, "A", now=t0)
    run.effect(write)
    Lease.objects.filter(inbox=inbox).update(generation=run.generation + 1)
    assert finish_run(run, now=t0 + SECOND) is False
    assert seen == [] and session_state(inbox) == {}

    Lease.objects.filter(inbox=inbox).update(generation=run.generation)
    assert finish_run(run, now=t0 + SECOND) is True
    assert seen == [t0 + SECOND] and session_state(inbox) == {"written": True}

    with pytest.raises(ValueError, match="effect must be callable, not dict"):
        run.effect({"not": "callable"})
    run.effect(write)
    run.defer("not yet", delay=60)
    assert run.effects() == []
