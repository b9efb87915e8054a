from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import models
from django.db.models import F, Q, Subquery
from django.db.models.functions import Coalesce
from django.db.models.sql import InsertQuery, UpdateQuery
from django.urls import reverse
from django.utils.text import capfirst

from inbox.models import Event, Inbox, Role, granted_role, is_person
from inbox.prebuilt import Given, Prebuilt
from inbox.validation import UNSTORABLE
from timers.models import RESERVED_KEY_PREFIX

# The inbox event that carries an approval's outcome: ("approval", request_id). Whichever is
# stored there first, the user's answer or the expiry, is the answer that stands.
APPROVAL_SOURCE = "approval"


def is_operator(user) -> bool:
    """Staff with the permission to see and answer every inbox's approvals."""
    return is_person(user) and user.is_staff and user.has_perm("approvals.answer_any_approval")


def may_answer(user, inbox) -> bool:
    """Approvers and managers of the inbox answer its approvals; so do operators."""
    return is_operator(user) or inbox.has_role(user, Role.APPROVER)


def _visible():
    """get_visible's statement: the request by its inbox's slug and its id, with its inbox
    and the role a membership gives the user there. The inbox is named by a scalar subquery
    (one probe of its slug), the request by its unique key, the inbox joined by its key."""
    anyone = get_user_model()(pk=Given("user_id", get_user_model()._meta.pk))
    inbox_id = Inbox.objects.filter(slug=Given("slug", models.CharField())).values("pk")[:1]
    return (
        Approval.objects.filter(
            inbox_id=Subquery(inbox_id), request_id=Given("request_id", models.CharField())
        )
        .select_related("inbox")
        .annotate(role_granted=granted_role(anyone, "inbox_id"))
        .order_by()
    )


# Built once: every answer and every approval's page starts with it.
_VISIBLE = Prebuilt(_visible)


def display_name(user) -> str:
    """How a person is named on pages and in the audit: their full name, else what they log
    in by."""
    return _name(user, "get_full_name") if user is not None else ""


def short_name(user) -> str:
    """How an email to a person greets them."""
    return _name(user, "get_short_name")


def _name(user, method) -> str:
    # Optional on a custom user model (AbstractBaseUser has neither); get_username never is.
    named = getattr(user, method, None)
    return (named() if callable(named) else "") or user.get_username()


def and_join(names) -> str:
    """ "Dana", "Dana and Lee", "Dana, Lee and Sam"."""
    names = list(names)
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


class ApprovalQuerySet(models.QuerySet):
    def visible_to(self, user):
        """The approvals of the inboxes where `user` has a role; operators see all."""
        if is_operator(user):
            return self
        return self.filter(inbox__in=Inbox.objects.with_role(user, Role.VIEWER))

    def get_visible(self, user, slug, request_id) -> "Approval":
        """The approval `request_id` of inbox `slug` if `user` may see it (visible_to's rule),
        read in one statement with its inbox and the user's role in it (granted_role, as
        Inbox.objects.get_with_role reads it), so may_answer asks nothing more.
        Approval.DoesNotExist for one they may not see and one that does not exist alike."""
        approval = None
        given = (slug, request_id)
        if is_person(user) and all(isinstance(v, str) and not UNSTORABLE.search(v) for v in given):
            approval = _VISIBLE.get(user_id=user.pk, slug=slug, request_id=request_id)
        if approval is not None:
            approval.inbox.remember_role(user, approval.role_granted)
        # Operators see every inbox's approvals, a role or none.
        if approval is None or (approval.inbox.role_of(user) is None and not is_operator(user)):
            raise Approval.DoesNotExist(f"no approval {request_id!r} of {slug!r} for {user}")
        return approval

    def waiting(self, now):
        return self.filter(answer="", expires_at__gt=now)

    def settled(self, now):
        return self.filter(Q(answer__gt="") | Q(expires_at__lte=now))


