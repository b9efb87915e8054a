"""The Python API under bad input: a table of operation x bad argument x the error it gets.

Every row is refused with a ValueError (or UnknownInbox, a LookupError) whose message names
the argument, and every table is unchanged afterwards: nothing is half-written. The same rows
run on SQLite and PostgreSQL; a value one database would store and the other refuse (a NUL, an
over-long key) must get the same clear error on both, before any SQL runs.
"""

import math
import re
from datetime import datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from alwayson.egress.exceptions import EgressRefused
from alwayson.egress.gateway import Egress
from alwayson.egress.services import check_services
from alwayson.ops.models import Process
from approvals.models import Approval, AuditEntry
from approvals.services import answer_approval, answer_group, request_approval
from inbox.exceptions import UnknownInbox
from inbox.models import Event, Inbox, Lease, Session
from inbox.services import (
    Defer,
    Failed,
    Held,
    acquire,
    acquire_next,
    claim_batch,
    claim_more,
    finish,
    ingest,
    mark_dead,
    release,
    renew,
    requeue,
)
from outbox.models import Channel, Notice, OutboxMessage
from outbox.services import Say, dispatch, dispatch_inbox, dispatch_notices
from tests.support.clock import T0
from timers.models import Timer
from timers.services import Schedule, add_timer, run_scheduler

pytestmark = pytest.mark.django_db

MODELS = (Inbox, Lease, Event, Session, Timer, Approval, AuditEntry, OutboxMessage, Notice)
MODELS += (Channel, Process)
HOUR = timedelta(hours=1)
NAIVE = datetime(2026, 3, 1, 12, 0)


def deep(levels):
    value = []
    for _ in range(levels):
        value = [value]
    return value


DEEP = deep(10_000)
HUGE_TEXT = "x" * (9 * 1024 * 1024)


def snapshot():
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in MODELS}


class World:
    """One inbox with a row in every state an operation could touch, and a run in progress."""

    def __init__(self, inbox, t0):
        self.inbox, self.t0 = inbox, t0
        ingest(inbox, "chat", "dead", {"text": "d"}, now=t0)
        Event.objects.filter(source_id="dead").update(status=Event.Status.DEAD)
        ingest(inbox, "chat", "running", {"text": "r"}, now=t0)
        self.gen = acquire(inbox, "A", now=t0)
        self.batch = claim_batch(inbox, "A", self.gen, now=t0)
        ingest(inbox, "chat", "pending", {"text": "p"}, now=t0)
        add_timer(inbox, "digest", t0 + HOUR, {}, every=60)
        request_approval(inbox, "refund-1", "refund order 1", HOUR, now=t0)
        OutboxMessage.objects.create(inbox=inbox, body="held", created=t0)
        self.ids = [event.pk for event in self.batch]
        self.dead_id = Event.objects.get(source_id="dead").pk
        self.pending_id = Event.objects.get(source_id="pending").pk


@pytest.fixture(scope="module")
def built_world(django_db_setup, django_db_blocker):
    """Built once for the module inside a transaction rolled back at its end; each test runs
    in a savepoint within it (pytest-django nests its per-test atomic block)."""
    with django_db_blocker.unblock(), transaction.atomic():
        owner = get_user_model().objects.create_user("world-owner")
        yield World(Inbox.objects.create(owner=owner, slug="desk"), T0)
        transaction.set_rollback(True)


@pytest.fixture
def world(db, built_world):
    return built_world


def ingest_with(**kwargs):
    def call(w):
        args = {"inbox": w.inbox, "source": "chat", "source_id": "new", "payload": {}}
        return ingest(**{**args, "now": w.t0, **kwargs})

    return call


def finish_with(**kwargs):
    def call(w):
        held = {"inbox": w.inbox, "holder": "A", "generation": w.gen, "event_ids": w.ids}
        rest = {"now": w.t0, **kwargs}
        held.update((name, rest.pop(name)) for name in kwargs if name in held)
        return finish(Held(**held), **rest)

    return call


def timer_with(**kwargs):
    def call(w):
        args = {"inbox": w.inbox, "key": "new-timer", "due": w.t0 + HOUR, "payload": {}}
        args.update(kwargs)
        return add_timer(**args)

    return call


