from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.urls import reverse

from inbox.models import Event, Inbox
from timers.models import RESERVED_KEY_PREFIX

# The inbox event that carries an approval's outcome: ("approval", request_id). Whichever is
# stored there first, the user's answer or the expiry, is the answer that stands.
APPROVAL_SOURCE = "approval"


class ApprovalQuerySet(models.QuerySet):
    def visible_to(self, user):
        """An owner sees the approvals of their inboxes; staff with the permission see all."""
        if not user.is_authenticated:
            return self.none()
        if user.is_staff and user.has_perm("approvals.answer_any_approval"):
            return self
        return self.filter(inbox__owner=user)

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

    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="approvals")
    request_id = models.CharField(max_length=200)
    action = models.TextField()
    # What exactly is asked, shown on the approval page: {"tool", "arguments", "asked_by",
    # "context"} for a tool call; empty for a plain action.
    details = models.JSONField(default=dict, blank=True)
    requested_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    answer = models.CharField(max_length=10, choices=Answer.choices, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["inbox", "request_id"], name="approval_unique_request"),
        ]
        indexes = [
            # The approval page: one owner's waiting requests, soonest deadline first.
            models.Index(
                fields=["inbox", "expires_at"], condition=Q(answer=""), name="approval_waiting_idx"
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

    def standing_answer(self, now) -> str:
        """The answer that stands, in the words of Answer; "" while a person may still answer.

        A deadline that passed counts as expired even before the expiry timer has fired.
        """
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


def record_answer(sender, event: Event, now, **kwargs):
    """Copy the answer that stands onto the Approval row, in the transaction that stored it."""
    if event.source != APPROVAL_SOURCE or not isinstance(event.payload, dict):
        return
    answer = event.payload.get("answer")
    if answer not in Approval.Answer.values:
        return
    Approval.objects.filter(inbox_id=event.inbox_id, request_id=event.source_id, answer="").update(
        answer=answer, answered_at=now
    )


def approval_url(inbox_slug, request_id) -> str:
    """The absolute link to an approval's page, for the agent's message to its owner."""
    path = reverse("approvals:detail", args=[inbox_slug, request_id])
    return settings.ALWAYSON_SITE_URL.rstrip("/") + path
