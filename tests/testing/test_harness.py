"""The test kit (alwayson/testing/), tested with itself: the `harness` fixture drives the
product's own loops on the pinned clock, on both databases."""

from datetime import timedelta

import pytest
from django.core import mail

from alwayson.testing import AgentError, Delivery, Harness, NotIdle, SetTimer
from inbox import clock
from inbox.models import Event

DESK = "tests.support.kit_agents.desk"


def test_a_chat_message_reaches_the_agent_and_its_reply_is_sent_by_email(harness):
    desk = harness.inbox("desk", agent=DESK)

    assert desk.chat("hello there")
    runs = harness.run_until_idle()

    assert [run.outcome for run in runs] == ["said 1"]
    [event] = desk.events()
    assert (event.source, event.payload) == ("chat", {"text": "hello there", "from": "desk-owner"})
    assert desk.said() == ["desk-owner said: hello there"]
    assert desk.sent() == [
        Delivery("email", "desk-owner@example.com", "desk-owner said: hello there", harness.now)
    ]
    [email] = mail.outbox
    assert email.to == ["desk-owner@example.com"] and email.body == "desk-owner said: hello there"
    assert desk.state == {"seen": 1}


def test_a_chat_message_delivered_twice_is_one_event(harness):
    desk = harness.inbox("desk", agent=DESK)

    assert desk.chat("hi", message_id="m-1")
    assert not desk.chat("hi", message_id="m-1")
    assert len(desk.events()) == 1


def test_chat_from_a_member_names_them(harness):
    desk = harness.inbox("desk", agent=DESK)
    dana = desk.member("dana")

    desk.chat("hello", by=dana)
    harness.run_until_idle()

    assert desk.said() == ["dana said: hello"]


def test_a_plain_event_is_delivered_under_its_key_and_a_reserved_source_is_refused(harness):
    desk = harness.inbox("desk", agent=DESK)

    assert desk.deliver("crm", "ticket-7", {"type": "ticket.opened"})
    assert not desk.deliver("crm", "ticket-7", {"type": "ticket.opened"})
    with pytest.raises(ValueError, match="reserved"):
        desk.deliver("timer", "forged", {})
    harness.run_until_idle()

    assert desk.said() == ["crm ticket-7: ticket.opened"]


def test_every_operation_reads_the_harness_clock(harness):
    desk = harness.inbox("desk", agent=DESK)
    assert clock.database_now() == harness.now
    start = harness.now

    harness.clock.jump(minutes=5)
    desk.chat("hello")
    harness.run_until_idle()

    [event] = desk.events()
    # Stored by the ingest statement, finished by the worker, sent by the dispatcher: all
    # at the pinned instant (on PostgreSQL, the statements' own clock gives way to it).
    assert event.created == event.updated == start + timedelta(minutes=5)
    [message] = desk.messages()
    assert message.sent_at == start + timedelta(minutes=5) == clock.database_now()


def test_time_only_moves_forward(harness):
    with pytest.raises(ValueError, match="forward"):
        harness.clock.jump(seconds=-1)
    with pytest.raises(ValueError, match="forward"):
        harness.advance(timedelta(hours=-1))
    with pytest.raises(ValueError, match="forward"):
        harness.clock.travel_to(harness.now - timedelta(seconds=1))
    with pytest.raises(ValueError, match="not both"):
        harness.advance(timedelta(hours=1), minutes=3)


def test_one_harness_at_a_time(harness):
    with pytest.raises(RuntimeError, match="pinned already"), Harness():
        pass


@pytest.mark.django_db
def test_a_harness_that_stops_gives_the_clock_back():
    with Harness() as harness:
        harness.clock.jump(days=30)
        assert clock.database_now() == harness.now
    assert abs(clock.database_now() - harness.now) > timedelta(days=29)


# --- the loops -----------------------------------------------------------------------------------


def test_an_agent_error_fails_the_test_with_its_traceback(harness):
    desk = harness.inbox("desk", agent="tests.support.kit_agents.broken")
    desk.chat("hello")

    with pytest.raises(AgentError, match="the agent broke on purpose") as failed:
        harness.run_until_idle()
    assert "Traceback" in str(failed.value)


def test_without_raising_a_failed_run_is_retried_after_its_backoff(harness, settings):
    settings.ALWAYSON_MAX_ATTEMPTS = 2
    desk = harness.inbox("desk", agent="tests.support.kit_agents.broken")
    desk.chat("hello")

    [first] = harness.run_until_idle(raise_errors=False)
    assert first.outcome.startswith("error")
    [event] = desk.events()
    assert (event.status, event.attempts) == ("pending", 1)
    assert event.available_at > harness.now

    retries = harness.advance(hours=2, raise_errors=False)

    # One retry at the end of its backoff; the claim after that parks it: out of attempts.
    assert [run.outcome.startswith("error") for run in retries] == [True]
    assert harness.runs == [first, *retries]
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("dead", 2)


