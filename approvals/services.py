"""Deferred approvals: request_approval and answer_approval."""

from datetime import timedelta

from django.db import transaction

from inbox import clock
from inbox.models import Event, Inbox
from inbox.validation import require_key
from timers.services import add_timer

from .models import APPROVAL_SOURCE, Approval, expiry_timer_key

UNKNOWN = "unknown"


def request_approval(inbox, request_id, action, expires_in, now=None) -> Approval:
    """Ask a person; the run ends here. The answer, or its expiry, comes back as the inbox
    event ("approval", request_id), and only one of them is ever stored.

    The expiry is a one-off timer writing an "expired" answer under that same key, so a
    request nobody answers still resumes the session, as a denial.
    """
    require_key("request_id", request_id)
    require_key("action", action)
    seconds = expires_in.total_seconds() if isinstance(expires_in, timedelta) else expires_in
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise ValueError(f"expires_in must be a positive number of seconds, not {expires_in!r}")
    inbox = Inbox.objects.resolve(inbox)
    with transaction.atomic():
        now = clock.resolve(now)
        expires_at = clock.whole_seconds(now + timedelta(seconds=seconds))
        approval, created = Approval.objects.get_or_create(
            inbox=inbox,
            request_id=request_id,
            defaults={"action": action, "requested_at": now, "expires_at": expires_at},
        )
        if not created:
            if approval.action != action:
                raise ValueError(
                    f"request_id {request_id!r} was already used for {approval.action!r}"
                )
            return approval
        add_timer(
            inbox,
            expiry_timer_key(request_id),
            expires_at,
            {"approval": request_id, "answer": Approval.Answer.EXPIRED, "action": action},
            event_key=(APPROVAL_SOURCE, request_id),
        )
        return approval


def answer_approval(inbox, request_id, answer, now=None) -> str:
    """Store a person's answer unless the deadline passed; return the outcome that stands:
    "yes"/"no", "expired", or "unknown" for a request never made.

    The deadline is checked here, in the same transaction, instead of trusting that the
    expiry timer already ran. The unique event key settles a race with that timer: the
    first of the two inserts wins and the other finds it stored, so every caller is told
    the same outcome. The event is inserted before the Approval row is written, on both
    paths, so the two can never wait on each other's locks.
    """
    if answer not in (Approval.Answer.YES, Approval.Answer.NO):
        raise ValueError(f'answer must be "yes" or "no", not {answer!r}')
    require_key("request_id", request_id)
    inbox = Inbox.objects.resolve(inbox)
    with transaction.atomic():
        now = clock.resolve(now)
        approval = Approval.objects.filter(inbox=inbox, request_id=request_id).first()
        if approval is None:
            return UNKNOWN
        answer = Approval.Answer.EXPIRED if approval.has_expired(now) else answer
        Event.objects.store(
            inbox.pk,
            APPROVAL_SOURCE,
            request_id,
            {"approval": request_id, "answer": answer, "action": approval.action},
            now,
        )
        stored = Event.objects.get(inbox=inbox, source=APPROVAL_SOURCE, source_id=request_id)
        return stored.payload["answer"]