class Approval(models.Model):
    """A deferred tool call waiting for a person: the run ended, the answer resumes it."""

    class Answer(models.TextChoices):
        YES = "yes"
        NO = "no"
        EXPIRED = "expired"
        REPLIED = "replied"  # a question's answer: a value, in `reply`

    # No index of its own: approval_unique_request starts with inbox_id and serves every
    # lookup by inbox. A second one would cost every answer (its UPDATE writes a new entry in
    # each of the table's indexes).
    inbox = models.ForeignKey(
        Inbox, on_delete=models.CASCADE, related_name="approvals", db_index=False
    )
    request_id = models.CharField(max_length=200)
    action = models.TextField()
    # What exactly is asked, shown on the approval page: {"tool", "arguments", "asked_by",
    # "context"} for a tool call; empty for a plain action. With "schema" (the arguments'
    # JSON Schema) a person may edit the arguments before approving ("edit_check" names who
    # checks an edit beyond it: services.edit_checks; "argument_order", added, the schema's
    # order of its properties); with "question" ({"choices", "free_text", "max_length"}) the
    # call asks for a value instead of a yes.
    details = models.JSONField(default=dict, blank=True)
    # The calls a model asked in one turn share a group (the first one's request id) and are
    # answered on one card; "" for a request on its own.
    group = models.CharField(max_length=200, blank=True, default="")
    requested_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    answer = models.CharField(max_length=10, choices=Answer.choices, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    # Two distinct people for the big ones: the first "yes" is recorded here and the request
    # stays open until a second, different approver says yes.
    approvers_needed = models.PositiveSmallIntegerField(default=1)
    # The three people's keys are indexed only where set (Meta.indexes: approval_people).
    first_approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    first_approved_at = models.DateTimeField(null=True, blank=True)
    # Who settled it; nobody for an expiry (or an answer through the API without a user).
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    # The arguments as a person changed them before approving (details["arguments"] keeps
    # them as asked), and who; null while nobody has. With two approvers the first one's
    # edit is what the second approves.
    edited_arguments = models.JSONField(null=True, blank=True)
    edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    # Copied from the answer event (record_answer): a denial's reason, a question's reply.
    reason = models.TextField(blank=True, default="")
    reply = models.TextField(blank=True, default="")
    # The lease generation of the run that asked (its RunRecord); null when no run did.
    generation = models.PositiveBigIntegerField(null=True, blank=True)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["inbox", "request_id"], name="approval_unique_request"),
            models.CheckConstraint(
                condition=Q(approvers_needed__in=[1, 2]), name="approval_one_or_two_approvers"
            ),
        ]
        # Each answer's UPDATE changes `answer` (this partial index's predicate) and
        # answered_by, so it is never a heap-only (HOT) update: it writes an entry in every
        # index whose predicate its new row meets. So none beyond what these readers need.
        indexes = [
            # The requests not answered: the approvals list and page (waiting(), soonest
            # deadline first), an inbox's reset (alwayson/runtime/models.py), retention's
            # unfinished runs (alwayson/ops/retention.py), the /metrics gauge.
            models.Index(
                fields=["inbox", "expires_at"], condition=Q(answer=""), name="approval_waiting_idx"
            ),
            # One model turn's calls, answered together (answer all).
            models.Index(
                fields=["inbox", "group"],
                condition=~Q(group=""),
                name="approval_group_idx",
            ),
            # A person's deletion: on_delete=SET_NULL's UPDATE and the foreign keys' own
            # check find their rows here. Only where set (NULL cannot match a user), so
            # an answer writes no entry for the edit or first approval it does not have,
            # and a request none for any of the three.
            *(
                models.Index(
                    fields=[person],
                    condition=Q(**{f"{person}__isnull": False}),
                    name=f"approval_{person}_idx",
                )
                for person in ("answered_by", "edited_by", "first_approved_by")
            ),
        ]
        permissions = [("answer_any_approval", "Can see and answer any inbox's approvals")]

    def __str__(self):
        return f"{self.request_id}: {self.answer or 'pending'}"

    def get_absolute_url(self):
        return reverse("approvals:detail", args=[self.inbox.slug, self.request_id])

    @property
    def expiry_timer_key(self):
        return expiry_timer_key(self.request_id)

    def has_expired(self, now) -> bool:
        return now >= self.expires_at

    @property
    def shown_action(self) -> str:
        """The action as every page shows it, and as the audit records it was shown."""
        return capfirst(self.action)

    @property
    def needs_two(self) -> bool:
        return self.approvers_needed == 2

    @property
    def arguments(self) -> dict | None:
        """The tool call's arguments as asked; None for a plain action."""
        arguments = self.details.get("arguments")
        return arguments if isinstance(arguments, dict) else None

    @property
    def argument_names(self) -> list[str]:
        """The arguments' names in the schema's order (then any others), whatever order the
        database kept the JSON's keys in."""
        order = self.details.get("argument_order")
        names = [name for name in order if isinstance(name, str)] if isinstance(order, list) else []
        given = [*(self.arguments or {}), *(self.edited_arguments or {})]
        return [*names, *(name for name in dict.fromkeys(given) if name not in names)]

    @property
    def current_arguments(self) -> dict | None:
        """What a yes approves now: a person's edit, or the arguments as asked."""
        return self.edited_arguments if self.edited_arguments is not None else self.arguments

    @property
    def question(self) -> dict | None:
        """{"choices", "free_text", "max_length"} when the call asks for a value."""
        question = self.details.get("question")
        return question if isinstance(question, dict) else None

    @property
    def editable(self) -> bool:
        """A person may change the arguments before approving: the details carry their
        schema, and the call asks for a yes, not a value."""
        schema = self.details.get("schema")
        return isinstance(schema, dict) and self.arguments is not None and not self.question

    def waits_for_second(self, now) -> bool:
        """A first approval is recorded and the request is still open."""
        return self.first_approved_at is not None and not self.standing_answer(now)

    def outcome_payload(
        self, answer, answered_by=None, approved_by=(), *, reason="", reply=None
    ) -> dict:
        """The answer event's payload, what the agent receives: who answered (a username,
        None for an expiry), who approved (usernames, in order) and their names; and, only
        when there is one, a denial's "reason", a question's "reply", and the "edit" a "yes"
        approved: {"arguments": as edited, "by": the editor's username}."""
        edit = None
        edited = self.edited_arguments
        if answer == self.Answer.YES and edited is not None and edited != self.arguments:
            edit = {"arguments": edited, "by": _username(self.edited_by)}
        editor = [self.edited_by] if edit else []
        people = [user for user in (answered_by, *approved_by, *editor) if user is not None]
        payload = {
            "approval": self.request_id,
            "answer": answer,
            "action": self.action,
            "approvers_needed": self.approvers_needed,
            "answered_by": _username(answered_by),
            "approved_by": [user.get_username() for user in approved_by],
            "names": {user.get_username(): display_name(user) for user in people},
        }
        if reason:
            payload["reason"] = reason
        if reply is not None:
            payload["reply"] = reply
        if edit:
            payload["edit"] = edit
        return payload

    def standing_answer(self, now) -> str:
        """The answer that stands, in the words of Answer; "" while a person may still answer.
        A deadline that passed counts as expired even before the expiry timer has fired."""
        if self.answer:
            return self.answer
        return self.Answer.EXPIRED if self.has_expired(now) else ""

    def time_left(self, now) -> str:
        return time_left(self.expires_at, now)

    def outcome_words(self, now) -> str:
        answer = self.standing_answer(now)
        if answer == self.Answer.YES:
            return "Approved."
        if answer == self.Answer.NO:
            return "Denied."
        if answer == self.Answer.REPLIED:
            return "Answered."
        if answer == self.Answer.EXPIRED:
            return f"This request expired at {self.expires_at:%H:%M} UTC; nothing was done."
        return ""