def test_an_agent_that_never_settles_is_reported_not_run_forever(harness, monkeypatch):
    # The bound itself, not its size, is what is checked: 1000 steps took a minute and a half
    # of a loaded CI run.
    monkeypatch.setattr("alwayson.testing.harness.MAX_STEPS", 20)
    desk = harness.inbox("desk", agent="tests.support.kit_agents.restless")
    desk.chat("hello")

    with pytest.raises(NotIdle, match="still busy after 20 steps"):
        harness.run_until_idle()


def test_the_default_agent_is_the_harness_agent_or_alwayson_agent(db, settings):
    settings.ALWAYSON_AGENT = DESK
    with Harness() as harness:
        harness.inbox("a").chat("one")
        harness.run_until_idle()
        assert harness.runs[-1].outcome == "said 1"
    with Harness(agent="tests.support.kit_agents.broken") as harness:
        harness.inbox("b").chat("two")
        with pytest.raises(AgentError):
            harness.run_until_idle()


def test_an_inbox_agent_config_is_checked_as_the_admin_checks_it(harness):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="cannot import"):
        harness.inbox("desk", agent="tests.support.kit_agents.nowhere")
    with pytest.raises(ValueError, match="dotted path"):
        harness.inbox("other", agent=lambda run: None)
    with pytest.raises(ValidationError, match="must be at least 1024 tokens"):
        harness.inbox("thinker", agent="alwayson.claude.agent", thinking_budget=512)
    with pytest.raises(ValidationError, match="the name of a tool the inbox offers"):
        harness.inbox("chooser", agent="alwayson.claude.agent", tools=[], tool_choice="refund")
    from alwayson.claude.models import ModelSettings
    from alwayson.runtime.models import AgentConfig

    assert not AgentConfig.objects.filter(inbox__slug__in=["thinker", "chooser"]).exists()
    harness.inbox("sender", agent="alwayson.claude.agent", tools=[], tool_choice="send_message")
    assert ModelSettings.objects.get(config__inbox__slug="sender").tool_choice == "send_message"


# --- time travel ---------------------------------------------------------------------------------


def test_advance_fires_a_timer_at_its_own_instant(harness):
    desk = harness.inbox("desk", agent=DESK)
    desk.chat("later")
    harness.run_until_idle()
    start = harness.now
    assert desk.timers() == [
        SetTimer("follow-up", start + timedelta(hours=1), {"about": "later"}, None, "")
    ]

    harness.advance(hours=4)

    assert harness.now == start + timedelta(hours=4)
    assert desk.timers() == []
    follow_up = desk.messages()[-1]
    assert follow_up.text.startswith("Following up (follow-up@") and "late by 0 s" in follow_up.text
    [timer_event] = desk.events("timer")
    assert timer_event.created == start + timedelta(hours=1)


def test_a_recurring_timer_fires_at_each_occurrence_while_time_passes(harness):
    from timers.services import add_timer

    desk = harness.inbox("desk", agent=DESK)
    add_timer(desk.inbox, "digest", harness.now + timedelta(hours=1), {}, every=3600)

    harness.advance(hours=3)

    keys = [event.payload["skipped"] for event in desk.events("timer")]
    assert keys == [0, 0, 0]
    assert len(desk.said()) == 3


def test_a_jump_runs_nothing_and_the_scheduler_then_coalesces_what_it_missed(harness):
    from timers.services import add_timer

    desk = harness.inbox("desk", agent=DESK)
    add_timer(desk.inbox, "digest", harness.now + timedelta(hours=1), {}, every=3600)

    harness.clock.jump(hours=3)
    assert desk.events() == []
    harness.run_until_idle()

    [event] = desk.events("timer")
    assert event.payload["skipped"] == 2


def test_the_outbox_gap_passes_without_sleeping(harness, settings):
    settings.ALWAYSON_OUTBOX_GAP = 600
    desk = harness.inbox("desk", agent=DESK)
    desk.chat("one")
    harness.run_until_idle()
    first_sent = harness.now
    harness.clock.jump(minutes=1)
    desk.chat("two")
    harness.run_until_idle()

    assert [m.status for m in desk.messages()] == ["sent", "held"]

    harness.advance(minutes=30)

    assert [m.status for m in desk.messages()] == ["sent", "sent"]
    assert desk.messages()[1].sent_at == first_sent + timedelta(seconds=600)
    assert [d.at for d in desk.sent()] == [first_sent, first_sent + timedelta(seconds=600)]


