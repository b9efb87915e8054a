"""Deferred approvals: request_approval and answer_approval."""

import re
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction

from inbox import clock
from inbox.models import Event, Inbox
from inbox.services import bounded_write, store_event
from inbox.validation import require_duration, require_key, require_mapping
from timers.services import Schedule

from .models import APPROVAL_SOURCE, Approval, expiry_timer_key

UNKNOWN = "unknown"
# It names the approval's page in a URL, so it stays one path segment.
REQUEST_ID = re.compile(r"[\w.:-]+")


@dataclass(frozen=True)
class Ask:
    """A deferred approval as a run effect: the Approval row and its expiry timer commit
    with the run's finish. Checked when made, so a bad request fails the run, not the finish.
    """

    inbox_id: int
    request_id: str
    action: str
    expires_in: timedelta
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        require_key("request_id", self.request_id)
        if not REQUEST_ID.fullmatch(self.request_id):
            raise ValueError(
                f"request_id may use letters, digits and . _ : - only, not {self.request_id!r}"
            )
        require_key("action", self.action)
        expires_in = require_duration("expires_in", self.expires_in)
        if expires_in < timedelta(seconds=1):
            raise ValueError(
                f"expires_in must be a positive number of seconds, not {self.expires_in!r}"
            )
        object.__setattr__(self, "expires_in", expires_in)
        require_mapping("details", self.details)

    def __call__(self, now) -> Approval:
        expires_at = clock.whole_seconds(now + self.expires_in)
        approval, created = Approval.objects.get_or_create(
            inbox_id=self.inbox_id,
            request_id=self.request_id,
            defaults={
                "action": self.action,
                "details": self.details,
                "requested_at": now,
                "expires_at": expires_at,
            },
        )
        if not created:
            if approval.action != self.action:
                raise ValueError(
                    f"request_id {self.request_id!r} was already used for {approval.action!r}"
                )
            return approval
        Schedule.reserved(
            self.inbox_id,
            expiry_timer_key(self.request_id),
            due=expires_at,
            payload={
                "approval": self.request_id,
                "answer": Approval.Answer.EXPIRED,
                "action": self.action,
            },
            event_key=(APPROVAL_SOURCE, self.request_id),
        )(now)
        return approval


def request_approval(inbox, request_id, action, expires_in, now=None) -> Approval:
    """Ask a person; the run ends here. The answer, or its expiry, comes back as the inbox
    event ("approval", request_id), and only one of them is ever stored.

    The expiry is a one-off timer writing an "expired" answer under that same key, so a
    request nobody answers still resumes the session, as a denial. Asking again with the
    same request_id and action returns the existing request.
    """
    inbox = Inbox.objects.resolve(inbox)
    ask = Ask(inbox.pk, request_id, action, expires_in)
    with transaction.atomic():
        return ask(clock.resolve(now))


def answer_approval(inbox, request_id, answer, now=None) -> str:
    """Store a person's answer unless the deadline passed; return the outcome that stands:
    "yes"/"no", "expired", or "unknown" for a request never made.

    The deadline is checked here, in the same transaction, instead of trusting that the
    expiry timer already ran. Storing the event locks the inbox's lease row, as the
    scheduler does before firing the expiry, so the answer and the expiry are serialised;
    and the unique event key means the second of them finds the first stored. Every caller
    is told the outcome that stands.
    """
    if answer not in (Approval.Answer.YES, Approval.Answer.NO):
        raise ValueError(f'answer must be "yes" or "no", not {answer!r}')
    require_key("request_id", request_id)
    inbox = Inbox.objects.resolve(inbox)
    # A person is waiting on the answer: bounded like a delivery (InboxBusy past the wait).
    with bounded_write(inbox.pk, settings.ALWAYSON_INGEST_LOCK_WAIT):
        now = clock.resolve(now)
        approval = Approval.objects.filter(inbox=inbox, request_id=request_id).first()
        if approval is None:
            return UNKNOWN
        answer = Approval.Answer.EXPIRED if approval.has_expired(now) else answer
        store_event(
            inbox.pk,
            APPROVAL_SOURCE,
            request_id,
            {"approval": request_id, "answer": answer, "action": approval.action},
            now,
        )
        stored = Event.objects.get(inbox=inbox, source=APPROVAL_SOURCE, source_id=request_id)
        return stored.payload["answer"]
