"""Deferred approvals: request_approval, answer_approval and answer_group."""

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.db.models import OuterRef, Subquery

from inbox import clock, tracing
from inbox.extensions import Extension
from inbox.models import Event, Inbox
from inbox.prebuilt import Given, Prebuilt
from inbox.services import (
    WORK_CHANNEL,
    announce_stored,
    lock_timeout,
    locked_write,
    store_event,
    write_in_one,
)
from inbox.validation import (
    require_duration,
    require_int,
    require_key,
    require_mapping,
    require_text,
)
from timers.models import RESERVED_KEY_PREFIX
from timers.services import KEY_MAX as TIMER_KEY_MAX
from timers.services import Schedule

from .models import (
    APPROVAL_SOURCE,
    Approval,
    AuditEntry,
    display_name,
    expiry_timer_key,
    is_operator,
    may_answer,
)
from .signals import approval_requested

UNKNOWN = "unknown"
# What stands while a two-person request has its first approval only.
WAITING = "waiting"
# It names the approval's page in a URL, so it stays one path segment.
REQUEST_ID = re.compile(r"[\w.:-]+")
# The request id keys the Approval and, prefixed, its expiry timer: it fits both columns.
REQUEST_ID_MAX = min(
    Approval._meta.get_field("request_id").max_length, TIMER_KEY_MAX - len(RESERVED_KEY_PREFIX)
)
# A denial's reason travels to the model in its tool result: a sentence or a paragraph.
REASON_MAX = 1000
ANSWERS = (Approval.Answer.YES, Approval.Answer.NO, Approval.Answer.REPLIED)
VIAS = (AuditEntry.Via.PAGE, AuditEntry.Via.CONVERSATION, AuditEntry.Via.API)

# Checks an edit must pass beyond its schema, by the name the approval's details give
# ("edit_check"). The agent that asked registers its own (the Claude agent: its policy, from
# its app's ready()), its rules living in a layer above this one. A check takes the approval
# and the edited arguments and returns how many approvers the edited call needs (1 or 2),
# or raises ValueError with the reason the edit is refused.
edit_checks = Extension("the checks of a person's edit, by name")


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
    group: str = ""
    # The run that asked (its RunRecord), for the run's history.
    generation: int | None = None

    def __post_init__(self):
        require_int("inbox_id", self.inbox_id)
        _require_request_id("request_id", self.request_id)
        if self.group:
            _require_request_id("group", self.group)
        require_key("action", self.action)
        expires_in = require_duration("expires_in", self.expires_in)
        if expires_in < timedelta(seconds=1):
            raise ValueError(
                f"expires_in must be a positive number of seconds, not {self.expires_in!r}"
            )
        object.__setattr__(self, "expires_in", expires_in)
        # None (or nothing) is no details, as run.ask and request_approval always took it.
        object.__setattr__(self, "details", self.details or {})
        require_mapping("details", self.details)
        _check_details(self.details)
        if "schema" in self.details and "argument_order" not in self.details:
            # The form lists the arguments as the schema declares them, an order PostgreSQL's
            # jsonb does not keep: kept as a list, which it does.
            order = list(self.details["schema"].get("properties") or {})
            object.__setattr__(self, "details", {**self.details, "argument_order": order})
        if isinstance(self.approvers, bool) or self.approvers not in (1, 2):
            raise ValueError(
                f"approvers must be 1 or 2 (distinct people who say yes), not {self.approvers!r}"
            )
        if self.approvers == 2 and "question" in self.details:
            raise ValueError("approvers: a question is answered by one person, not two")

    def check_unanswered(self):
        """ValueError naming the request id when an answer to it is stored already: a request
        id names one request for good, and its answer stands. Run.ask calls it, so the agent's
        own line raises; the finish checks again in its transaction (__call__), since an
        answer may land in between."""
        answer = (
            Approval.objects.filter(inbox_id=self.inbox_id, request_id=self.request_id)
            .exclude(answer="")
            .values_list("answer", flat=True)
            .first()
        ) or self._answer_event()
        if answer:
            raise self._taken(answer)

    def _answer_event(self) -> str:
        """The answer stored under the request's event key, "" when none is. It can outlive
        the request's row (a retention that prunes rows first), and while it does a new
        request under that id could never store its own answer."""
        payload = (
            Event.objects.filter(
                inbox_id=self.inbox_id, source=APPROVAL_SOURCE, source_id=self.request_id
            )
            .values_list("payload", flat=True)
            .first()
        )
        return "" if payload is None else str(payload.get("answer", "answered"))

    def _taken(self, answer) -> ValueError:
        return ValueError(
            f"request_id {self.request_id!r} was answered already ({answer}), and a request"
            " id names one request for good: ask again under a new request_id (made from"
            " the event that asks, say)"
        )

    def __call__(self, now) -> Approval:
        expires_at = clock.whole_seconds(now + self.expires_in)
        approval, created = Approval.objects.get_or_create(
            inbox_id=self.inbox_id,
            request_id=self.request_id,
            defaults={
                "action": self.action,
                "details": self.details,
                "group": self.group,
                "requested_at": now,
                "expires_at": expires_at,
                "approvers_needed": self.approvers,
                "generation": self.generation,
            },
        )
        if not created:
            # Asked again while it waits: the same request (a deadline passed counts as an
            # answer, the expiry's, even before its timer fires).
            answered = approval.standing_answer(now)
            if answered:
                raise self._taken(answered)
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
        answered = self._answer_event()
        if answered:
            raise self._taken(answered)
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


