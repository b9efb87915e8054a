"""One inbox's conversation as its people read it: what they sent, what the agent said, and
the approvals it asked for, in order, in the person's words rather than the tables'."""

from dataclasses import dataclass, field
from datetime import datetime

from django.template.loader import get_template
from django.utils.safestring import mark_safe

from approvals.models import Approval
from inbox.models import Event, Inbox, Lease
from inbox.prebuilt import Given, Prebuilt
from outbox.models import OutboxMessage

SHOWN = 50  # of each kind, newest; the page is a conversation, the admin is the archive
ENTRY = "alwayson/_entry.html"
REGION = "alwayson/_conversation.html"
WORKING = "alwayson/_working.html"
# An entry rendered once for every page of a person carries no browser's CSRF token (the
# templates leave it out); live.js gives its forms the page's own.
NO_TOKEN = ""

# What a person's message is doing, by its event's status.
MESSAGE_STATE = {
    Event.Status.PENDING: "received",
    Event.Status.RUNNING: "being handled",
    Event.Status.DONE: "answered",
    Event.Status.DEAD: "could not be handled",
}
# What happened to something the agent said, by its outbox row's status.
SAID_STATE = {
    OutboxMessage.Status.HELD: "waiting to be sent",
    OutboxMessage.Status.SENT: "sent",
    OutboxMessage.Status.FAILED: "could not be sent",
}


@dataclass
class Entry:
    side: str  # "person", "agent" or "approval"
    at: datetime
    text: str
    state: str
    # An approval card's requests: one, or the calls a model asked in one turn.
    approvals: list[Approval] = field(default_factory=list)
    open: bool = False  # a request of the card a person may still answer
    author: str = ""  # who sent a person's message (a username), if the form said
    row: int = 0  # its row's id: the order it was written in, among rows of one kind
    # The lease generation of the run that said it, for its timeline (alwayson/web/runs.py);
    # None for what no run said, and for messages from before runs were recorded.
    generation: int | None = None
    # What its rendering depends on, besides who looks: a pushed page is sent the entries
    # whose fingerprint moved since it last heard (alwayson/web/feed.py).
    fingerprint: tuple = ()

    @property
    def key(self) -> str:
        """Its id on the page: one per row of its kind (a card: its first request's row)."""
        return f"entry-{self.side}-{self.row}"

    @property
    def order(self):
        # At one timestamp: what a person sent, then what the agent said, then its approval
        # requests, each in the order written. A run's messages and requests share its
        # finish's timestamp, and the card belongs under the message that announces it; a
        # reply and the message it answers can share one in tests.
        return (self.at, {"person": 0, "agent": 1, "approval": 2}[self.side], self.row)


# Read at every change of an inbox with open pages (alwayson/web/feed.py) and at every view of
# it: compiled once, not at each read (the ORM's compiling cost more than the statements).
# A message and an agent's reply load only the columns their entry shows.
_SAID = Prebuilt(
    lambda: (
        OutboxMessage.objects.filter(inbox_id=Given.of(OutboxMessage, "inbox_id"))
        .only("created", "body", "status", "generation")
        .order_by("-id")[:SHOWN]
    )
)
_SENT = Prebuilt(
    lambda: (
        Event.objects.filter(inbox_id=Given.of(Event, "inbox_id"), source="chat")
        .only("created", "payload", "status", "attempts")
        .order_by("-id")[:SHOWN]
    )
)
_ASKED = Prebuilt(
    lambda: (
        Approval.objects.filter(inbox_id=Given.of(Approval, "inbox_id"))
        .select_related("first_approved_by", "answered_by", "edited_by")
        .order_by("-id")[:SHOWN]
    )
)


def entries(inbox: Inbox, now) -> list[Entry]:
    said = [
        Entry(
            "agent",
            m.created,
            m.body,
            SAID_STATE[m.status],
            row=m.pk,
            generation=m.generation,
            fingerprint=(m.status, m.body, m.generation),
        )
        for m in _SAID.all(inbox_id=inbox.pk)
    ]
    sent = [
        Entry(
            "person",
            e.created,
            str(e.payload.get("text", "")),
            _message_state(e),
            author=str(e.payload.get("from", "")),
            row=e.pk,
            fingerprint=(e.status, e.attempts > 0),
        )
        for e in _SENT.all(inbox_id=inbox.pk)
    ]
    cards = {}
    for approval in reversed(_ASKED.all(inbox_id=inbox.pk)):
        approval.inbox = inbox
        cards.setdefault(approval.group or f"\x00{approval.pk}", []).append(approval)
    asked = [
        Entry(
            "approval",
            card[0].requested_at,
            card[0].action,
            card[0].outcome_words(now),
            approvals=card,
            open=any(not a.standing_answer(now) for a in card),
            row=card[0].pk,
            fingerprint=tuple(_approval_fingerprint(a, now) for a in card),
        )
        for card in cards.values()
    ]
    return sorted([*said, *sent, *asked], key=lambda entry: entry.order)


def _approval_fingerprint(approval: Approval, now) -> tuple:
    """Every column of the request (answers, edits, approvers come and go), the names of the
    people it shows, and what the time does to it: its outcome and the minutes left."""
    columns = tuple(getattr(approval, f.attname) for f in approval._meta.concrete_fields)
    people = tuple(
        getattr(getattr(approval, name), "pk", None)
        for name in ("first_approved_by", "answered_by", "edited_by")
    )
    return (*columns, *people, approval.outcome_words(now), approval.time_left(now))


def _message_state(event: Event) -> str:
    if event.status == Event.Status.PENDING and event.attempts:
        return "trying again"
    return MESSAGE_STATE[event.status]


def is_working(inbox: Inbox, now) -> bool:
    """A run of this inbox holds its lease right now."""
    return Lease.objects.filter(inbox=inbox, until__gt=now).exclude(holder="").exists()


def render_entry(entry: Entry, *, inbox: Inbox, now, user, answerer: bool, csrf_token) -> str:
    """One entry's <li> as `user` sees it: the page, its poll and its pushes all render here."""
    context = {
        "inbox": inbox,
        "entry": entry,
        "now": now,
        "user": user,
        "answerer": answerer,
        "csrf_token": csrf_token,
    }
    return mark_safe(get_template(ENTRY).render(context).strip())  # noqa: S308 (rendered)


def render_region(*, inbox: Inbox, items, working: bool, cursor: str, request=None) -> str:
    """The live region around rendered entries, as the page and a whole push send it."""
    context = {"inbox": inbox, "items": items, "working": working, "cursor": cursor}
    return get_template(REGION).render(context, request).strip()


def render_working(working: bool) -> str:
    """The line that says a run holds the inbox's lease (empty when none does)."""
    return get_template(WORKING).render({"working": working}).strip()