def time_left(until, now) -> str:
    """Time left in a person's words: "less than a minute", "12 min", "3 h 12 min"."""
    left = until - now
    if left <= timedelta(0):
        return "no time"
    minutes = int(left.total_seconds() // 60)
    if minutes < 1:
        return "less than a minute"
    hours, minutes = divmod(minutes, 60)
    if hours < 1:
        return f"{minutes} min"
    days, hours = divmod(hours, 24)
    if days < 1:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    day_word = "day" if days == 1 else "days"
    return f"{days} {day_word} {hours} h" if hours else f"{days} {day_word}"


def expiry_timer_key(request_id):
    return f"{RESERVED_KEY_PREFIX}{request_id}"


def _username(user):
    return user.get_username() if user is not None else None


# Every answer an event may carry, read once: a choices enum builds its values anew on each
# read, and every stored answer is checked against them (record_answer, the metrics' count).
ANSWERS = frozenset(Approval.Answer.values)


def record_answer(sender, event: Event, now, **kwargs):
    """Copy the answer that stands onto the Approval row, in the transaction that stored it;
    an expiry goes into the audit here too, as nobody's answer."""
    if event.source != APPROVAL_SOURCE or not isinstance(event.payload, dict):
        return
    if kwargs.get("recorded"):
        # Stored by answer.sql, which settled the row and audited the answer in its statement.
        return
    answer = event.payload.get("answer")
    if answer not in ANSWERS:
        return
    if answer != Approval.Answer.EXPIRED:
        # A person's answer, who gave it (the payload names them), a denial's reason, a
        # question's reply and the edit a yes approved, in one UPDATE: the row's one new
        # version, one entry in each of its indexes; its audit entry is the answerer's
        # (answer_approval).
        edit = event.payload.get("edit")
        edit = edit if isinstance(edit, dict) else {}
        _SETTLE.write(
            inbox_id=event.inbox_id,
            request_id=event.source_id,
            answer=answer,
            answered_at=now,
            reason=str(event.payload.get("reason") or ""),
            reply=str(event.payload.get("reply") or ""),
            username=event.payload.get("answered_by"),
            edited_arguments=edit.get("arguments"),
            editor=edit.get("by"),
        )
        return
    unsettled = Approval.objects.filter(
        inbox_id=event.inbox_id, request_id=event.source_id, answer=""
    )
    approval = unsettled.first()
    if approval is None:
        return
    approval.answer, approval.answered_at = answer, now
    approval.save(update_fields=["answer", "answered_at"])
    AuditEntry.record(
        approval, None, answer, AuditEntry.Via.DEADLINE, AuditEntry.Result.EXPIRED, now
    )


def _settle():
    """record_answer's UPDATE of a person's answer, built once: every answer makes it. Who
    answered is found by their username (nobody for none), as the payload names them; so is
    who edited, whose edit (the arguments as changed, with the editor) is written only when
    the payload carries one (NULL keeps what the row has)."""
    users = get_user_model()
    username_field = users._meta.get_field(users.USERNAME_FIELD)

    def named(given):
        found = users.objects.filter(**{users.USERNAME_FIELD: Given(given, username_field)})
        return Subquery(found.values("pk")[:1])

    unsettled = Approval.objects.filter(
        inbox_id=Given("inbox_id", Approval._meta.get_field("inbox")),
        request_id=Given("request_id", Approval._meta.get_field("request_id")),
        answer="",
    )
    query = unsettled.query.chain(UpdateQuery)
    settled = {name: Given(name, Approval._meta.get_field(name)) for name in _SETTLED}
    edited = Approval._meta.get_field("edited_arguments")
    query.add_update_values(
        {
            **settled,
            "answered_by": named("username"),
            "edited_arguments": Coalesce(Given("edited_arguments", edited), F("edited_arguments")),
            "edited_by": Coalesce(named("editor"), F("edited_by")),
        }
    )
    return query


_SETTLED = ("answer", "answered_at", "reason", "reply")
_SETTLE = Prebuilt(_settle)


class AuditEntry(models.Model):
    """One answer to an approval, or its expiry: who, when, from which page, the action as
    it was shown to them, and what the answer did. Written in the transaction that decided
    it, never changed; the admin lists and exports it."""

    class Via(models.TextChoices):
        PAGE = "page", "approval page"
        CONVERSATION = "conversation", "conversation card"
        API = "api", "API"
        DEADLINE = "deadline", "deadline"

    class Result(models.TextChoices):
        APPROVED = "approved", "approved"
        DENIED = "denied", "denied"
        FIRST_APPROVAL = "first_approval", "first approval, waiting for a second"
        NOT_COUNTED = "not_counted", "not counted: the same approver again"
        TOO_LATE = "too_late", "too late: the request had expired"
        ALREADY_SETTLED = "already_settled", "not counted: already settled"
        EXPIRED = "expired", "expired: nobody answered in time"
        REPLIED = "replied", "replied to a question"

    # Indexed (its own index): an approval's entries, for its admin page and for retention,
    # which deletes approvals with their entries (CASCADE, and the key's own check).
    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="audit")
    # The approval's inbox, kept here for the admin's filters and the export. No index of its
    # own: audit_inbox_at_idx starts with inbox_id (a second would cost every answer).
    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="+", db_index=False)
    # Indexed where set (audit_user_idx): nobody's entries (an expiry's) need no entry.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    # As it was when they answered, and kept if the account is deleted; "" for nobody.
    username = models.CharField(max_length=150, blank=True)
    answer = models.CharField(max_length=10, choices=Approval.Answer.choices)
    via = models.CharField(max_length=15, choices=Via.choices)
    result = models.CharField(max_length=20, choices=Result.choices)
    action_shown = models.TextField()
    # What else the person said: the arguments as they changed them (null: no change; the
    # approval's details keep them as asked), a denial's reason, a question's reply.
    edited_arguments = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    reply = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        verbose_name = "approval audit entry"
        verbose_name_plural = "approval audit"
        # Every answer writes one entry in each: the primary key, approval_id's, these.
        indexes = [
            # The admin's list and export: one inbox's answers by time (filters, dates); an
            # inbox's deletion (CASCADE and the key's check).
            models.Index(fields=["inbox", "at"], name="audit_inbox_at_idx"),
            # Retention (at before the cutoff, alwayson/ops/retention.py) and the admin's
            # dates across inboxes.
            models.Index(fields=["at"], name="audit_at_idx"),
            # A person's deletion (SET_NULL and the key's check), as approval_answered_by_idx.
            models.Index(fields=["user"], condition=Q(user__isnull=False), name="audit_user_idx"),
        ]

    def __str__(self):
        return f"{self.username or 'nobody'}: {self.answer} on {self.approval_id} ({self.result})"

    @classmethod
    def record(
        cls, approval, user, answer, via, result, now, *, edited=None, reason="", reply=None
    ) -> None:
        """Write one entry (an INSERT built once: every answer writes one)."""
        _AUDIT.write(
            approval_id=approval.pk,
            inbox_id=approval.inbox_id,
            user_id=user.pk if user is not None else None,
            username=user.get_username() if user is not None else "",
            answer=answer,
            via=via,
            result=result,
            action_shown=approval.shown_action,
            edited_arguments=edited,
            reason=reason,
            reply=reply or "",
            at=now,
        )

    @property
    def asked_arguments(self):
        """The arguments as the agent asked them, beside the edit (the approval keeps them)."""
        return self.approval.arguments


def _audit():
    """AuditEntry.record's INSERT: every column but the id, each a Given by its attname."""
    fields = [field for field in AuditEntry._meta.concrete_fields if not field.primary_key]
    query = InsertQuery(AuditEntry)
    query.insert_values(fields, [AuditEntry(**{f.attname: Given(f.attname, f) for f in fields})])
    return query


_AUDIT = Prebuilt(_audit)


def approval_url(inbox_slug, request_id) -> str:
    """The absolute link to an approval's page, for the agent's message to its owner."""
    path = reverse("approvals:detail", args=[inbox_slug, request_id])
    return settings.ALWAYSON_SITE_URL.rstrip("/") + path
