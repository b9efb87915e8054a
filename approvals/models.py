from django.db import models

from inbox.models import Event, Inbox

# The inbox event that carries an approval's outcome: ("approval", request_id). Whichever is
# stored there first, the user's answer or the expiry, is the answer that stands.
APPROVAL_SOURCE = "approval"


class Approval(models.Model):
    """A deferred tool call waiting for a person: the run ended, the answer resumes it."""

    class Answer(models.TextChoices):
        YES = "yes"
        NO = "no"
        EXPIRED = "expired"

    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="approvals")
    request_id = models.CharField(max_length=200)
    action = models.TextField()
    requested_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    answer = models.CharField(max_length=10, choices=Answer.choices, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["inbox", "request_id"], name="approval_unique_request"),
        ]

    def __str__(self):
        return f"{self.request_id}: {self.answer or 'pending'}"

    @property
    def expiry_timer_key(self):
        return expiry_timer_key(self.request_id)

    def has_expired(self, now) -> bool:
        return now >= self.expires_at


def expiry_timer_key(request_id):
    return f"expire:{request_id}"


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
