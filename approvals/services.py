"""Deferred approvals: request_approval and answer_approval."""

import re
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import OuterRef, Subquery

from inbox import clock
from inbox.models import Event, Inbox
from inbox.services import bounded_write, lock_inbox, store_event
from inbox.validation import require_duration, require_int, require_key, require_mapping
from timers.models import RESERVED_KEY_PREFIX
from timers.services import KEY_MAX as TIMER_KEY_MAX
from timers.services import Schedule

from .models import APPROVAL_SOURCE, Approval, AuditEntry, expiry_timer_key, may_answer
from .signals import approval_requested

UNKNOWN = "unknown"
# What answer_approval returns while a two-person request has its first approval only.
WAITING = "waiting"
# It names the approval's page in a URL, so it stays one path segment.
REQUEST_ID = re.compile(r"[\w.:-]+")
# The request id keys the Approval and, prefixed, its expiry timer: it fits both columns.
REQUEST_ID_MAX = min(
    Approval._meta.get_field("request_id").max_length, TIMER_KEY_MAX - len(RESERVED_KEY_PREFIX)
)


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
    approvers: int = 1

    def __post_init__(self):
        require_int("inbox_id", self.inbox_id)
        require_key("request_id", self.request_id, REQUEST_ID_MAX)
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
        if isinstance(self.approvers, bool) or self.approvers not in (1, 2):
            raise ValueError(
                f"approvers must be 1 or 2 (distinct people who say yes), not {self.approvers!r}"
            )

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
                "approvers_needed": self.approvers,
            },
        )
        if not created:
            if approval.action != self.action:
                raise ValueError(
                    f"request_id {self.request_id!r} was already used for {approval.action!r}"
                )
            if approval.approvers_needed != self.approvers:
                raise ValueError(
                    f"request_id {self.request_id!r} was already asked of"
                    f" {approval.approvers_needed} approver(s), not {self.approvers}"
                )
            return approval
        Schedule.reserved(
            self.inbox_id,
            expiry_timer_key(self.request_id),
            due=expires_at,
            payload=approval.outcome_payload(Approval.Answer.EXPIRED),
            event_key=(APPROVAL_SOURCE, self.request_id),
        )(now)
        # In this transaction: whatever tells the approvers commits with the request.
        approval_requested.send(sender=Approval, approval=approval, now=now)
        return approval


def request_approval(inbox, request_id, action, expires_in, now=None, *, approvers=1) -> Approval:
    """Ask a person (or, with approvers=2, two different people); the run ends here. The
    answer, or its expiry, comes back as the inbox event ("approval", request_id), and only
    one of them is ever stored.

    The expiry is a one-off timer writing an "expired" answer under that same key, so a
    request nobody answers still resumes the session, as a denial. Asking again with the
    same request_id, action and approvers returns the existing request.
    """
    inbox = Inbox.objects.resolve(inbox)
    ask = Ask(inbox.pk, request_id, action, expires_in, approvers=approvers)
    with transaction.atomic():
        return ask(clock.resolve(now))


class MayNotAnswer(PermissionDenied):
    """The user may see the request (or not even that) but not answer it: answering takes
    the approver role in the inbox. Nothing was stored."""


def answer_approval(inbox, request_id, answer, now=None, *, by=None, via=AuditEntry.Via.API) -> str:
    """Store a person's answer; the outcome that stands (see decide_answer)."""
    return decide_answer(inbox, request_id, answer, now, by=by, via=via)[1]


