"""Resetting an inbox's conversation: its session state cleared, under its lock, so that the
next run of its agent starts anew."""

from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings

from approvals.models import Approval
from inbox import clock
from inbox.exceptions import InboxBusy
from inbox.models import Session
from inbox.services import bounded_write, lock_inbox

# A reset leaves alone an inbox whose events are due this soon. On PostgreSQL a worker's take
# is one statement whose snapshot predates its lock of the lease row: were the events due,
# one that began before the reset committed could lock the row after it and run on the
# session as it was, and its finish would write the old transcript back. Due later than
# this, no take can pick the inbox before its snapshot includes the reset.
RESET_MARGIN = timedelta(seconds=5)


@dataclass
class ConversationResets:
    """What `reset_conversations` did, by inbox slug."""

    reset: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)  # nothing to reset
    busy: list[str] = field(default_factory=list)  # a run holds it, or events are due
    waiting: dict[str, list[str]] = field(default_factory=dict)  # slug -> open approvals


def reset_conversations(inboxes, now=None) -> ConversationResets:
    """Clear the session state of these inboxes' agents (the Claude agent's transcript, the
    calls it waits on, its counters): their next run starts a new conversation. `inboxes`: a
    queryset of Inbox.

    Each inbox under its lock, and only while no run can be working from the state: one
    whose lease a run holds, or whose events are due (see RESET_MARGIN), is left busy, as is
    one whose lock stays taken past ALWAYSON_INGEST_LOCK_WAIT. A run that held the lease and
    lost it is fenced off: its finish cannot write the old state back. An inbox with an
    approval still open is left waiting: its answer would reach an agent that no longer
    knows what it asked.
    """
    resets = ConversationResets()
    for inbox_id, slug in inboxes.order_by("pk").values_list("pk", "slug"):
        try:
            with bounded_write(inbox_id, settings.ALWAYSON_INGEST_LOCK_WAIT):
                outcome = _reset_one(inbox_id, now)
        except InboxBusy:
            outcome = "busy"
        if isinstance(outcome, list):
            resets.waiting[slug] = outcome
        else:
            getattr(resets, outcome).append(slug)
    return resets


def _reset_one(inbox_id, now):
    """One inbox's reset, inside its bounded write: "reset", "empty", "busy" or the request
    ids of its open approvals."""
    lease = lock_inbox(inbox_id)
    now = clock.resolve(now)
    if not lease.is_free(now) or (
        lease.work_at is not None and lease.work_at <= now + RESET_MARGIN
    ):
        return "busy"
    waiting = list(
        Approval.objects.filter(inbox_id=inbox_id, answer="")
        .order_by("requested_at")
        .values_list("request_id", flat=True)
    )
    if waiting:
        return waiting
    if not Session.objects.filter(inbox_id=inbox_id).exclude(state={}).exists():
        return "empty"
    Session.objects.filter(inbox_id=inbox_id).update(state={}, updated=now)
    return "reset"