# --- approvals -----------------------------------------------------------------------------------


def test_an_answer_goes_through_the_answer_path_and_resumes_the_agent(harness):
    desk = harness.inbox("desk", agent=DESK)
    dana = desk.member("dana")
    desk.chat("refund 881")
    harness.run_until_idle()
    [approval] = desk.waiting_for_approval()
    assert (approval.request_id, approval.action) == ("refund-881", "refund order 881")
    assert [t.key for t in desk.timers(expiries=True)] == ["expire:refund-881"]
    assert desk.timers() == []

    assert harness.answer(approval, "yes", by=dana) == "yes"
    harness.run_until_idle()

    assert desk.waiting_for_approval() == []
    assert desk.said()[-1] == "refund-881: yes from dana"
    assert desk.approvals()[0].answered_by == dana


def test_the_expiry_of_an_answered_approval_fires_later_and_changes_nothing(harness):
    desk = harness.inbox("desk", agent=DESK)
    desk.chat("refund 881")
    harness.run_until_idle()
    desk.answer("refund-881", "no")
    harness.run_until_idle()
    said = desk.said()

    runs = harness.advance(hours=5)

    assert runs == []
    assert desk.said() == said
    assert desk.timers(expiries=True) == []
    assert [e.payload["answer"] for e in desk.events("approval")] == ["no"]


def test_a_viewer_may_not_answer(harness):
    from approvals.services import MayNotAnswer

    desk = harness.inbox("desk", agent=DESK)
    viewer = desk.member("vic", role="viewer")
    desk.chat("refund 881")
    harness.run_until_idle()

    with pytest.raises(MayNotAnswer):
        desk.answer("refund-881", "yes", by=viewer)
    assert len(desk.waiting_for_approval()) == 1


def test_an_approval_nobody_answers_expires_while_time_passes(harness):
    desk = harness.inbox("desk", agent=DESK)
    desk.chat("refund 881")
    harness.run_until_idle()
    asked_at = harness.now

    harness.advance(hours=3, minutes=59)
    assert len(desk.waiting_for_approval()) == 1
    harness.advance(minutes=1)

    assert desk.waiting_for_approval() == []
    assert desk.said()[-1] == "Nobody answered refund-881: nothing was refunded."
    [answer] = desk.events("approval")
    assert answer.created == asked_at + timedelta(hours=4)


def test_a_yes_after_the_deadline_is_refused_even_before_the_expiry_fires(harness):
    desk = harness.inbox("desk", agent=DESK)
    desk.chat("refund 881")
    harness.run_until_idle()

    harness.clock.jump(hours=5)  # the scheduler has not run
    assert desk.answer("refund-881", "yes") == "expired"
    harness.run_until_idle()

    assert desk.said()[-1] == "Nobody answered refund-881: nothing was refunded."


def test_answer_wants_an_approval(harness):
    with pytest.raises(ValueError, match="must be an Approval"):
        harness.answer("refund-881", "yes")


# --- channels ------------------------------------------------------------------------------------


def test_sent_names_a_webhook_channel_and_its_url(harness):
    from tests.support.outbox import WebhookServer

    receiver = WebhookServer().start()
    try:
        desk = harness.inbox("desk", agent=DESK, channel={"kind": "webhook", "url": receiver.url()})
        desk.chat("hello")
        harness.run_until_idle()
    finally:
        receiver.stop()

    assert desk.sent() == [
        Delivery("webhook", receiver.url(), "desk-owner said: hello", harness.now)
    ]
    assert len(receiver.posts()) == 1


def test_a_failed_send_is_retried_when_its_backoff_has_passed(harness):
    desk = harness.inbox("desk", agent=DESK)
    desk.owner.email = ""
    desk.owner.save()
    desk.chat("hello")
    harness.run_until_idle()
    assert desk.sent() == []
    [message] = desk.messages()
    assert message.status == "held"

    desk.owner.email = "owner@example.com"
    desk.owner.save()
    harness.advance(minutes=5)

    assert [(d.channel, d.to) for d in desk.sent()] == [("email", "owner@example.com")]


def test_events_left_pending_show_their_state(harness):
    desk = harness.inbox("desk", agent=DESK)
    desk.chat("hello")
    assert [e.status for e in desk.events()] == [Event.Status.PENDING]
    harness.run_until_idle()
    assert [e.status for e in desk.events()] == [Event.Status.DONE]