def ask_with(**kwargs):
    def call(w):
        args = {"inbox": w.inbox, "request_id": "refund-2", "action": "refund 2"}
        return request_approval(**{**args, "expires_in": HOUR, "now": w.t0, **kwargs})

    return call


def answer_with(**kwargs):
    def call(w):
        args = {"inbox": w.inbox, "request_id": "refund-1", "answer": "yes", "now": w.t0}
        return answer_approval(**{**args, **kwargs}).stands

    return call


# (id, call, exception, message): the message names the argument.
CASES = [
    # --- ingest ---------------------------------------------------------------------------
    ("ingest-source-int", ingest_with(source=5), ValueError, "source must be a non-empty string"),
    ("ingest-source-bytes", ingest_with(source=b"chat"), ValueError, "source must be a non-empty"),
    ("ingest-source-empty", ingest_with(source=""), ValueError, "source must be a non-empty"),
    ("ingest-source-long", ingest_with(source="s" * 101), ValueError, "source is longer than 100"),
    ("ingest-source-nul", ingest_with(source="ch\x00at"), ValueError, "source contains a NUL"),
    ("ingest-id-none", ingest_with(source_id=None), ValueError, "source_id must be a non-empty"),
    ("ingest-id-int", ingest_with(source_id=7), ValueError, "source_id must be a non-empty"),
    ("ingest-id-blank", ingest_with(source_id=" \t"), ValueError, "source_id must be a non-empty"),
    ("ingest-id-long", ingest_with(source_id="i" * 256), ValueError, "source_id is longer than"),
    ("ingest-id-huge", ingest_with(source_id="i" * 10**6), ValueError, "source_id is longer"),
    ("ingest-id-nul", ingest_with(source_id="m\x00"), ValueError, "source_id contains a NUL"),
    ("ingest-id-surrogate", ingest_with(source_id="m\ud800"), ValueError, "source_id contains a"),
    ("ingest-payload-set", ingest_with(payload={"a": {1}}), ValueError, "payload is not JSON"),
    ("ingest-payload-nan", ingest_with(payload={"a": math.nan}), ValueError, "payload is not JSON"),
    ("ingest-payload-inf", ingest_with(payload={"a": math.inf}), ValueError, "payload is not JSON"),
    ("ingest-payload-date", ingest_with(payload={"a": NAIVE}), ValueError, "payload is not JSON"),
    ("ingest-payload-bytes", ingest_with(payload={"a": b"x"}), ValueError, "payload is not JSON"),
    ("ingest-payload-list", ingest_with(payload=[1, 2]), ValueError, "payload must be a JSON obj"),
    ("ingest-payload-str", ingest_with(payload="hi"), ValueError, "payload must be a JSON object"),
    ("ingest-payload-key", ingest_with(payload={1: "a"}), ValueError, "payload has a non-string"),
    (
        "ingest-payload-key-among-plain-values",
        ingest_with(payload={"text": "a", 2: None}),
        ValueError,
        "payload has a non-string",
    ),
    ("ingest-payload-deep", ingest_with(payload={"a": DEEP}), ValueError, "payload nests deeper"),
    ("ingest-payload-huge", ingest_with(payload={"a": HUGE_TEXT}), ValueError, "payload is larger"),
    ("ingest-inbox-none", ingest_with(inbox=None), UnknownInbox, "unknown inbox: None"),
    ("ingest-inbox-bool", ingest_with(inbox=True), UnknownInbox, "unknown inbox: True"),
    ("ingest-inbox-bytes", ingest_with(inbox=b"desk"), UnknownInbox, "unknown inbox: b'desk'"),
    ("ingest-inbox-float", ingest_with(inbox=1.0), UnknownInbox, "unknown inbox: 1.0"),
    ("ingest-inbox-bigint", ingest_with(inbox=2**70), UnknownInbox, "unknown inbox"),
    ("ingest-inbox-nul", ingest_with(inbox="de\x00sk"), UnknownInbox, "unknown inbox"),
    ("ingest-now-str", ingest_with(now="2026-03-01T12:00Z"), ValueError, "now must be"),
    # --- the lease verbs ------------------------------------------------------------------
    ("acquire-holder-int", lambda w: acquire(w.inbox, 1, now=w.t0), ValueError, "holder must be"),
    ("acquire-holder-empty", lambda w: acquire(w.inbox, "", now=w.t0), ValueError, "holder must"),
    (
        "acquire-holder-long",
        lambda w: acquire(w.inbox, "h" * 201, now=w.t0),
        ValueError,
        "holder is longer than 200",
    ),
    ("acquire-holder-nul", lambda w: acquire(w.inbox, "A\x00", now=w.t0), ValueError, "holder con"),
    ("acquire-naive", lambda w: acquire(w.inbox, "B", now=NAIVE), ValueError, "now must be"),
    ("acquire_next-holder", lambda w: acquire_next(None, now=w.t0), ValueError, "holder must be"),
    (
        "acquire_next-holder-long",
        lambda w: acquire_next("h" * 201, now=w.t0),
        ValueError,
        "holder is longer than 200",
    ),
    (
        "claim-gen-str",
        lambda w: claim_batch(w.inbox, "A", str(w.gen), now=w.t0),
        ValueError,
        "generation must be an int",
    ),
    (
        "claim-holder-int",
        lambda w: claim_batch(w.inbox, 1, w.gen, now=w.t0),
        ValueError,
        "holder must be",
    ),
    (
        "claim_more-gen-str",
        lambda w: claim_more(w.inbox, "A", str(w.gen), ["chat"], now=w.t0),
        ValueError,
        "generation must be an int",
    ),
    (
        "claim_more-sources-str",
        lambda w: claim_more(w.inbox, "A", w.gen, "chat", now=w.t0),
        ValueError,
        "sources must be a non-empty list",
    ),
    (
        "claim_more-source-nul",
        lambda w: claim_more(w.inbox, "A", w.gen, ["ch\x00at"], now=w.t0),
        ValueError,
        "sources contains a NUL",
    ),
    (
        "claim_more-naive",
        lambda w: claim_more(w.inbox, "A", w.gen, ["chat"], now=NAIVE),
        ValueError,
        "now must be",
    ),
    ("renew-gen-float", lambda w: renew(w.inbox, "A", 1.0, now=w.t0), ValueError, "generation"),
    ("renew-holder-int", lambda w: renew(w.inbox, 5, w.gen, now=w.t0), ValueError, "holder must"),
    ("renew-naive", lambda w: renew(w.inbox, "A", w.gen, now=NAIVE), ValueError, "now must be"),
    ("release-gen-bool", lambda w: release(w.inbox, "A", True), ValueError, "generation must be"),
    ("release-holder-none", lambda w: release(w.inbox, None, w.gen), ValueError, "holder must"),
    # --- finish, its effects and Defer ----------------------------------------------------
    ("finish-ids-str", finish_with(event_ids="12"), ValueError, "event_ids must be"),
    ("finish-ids-none", finish_with(event_ids=None), ValueError, "event_ids must be"),
    ("finish-ids-text", finish_with(event_ids=["x"]), ValueError, "event_ids must be"),
    ("finish-ids-float", finish_with(event_ids=[1.5]), ValueError, "event_ids must be"),
    ("finish-ids-bool", finish_with(event_ids=[True]), ValueError, "event_ids must be"),
    ("finish-gen-str", finish_with(generation="1"), ValueError, "generation must be an int"),
    ("finish-holder-bytes", finish_with(holder=b"A"), ValueError, "holder must be"),
    ("finish-effects-none", finish_with(effects=None), ValueError, "effects must be"),
    ("finish-effects-str", finish_with(effects=["say hi"]), ValueError, r"effects\[0\] is not"),
    ("finish-effects-one", finish_with(effects=lambda now: None), ValueError, "effects must be"),
    ("finish-error-int", lambda w: Failed(500), ValueError, "error must be a string"),
    ("finish-error-nul", lambda w: Failed("bo\x00om"), ValueError, "error contains a NUL"),
    ("finish-error-empty", lambda w: Failed(""), ValueError, "error must be a non-empty"),
    ("finish-outcome-str", finish_with(outcome="later"), ValueError, "Done, Failed or Defer"),
    (
        "finish-error-and-defer",
        finish_with(outcome=(Failed("x"), Defer("wait", delay=60))),
        ValueError,
        "a run ends Done, Failed or Defer, not tuple",
    ),
    ("finish-held-tuple", lambda w: finish(("A", w.gen)), ValueError, "what the run holds"),
    ("finish-naive", finish_with(now=NAIVE), ValueError, "now must be"),
    ("defer-empty", lambda w: Defer(""), ValueError, "reason must be a non-empty string"),
    ("defer-nul", lambda w: Defer("a\x00", delay=1), ValueError, "reason contains a NUL"),
    ("defer-naive", lambda w: Defer("x", until=NAIVE), ValueError, "until must be an aware"),
    ("defer-negative", lambda w: Defer("x", delay=-1), ValueError, "delay must not be negative"),
    ("defer-delay-str", lambda w: Defer("x", delay="60"), ValueError, "delay must be seconds"),
    ("defer-both", lambda w: Defer("x", until=w.t0, delay=1), ValueError, "either until"),
    ("say-empty", lambda w: Say(1, ""), ValueError, "body must be a non-empty string"),
    ("say-bytes", lambda w: Say(1, b"hi"), ValueError, "body must be a non-empty string"),
    ("say-nul", lambda w: Say(1, "hi\x00"), ValueError, "body contains a NUL"),
    ("say-inbox-str", lambda w: Say("desk", "hi"), ValueError, "inbox_id must be an int"),
    # --- the operators' verbs -------------------------------------------------------------
    ("requeue-str", lambda w: requeue(str(w.dead_id)), ValueError, "event_ids must be"),
    ("requeue-none", lambda w: requeue(None), ValueError, "event_ids must be"),
    ("requeue-text", lambda w: requeue(["x"]), ValueError, "event_ids must be"),
    ("requeue-naive", lambda w: requeue([w.dead_id], now=NAIVE), ValueError, "now must be"),
    ("mark_dead-empty", lambda w: mark_dead([w.pending_id], ""), ValueError, "reason must be"),
    ("mark_dead-nul", lambda w: mark_dead([w.pending_id], "a\x00"), ValueError, "reason contains"),
    (
        "mark_dead-long",
        lambda w: mark_dead([w.pending_id], "r" * 256),
        ValueError,
        "reason is longer than 255",
    ),
    ("mark_dead-ids-str", lambda w: mark_dead("1", "why"), ValueError, "event_ids must be"),
    # --- timers ---------------------------------------------------------------------------
    ("timer-key-int", timer_with(key=5), ValueError, "key must be a non-empty string"),
    ("timer-key-long", timer_with(key="k" * 201), ValueError, "key is longer than 200"),
    ("timer-key-nul", timer_with(key="k\x00"), ValueError, "key contains a NUL"),
    ("timer-key-reserved", timer_with(key="expire:refund-1"), ValueError, "reserved"),
    ("timer-due-naive", timer_with(due=NAIVE), ValueError, "due must be an aware datetime"),
    ("timer-due-str", timer_with(due="tomorrow"), ValueError, "due must be an aware datetime"),
    ("timer-due-none", timer_with(due=None), ValueError, "due: a one-off or every timer needs"),
    ("timer-every-zero", timer_with(every=0), ValueError, "every must be a positive"),
    ("timer-every-float", timer_with(every=1.5), ValueError, "every must be a positive"),
    ("timer-cron-garbage", timer_with(cron="every day"), ValueError, "cron: expected 5 fields"),
    ("timer-cron-range", timer_with(cron="61 * * * *"), ValueError, "cron: invalid expression"),
    ("timer-cron-int", timer_with(cron=5), ValueError, "cron must be a string"),
    ("timer-cron-and-every", timer_with(cron="0 9 * * *", every=60), ValueError, "either every"),
    ("timer-zone", timer_with(timezone="Mars/Olympus"), ValueError, "timezone: unknown"),
    ("timer-zone-none", timer_with(timezone=None), ValueError, "timezone: unknown"),
    ("timer-policy", timer_with(policy="sometimes"), ValueError, "policy must be one of"),
    ("timer-catch-up-zero", timer_with(catch_up_max=0), ValueError, "catch_up_max must be"),
    ("timer-payload-list", timer_with(payload=[1]), ValueError, "payload must be a JSON object"),
    ("timer-payload-deep", timer_with(payload={"a": DEEP}), ValueError, "payload nests deeper"),
    ("timer-payload-nan", timer_with(payload={"a": math.nan}), ValueError, "payload is not JSON"),
    ("timer-event-key-str", timer_with(event_key="ab"), ValueError, "event_key must be a pair"),
    ("timer-event-key-1", timer_with(event_key=("chat",)), ValueError, "event_key must be a pair"),
    (
        "timer-event-key-reserved",
        timer_with(event_key=("approval", "refund-1")),
        ValueError,
        "reserved",
    ),
    (
        "timer-event-key-long",
        timer_with(event_key=("chat", "i" * 256)),
        ValueError,
        "event_key source_id is longer than 255",
    ),
    ("timer-inbox", timer_with(inbox="nobody"), UnknownInbox, "unknown inbox: 'nobody'"),
    (
        "schedule-delay-negative",
        lambda w: Schedule(w.inbox.pk, "k", delay=-5),
        ValueError,
        "delay must not be negative",
    ),
    (
        "schedule-inbox-str",
        lambda w: Schedule("desk", "k", delay=5),
        ValueError,
        "inbox_id must be an int",
    ),
    ("scheduler-naive", lambda w: run_scheduler(now=NAIVE), ValueError, "now must be"),
    # --- approvals ------------------------------------------------------------------------
    ("ask-id-empty", ask_with(request_id=""), ValueError, "request_id must be a non-empty"),
    ("ask-id-space", ask_with(request_id="refund 2"), ValueError, "request_id may use letters"),
    ("ask-id-long", ask_with(request_id="r" * 194), ValueError, "request_id is longer than 193"),
    ("ask-id-int", ask_with(request_id=2), ValueError, "request_id must be a non-empty string"),
    ("ask-action-empty", ask_with(action=""), ValueError, "action must be a non-empty string"),
    ("ask-action-nul", ask_with(action="refund\x00"), ValueError, "action contains a NUL"),
    ("ask-expires-str", ask_with(expires_in="3600"), ValueError, "expires_in must be seconds"),
    ("ask-expires-zero", ask_with(expires_in=0), ValueError, "expires_in must be a positive"),
    ("ask-expires-nan", ask_with(expires_in=math.nan), ValueError, "expires_in must be"),
    ("ask-approvers-3", ask_with(approvers=3), ValueError, "approvers must be 1 or 2"),
    ("ask-approvers-str", ask_with(approvers="2"), ValueError, "approvers must be 1 or 2"),
    ("ask-reused-id", ask_with(request_id="refund-1"), ValueError, "already used for"),
    ("ask-naive", ask_with(now=NAIVE), ValueError, "now must be"),
    ("answer-maybe", answer_with(answer="maybe"), ValueError, 'answer must be "yes" or "no"'),
    ("answer-upper", answer_with(answer="YES"), ValueError, 'answer must be "yes" or "no"'),
    ("answer-none", answer_with(answer=None), ValueError, 'answer must be "yes" or "no"'),
    ("answer-id-empty", answer_with(request_id=""), ValueError, "request_id must be a non-empty"),
    ("answer-id-nul", answer_with(request_id="r\x00"), ValueError, "request_id contains a NUL"),
    ("answer-via", answer_with(via="email"), ValueError, 'via must be "page"'),
    ("answer-by-name", answer_with(by="dana"), ValueError, "by must be a user"),
    ("answer-naive", answer_with(now=NAIVE), ValueError, "now must be"),
    (
        "answer-edit-plain",
        answer_with(arguments={"order": "1"}),
        ValueError,
        "no arguments a person",
    ),
    ("answer-reason-yes", answer_with(reason="because"), ValueError, 'a reason goes with a "no"'),
    (
        "answer-reason-long",
        answer_with(answer="no", reason="r" * 1001),
        ValueError,
        "reason is longer than 1000",
    ),
    ("answer-reply-yes", answer_with(reply="Monday"), ValueError, 'a value goes with "replied"'),
    (
        "answer-reply-permission",
        answer_with(answer="replied", reply="Monday"),
        ValueError,
        "asks for a yes or a no, not a value",
    ),
    (
        "group-replied",
        lambda w: answer_group(w.inbox, "refund-1", "replied", now=w.t0),
        ValueError,
        'answer must be "yes" or "no" for a group',
    ),
    (
        "group-shown-list",
        lambda w: answer_group(w.inbox, "refund-1", "yes", now=w.t0, arguments=[1]),
        ValueError,
        "arguments must be a JSON object",
    ),
    # --- the outbox -----------------------------------------------------------------------
    ("dispatch-send-str", lambda w: dispatch("print", now=w.t0), ValueError, "send must be"),
    (
        "dispatch_inbox-send-int",
        lambda w: dispatch_inbox(w.inbox, 5, now=w.t0),
        ValueError,
        "send must be",
    ),
    ("dispatch-naive", lambda w: dispatch(now=NAIVE), ValueError, "now must be"),
    ("notices-send-str", lambda w: dispatch_notices("x", now=w.t0), ValueError, "send must be"),
]