def _require_request_id(name, value):
    require_key(name, value, REQUEST_ID_MAX)
    if not REQUEST_ID.fullmatch(value):
        raise ValueError(f"{name} may use letters, digits and . _ : - only, not {value!r}")


def _check_details(details):
    """What the page and the answer read of the details has the shape they expect."""
    if "schema" in details:
        schema = details["schema"]
        if not isinstance(schema, dict) or not isinstance(details.get("arguments"), dict):
            raise ValueError("details: a schema goes with the arguments it describes (objects)")
        # Imported here, not with the module: jsonschema is a tenth of every manage.py
        # command's start-up, and most never check a schema.
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise ValueError(f"details schema is not a JSON Schema: {exc.message}") from None
    if "edit_check" in details and details["edit_check"] not in edit_checks:
        raise ValueError(f"details edit_check {details['edit_check']!r} is not registered")
    if "question" in details:
        question = details["question"]
        ok = (
            isinstance(question, dict)
            and isinstance(question.get("choices"), list)
            and all(isinstance(c, str) and c for c in question["choices"])
            and isinstance(question.get("free_text"), bool)
            and (question["choices"] or question["free_text"])
            and isinstance(question.get("max_length"), int)
            and question["max_length"] >= 1
        )
        if not ok:
            raise ValueError(
                "details question must be {choices: [non-empty strings], free_text: bool,"
                " max_length: int >= 1}, with a choice or free text"
            )


def request_approval(inbox, request_id, action, expires_in, now=None, **options) -> Approval:
    """Ask a person (or, with approvers=2, two different people); the run ends here. The
    answer, or its expiry (a one-off timer writing "expired" under the same key), comes back
    as the inbox event ("approval", request_id): only one of them is ever stored. A request
    id names one request for good (run.ask says how). `options` are Ask's.
    """
    inbox = Inbox.objects.resolve(inbox)
    ask = Ask(inbox.pk, request_id, action, expires_in, **options)
    with transaction.atomic():
        return ask(clock.resolve(now))


class MayNotAnswer(PermissionDenied):
    """The user may see the request (or not even that) but not answer it: answering takes
    the approver role in the inbox. Nothing was stored."""