def decide_answer(
    inbox, request_id, answer, now=None, *, by=None, via=AuditEntry.Via.API
) -> tuple[str | None, str]:
    """answer_approval's work, returning also what the answer did, the audit's result (None
    for a request never made), for the page that tells the person.

    Store a person's answer unless the deadline passed; return the outcome that stands:
    "yes"/"no", "expired", "unknown" for a request never made, or "waiting" while a request
    that needs two approvers has its first "yes" only.

    `by` is the user who answers (an approver or manager of the inbox, or an operator;
    MayNotAnswer otherwise); `via` says from where, for the audit. A request that needs two
    approvers resolves "yes" only when a second, different approver says yes before the
    deadline; one "no" denies it.

    Everything is decided under the inbox's lock, taken before the approval row is read: a
    first approval another approver committed a moment ago is seen, so two approvers
    answering at once make one first approval and one second, never two firsts. The deadline
    is checked here, in the same transaction, instead of trusting that the expiry timer
    already ran; the scheduler takes the same lock before it fires the expiry, and the
    unique event key means the second of them finds the first stored. Every answer, counted
    or not, is an AuditEntry.
    """
    if answer not in (Approval.Answer.YES, Approval.Answer.NO):
        raise ValueError(f'answer must be "yes" or "no", not {answer!r}')
    require_key("request_id", request_id)
    if by is not None and not isinstance(by, get_user_model()):
        raise ValueError(f"by must be a user (or None), not {by!r}")
    if via not in (AuditEntry.Via.PAGE, AuditEntry.Via.CONVERSATION, AuditEntry.Via.API):
        raise ValueError(f'via must be "page", "conversation" or "api", not {via!r}')
    # A person is waiting on the answer: bounded like a delivery (InboxBusy past the wait).
    # The inbox and the role are read inside, where every statement is planned by index.
    with bounded_write(Inbox.objects.lookup(inbox)[1], settings.ALWAYSON_INGEST_LOCK_WAIT):
        inbox = Inbox.objects.resolve(inbox)
        if by is not None and not may_answer(by, inbox):
            raise MayNotAnswer(f"{by.get_username()} may not answer approvals of {inbox.slug}")
        lock_inbox(inbox.pk)
        now = clock.resolve(now)
        # The row too, as prune takes it (skip_locked): an answer and a delete never cross.
        # Its answer event, if one is stored, comes with it (read under the same lock); not
        # its first approver joined: the planner may walk the whole users' index for that
        # join; the second approval, the one step that needs the user, reads it by key.
        answer_event = Event.objects.filter(
            inbox_id=OuterRef("inbox_id"), source=APPROVAL_SOURCE, source_id=OuterRef("request_id")
        )
        approval = (
            Approval.objects.filter(inbox=inbox, request_id=request_id)
            .annotate(stored_payload=Subquery(answer_event.values("payload")[:1]))
            .select_for_update(of=("self",))
            .first()
        )
        if approval is None:
            return None, UNKNOWN
        result, stands = _decide(approval, answer, by, now)
        AuditEntry.record(approval, by, answer, via, result, now)
        return result, stands


def _decide(approval, answer, by, now) -> tuple[str, str]:
    """What an answer does, under the inbox's lock: (the audit's result, what stands).

    The row's answer is read first: it is set in the transaction that stores the answer
    event and outlives it (prune deletes the event and the fired expiry timer after
    ALWAYSON_RETAIN_EVENT_KEYS, the row only after ALWAYSON_RETAIN_AUDIT, if ever), so a
    request settled long ago refuses a late answer instead of storing a second one.
    """
    Result = AuditEntry.Result
    if approval.answer:
        return Result.ALREADY_SETTLED, approval.answer
    # The answer event stored (answer_approval reads it with the row): one the row does not
    # know, as after a request id is asked again once its first request was pruned.
    stored = approval.stored_payload
    if stored is not None:
        return Result.ALREADY_SETTLED, stored["answer"]
    if approval.has_expired(now):
        _settle(approval, Approval.Answer.EXPIRED, None, (), now)
        return Result.TOO_LATE, Approval.Answer.EXPIRED
    if answer == Approval.Answer.NO:
        _settle(approval, answer, by, (), now)
        return Result.DENIED, answer
    if not approval.needs_two:
        _settle(approval, answer, by, [by] if by else [], now)
        return Result.APPROVED, answer
    if by is None:
        raise ValueError("by: a request that needs two approvers takes the user who says yes")
    if approval.first_approved_at is None:
        approval.first_approved_by, approval.first_approved_at = by, now
        approval.save(update_fields=["first_approved_by", "first_approved_at"])
        return Result.FIRST_APPROVAL, WAITING
    if approval.first_approved_by_id == by.pk:
        return Result.NOT_COUNTED, WAITING
    _settle(approval, answer, by, [approval.first_approved_by, by], now)
    return Result.APPROVED, answer


def _settle(approval, answer, by, approved_by, now):
    """Store the answer event (its payload is what the agent receives); record_answer copies
    the answer and who gave it onto the row, in this transaction."""
    payload = approval.outcome_payload(answer, by, [user for user in approved_by if user])
    store_event(approval.inbox_id, APPROVAL_SOURCE, approval.request_id, payload, now)