def cases(rows):
    return [pytest.param(call, exc, match, id=name) for name, call, exc, match in rows]


@pytest.mark.parametrize("call, exception, message", cases(CASES))
def test_bad_argument_is_refused_naming_it_and_nothing_changes(world, call, exception, message):
    before = snapshot()

    with pytest.raises(exception, match=message):
        call(world)

    assert snapshot() == before


def test_the_run_in_progress_still_finishes_after_the_refusals(world, t0):
    """The world's claim is intact: the refusals above left the lease and events usable."""
    for _name, call, exc, match in CASES:
        with pytest.raises(exc, match=match):
            call(world)
    assert finish(Held(world.inbox, "A", world.gen, world.ids), [Say(world.inbox.pk, "ok")], now=t0)
    assert OutboxMessage.objects.filter(body="ok").count() == 1


# --- the egress client ------------------------------------------------------------------------

SERVICES = check_services(
    {
        "billing": {
            "base_url": "http://127.0.0.1:9/api",
            "methods": ["GET", "POST"],
            "paths": ["/v1/"],
        }
    }
)

EGRESS_CASES = [
    ("service-none", lambda e: e.get(None, "/v1/x"), "service None is not allowed"),
    ("service-unknown", lambda e: e.get("payroll", "/v1/x"), "service 'payroll' is not allowed"),
    ("service-bytes", lambda e: e.get(b"billing", "/v1/x"), "is not allowed"),
    ("method", lambda e: e.request("billing", "DELETE", "/v1/x"), "method DELETE is not allowed"),
    ("path-empty", lambda e: e.get("billing", ""), "is not a clean absolute path"),
    ("path-dots", lambda e: e.get("billing", "/v1/../admin"), "is not a clean absolute path"),
    ("path-outside", lambda e: e.get("billing", "/v2/x"), "outside the allowed paths"),
    ("path-int", lambda e: e.get("billing", 5), "is not a clean absolute path"),
    (
        "header-auth",
        lambda e: e.get("billing", "/v1/x", headers={"Authorization": "x"}),
        "header Authorization may not be set",
    ),
]