@dataclass(frozen=True)
class Response:
    """What a person says to one approval: the answer, and with it the arguments as they
    changed them (a "yes"), a reason (a "no"), or the value a question asks for ("replied").
    Its shape is checked when made; what depends on the approval, under the inbox's lock."""

    answer: str
    arguments: dict | None = None
    reason: str = ""
    reply: str | None = None

    def __post_init__(self):
        if self.answer not in ANSWERS:
            raise ValueError(
                f'answer must be "yes" or "no" (or "replied" for a question), not {self.answer!r}'
            )
        if self.arguments is not None:
            if self.answer != Approval.Answer.YES:
                raise ValueError('arguments: an edit goes with a "yes"')
            require_mapping("arguments", self.arguments)
        reason = require_text("reason", self.reason).strip()
        if reason and self.answer != Approval.Answer.NO:
            raise ValueError('reason: a reason goes with a "no"')
        if len(reason) > REASON_MAX:
            raise ValueError(f"reason is longer than {REASON_MAX} characters ({len(reason)})")
        object.__setattr__(self, "reason", reason)
        if (self.answer == Approval.Answer.REPLIED) != (self.reply is not None):
            raise ValueError('reply: a value goes with "replied", and "replied" takes one')
        if self.reply is not None:
            reply = require_text("reply", self.reply).strip()
            if not reply:
                raise ValueError("reply must not be blank")
            object.__setattr__(self, "reply", reply)

    def checked(self, approval) -> tuple["Response", int]:
        """This response as it applies to `approval`: an edit equal to what a "yes" approves
        now is no edit. With the approvers the call needs after it. ValueError for one the
        approval cannot take."""
        rid = approval.request_id
        question = approval.question
        if question is None and self.answer == Approval.Answer.REPLIED:
            raise ValueError(f"reply: {rid} asks for a yes or a no, not a value")
        if question is not None and self.answer == Approval.Answer.YES:
            raise ValueError(f'answer: {rid} asks a question; answer it with "replied" and a reply')
        if question is not None and self.reply is not None:
            _check_reply(question, self.reply)
        if self.arguments is None or self.arguments == approval.current_arguments:
            return Response(self.answer, None, self.reason, self.reply), approval.approvers_needed
        if not approval.editable:
            raise ValueError(f"arguments: {rid} has no arguments a person may edit")
        from jsonschema import Draft202012Validator  # see _check_details

        error = next(
            iter(Draft202012Validator(approval.details["schema"]).iter_errors(self.arguments)),
            None,
        )
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path)
            raise ValueError(f"arguments{'/' + where if where else ''}: {error.message}")
        approvers = 1
        check = approval.details.get("edit_check")
        if check:
            if check not in edit_checks:
                raise ValueError(f"arguments: edits of {rid} cannot be checked ({check!r})")
            approvers = edit_checks[check](approval, self.arguments)
        # An edit never lowers the bar the request was asked with.
        return self, max(approvers, approval.approvers_needed)


def _check_reply(question, reply):
    if len(reply) > question["max_length"]:
        raise ValueError(f"reply is longer than {question['max_length']} characters")
    if not question["free_text"] and reply not in question["choices"]:
        raise ValueError(f"reply must be one of {', '.join(question['choices'])}")


def answer_approval(
    inbox,
    request_id,
    answer,
    now=None,
    *,
    by=None,
    via=AuditEntry.Via.API,
    arguments=None,
    reason="",
    reply=None,
) -> "Answered":
    """Store a person's answer unless the deadline passed: what the answer did and what
    stands (Answered: "yes"/"no"/"replied", "expired", "unknown", or "waiting" for a second
    approver). `by` must be an approver or manager of the inbox, or an operator
    (MayNotAnswer otherwise). A request that needs two approvers resolves "yes" only when a
    second, different approver says yes to the same arguments before the deadline; one "no"
    denies it. A "yes" with `arguments` that differ from what it approves now is an edit,
    checked by the approval's schema and edit check; a "no" takes a `reason`, a question a
    `reply`. ValueError, nothing stored, for what the approval cannot take.

    Decided under the inbox's lock, taken before the approval row is read, so two approvers
    answering at once make one first approval and one second, never two firsts; and the
    deadline is checked here rather than trusting the expiry timer, which takes the same
    lock and the same event key. Every answer, counted or not, is an AuditEntry.
    """
    response = Response(answer, arguments, reason, reply)
    require_key("request_id", request_id)
    with _answering(inbox, request_id, by, via, now) as (inbox, now, approval):
        if approval is None:
            return Answered(None, UNKNOWN, None)
        return _answer(inbox, approval, response, by, via, now)


def answer_group(
    inbox,
    request_id,
    answer,
    now=None,
    *,
    by=None,
    via=AuditEntry.Via.API,
    reason="",
    arguments=None,
) -> dict[str, "Answered"]:
    """Answer every call still open in `request_id`'s group (the calls the model asked in
    one turn; the request alone if it has none) the same way, in one transaction: what each
    answer did, by request id, in the order asked ({} for a request never made). A "yes"
    approves each as it stands (or, for a call in `arguments`, a mapping of request ids,
    with the arguments the person was shown, as answer_approval's `arguments`) and leaves
    questions open, which need their own reply; a "no" denies all, with the one `reason`.
    Each answer is answer_approval's, event and audit entry included."""
    if answer not in (Approval.Answer.YES, Approval.Answer.NO):
        raise ValueError(f'answer must be "yes" or "no" for a group, not {answer!r}')
    response = Response(answer, reason=reason)
    shown = require_mapping("arguments", arguments) if arguments is not None else {}
    # What a yes approves of each call: what its person was shown. A no denies whatever.
    responses = {
        rid: Response(answer, arguments=value)
        for rid, value in (shown.items() if answer == Approval.Answer.YES else ())
    }
    require_key("request_id", request_id)
    with _answering(inbox, request_id, by, via, now) as (inbox, now, lead):
        if lead is None:
            return {}
        members = [lead]
        if lead.group:
            members = _LOCKED_GROUP.all(inbox_id=inbox.pk, group=lead.group)
        answered = {}
        for approval in members:
            settled = approval.answer or approval.stored_payload is not None
            if settled or (approval.question is not None and answer == Approval.Answer.YES):
                continue
            given = responses.get(approval.request_id, response)
            answered[approval.request_id] = _answer(inbox, approval, given, by, via, now)
        return answered