@pytest.mark.parametrize("call, message", [pytest.param(c, m, id=n) for n, c, m in EGRESS_CASES])
def test_egress_refuses_a_bad_request_before_sending(world, call, message):
    egress = Egress(world.inbox, services=SERVICES, transport=None)
    with pytest.raises(EgressRefused, match=re.escape(message) if "(" in message else message):
        call(egress)


def test_answer_approval_by_an_outsider_is_refused_and_stores_nothing(world, t0):
    from approvals.services import MayNotAnswer

    stranger = get_user_model().objects.create_user("stranger")
    before = snapshot()
    with pytest.raises(MayNotAnswer, match="stranger may not answer approvals of desk"):
        answer_approval(world.inbox, "refund-1", "yes", now=t0, by=stranger)
    assert snapshot() == before


def test_a_generation_of_none_is_acquires_not_yours_and_is_fenced_off(world, t0):
    """acquire() returns None while another holds the lease; passed on, it is refused like
    any generation that does not hold it, not as a wrong type."""
    before = snapshot()
    assert acquire(world.inbox, "B", now=t0) is None
    assert claim_batch(world.inbox, "B", None, now=t0) == []
    assert finish(Held(world.inbox, "B", None, []), now=t0) is False
    assert renew(world.inbox, "B", None, now=t0) is False
    assert release(world.inbox, "B", None) is False
    assert snapshot() == before