# answer.sql's function, called: a plain yes or no to one approval in one statement.
ANSWER_AT_ONCE = (
    "SELECT * FROM approvals_answer(%(user_id)s::bigint, %(operator)s::boolean,"
    " %(username)s::text, %(name)s::text, %(slug)s::text, %(request_id)s::text,"
    " %(answer)s::text, %(via)s::text, %(reasons)s::jsonb, %(now)s::timestamptz,"
    " %(lock_timeout)s::text, %(channel)s::text, %(trace)s::text)"
)


@dataclass(frozen=True)
class Answered:
    """What an answer did: the audit's result (None for a request never made), what stands,
    and the request's deadline (the page's words for a late answer)."""

    result: str | None
    stands: str
    expires_at: datetime | None


def answer_at_once(
    user, slug, request_id, answer, *, via=AuditEntry.Via.PAGE, reasons=None, now=None
) -> Answered | None:
    """A person's plain "yes" or "no" to request `request_id` of inbox `slug`, as its page
    posts it, in one statement on PostgreSQL (approvals/sql/answer.sql) where get_visible
    and answer_approval take four round trips. `reasons`: a "no"'s reason by the approval's
    id. None, nothing written, for every case the statement hands back to answer_approval's
    path (and on SQLite always). Approval.DoesNotExist for a request the person may not
    see; InboxBusy past the lock's bound."""
    if connection.vendor != "postgresql" or answer not in ("yes", "no"):
        return None
    if via not in VIAS:
        raise ValueError(f'via must be "page", "conversation" or "api", not {via!r}')
    # The function reads the group link of Django's own user model.
    if get_user_model().groups.through._meta.db_table != "auth_user_groups":
        return None
    wait = settings.ALWAYSON_INGEST_LOCK_WAIT
    params = {
        "user_id": user.pk,
        "operator": is_operator(user),
        "username": user.get_username(),
        "name": display_name(user),
        "slug": slug,
        "request_id": request_id,
        "answer": answer,
        "via": via,
        "reasons": json.dumps({str(pk): reason for pk, reason in (reasons or {}).items()}),
        "now": clock.in_statement(now),
        "lock_timeout": lock_timeout(wait),
        "channel": WORK_CHANNEL,
        "trace": tracing.traceparent(),
    }
    row = write_in_one(slug, ANSWER_AT_ONCE, params, wait)
    status = row["o_status"]
    if status == "unknown":
        raise Approval.DoesNotExist(f"no approval {request_id!r} of {slug!r} for {user}")
    if status != "done":
        return None
    if row["o_event"] is not None:
        payload = row["o_payload"]
        payload = json.loads(payload) if isinstance(payload, str) else payload
        announce_stored(
            row["o_inbox"], row["o_event"], APPROVAL_SOURCE, request_id, payload, row["o_at"]
        )
    return Answered(row["o_result"], row["o_stands"], row["o_expires"])


@contextmanager
def _answering(inbox, request_id, by, via, now):
    """The transaction an answer runs in, under the inbox's lock: the inbox, `now` (read
    once the lock is granted) and the request, locked, or None. A person is waiting on the
    answer, so the write is bounded like a delivery (InboxBusy past the wait)."""
    if by is not None and not isinstance(by, get_user_model()):
        raise ValueError(f"by must be a user (or None), not {by!r}")
    if via not in VIAS:
        raise ValueError(f'via must be "page", "conversation" or "api", not {via!r}')
    # Named by its id, the request is read in the lock's round trip; by its slug, after it.
    column, value = Inbox.objects.lookup(inbox)
    then = []
    if column == "id":
        then = [_LOCKED_REQUEST.statement(inbox_id=value, request_id=request_id)]
    wait = settings.ALWAYSON_INGEST_LOCK_WAIT
    with locked_write(inbox, wait, now, then) as (inbox_id, now, read):
        inbox = inbox if isinstance(inbox, Inbox) else Inbox.objects.get(pk=inbox_id)
        if by is not None and not may_answer(by, inbox):
            raise MayNotAnswer(f"{by.get_username()} may not answer approvals of {inbox.slug}")
        if read:
            approvals = _LOCKED_REQUEST.instances(read[0][:1])
            approval = approvals[0] if approvals else None
        else:
            approval = _LOCKED_REQUEST.get(inbox_id=inbox_id, request_id=request_id)
        yield inbox, now, approval


def _locked(inbox_id, **lookup):
    """The approval rows, locked as prune takes them (skip_locked), so an answer and a
    delete never cross; each with its answer event's payload if one is stored (read under
    the same lock). Not their first approver joined: the planner may walk the whole users'
    index for that join; the second approval, the one step that needs the user, reads it
    by key."""
    # At most one row (event_unique_source_key): unordered, so that no statistics can make
    # the planner walk inbox_event's primary key in Event's default order for it.
    answer_event = Event.objects.filter(
        inbox_id=OuterRef("inbox_id"), source=APPROVAL_SOURCE, source_id=OuterRef("request_id")
    ).order_by()
    return (
        Approval.objects.filter(inbox_id=inbox_id, **lookup)
        .annotate(stored_payload=Subquery(answer_event.values("payload")[:1]))
        .select_for_update(of=("self",))
    )


# _locked's reads built once: one request's (every answer), one group's calls (answer all).
_LOCKED_REQUEST = Prebuilt(
    lambda: _locked(Given.of(Approval, "inbox_id"), request_id=Given.of(Approval, "request_id"))
)
_LOCKED_GROUP = Prebuilt(
    lambda: _locked(Given.of(Approval, "inbox_id"), group=Given.of(Approval, "group")).order_by(
        "id"
    )
)


def _answer(inbox, approval, response, by, via, now) -> Answered:
    """One approval's answer, checked, decided and audited."""
    approval.inbox = inbox
    response, approvers = response.checked(approval)
    result, stands = _decide(approval, response, approvers, by, now)
    AuditEntry.record(
        approval,
        by,
        response.answer,
        via,
        result,
        now,
        edited=response.arguments,
        reason=response.reason,
        reply=response.reply,
    )
    return Answered(result, stands, approval.expires_at)


def _decide(approval, response, approvers, by, now) -> tuple[str, str]:
    """What an answer does, under the inbox's lock: (the audit's result, what stands).

    The row's answer is read first: it outlives the answer event (prune), so a request
    settled long ago refuses a late answer instead of storing a second one. Two approvers
    approve the same arguments: a "yes" that changes them starts the count again.
    """
    Result = AuditEntry.Result
    answer = response.answer
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
        _settle(approval, answer, by, (), now, reason=response.reason)
        return Result.DENIED, answer
    if answer == Approval.Answer.REPLIED:
        _settle(approval, answer, by, (), now, reply=response.reply)
        return Result.REPLIED, answer
    changed = []
    if response.arguments is not None:
        approval.edited_arguments, approval.edited_by = response.arguments, by
        changed = ["edited_arguments", "edited_by"]
    if approvers > approval.approvers_needed:
        approval.approvers_needed = approvers
        changed.append("approvers_needed")
    if not approval.needs_two:
        # The edit (all `changed` can be here: a bar raised to two approvers does not settle)
        # goes in the payload, and record_answer writes it with the answer, in one UPDATE.
        _settle(approval, answer, by, [by] if by else [], now)
        return Result.APPROVED, answer
    if by is None:
        raise ValueError("by: a request that needs two approvers takes the user who says yes")
    first = approval.first_approved_at is not None
    if first and approval.first_approved_by_id != by.pk and response.arguments is None:
        _settle(approval, answer, by, [approval.first_approved_by, by], now)
        return Result.APPROVED, answer
    if first and approval.first_approved_by_id == by.pk and response.arguments is None:
        return Result.NOT_COUNTED, WAITING
    approval.first_approved_by, approval.first_approved_at = by, now
    approval.save(update_fields=["first_approved_by", "first_approved_at", *changed])
    return Result.FIRST_APPROVAL, WAITING


def _settle(approval, answer, by, approved_by, now, *, reason="", reply=None):
    """Store the answer event (its payload is what the agent receives); record_answer copies
    the answer, who gave it, and a reason or reply onto the row, in this transaction."""
    people = [user for user in approved_by if user]
    payload = approval.outcome_payload(answer, by, people, reason=reason, reply=reply)
    store_event(approval.inbox_id, APPROVAL_SOURCE, approval.request_id, payload, now)
