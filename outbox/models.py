from django.db import models
from django.db.models import Max, Q

from inbox.models import Inbox


class OutboxQuerySet(models.QuerySet):
    def held(self):
        return self.filter(sent_at__isnull=True)

    def sent(self):
        return self.filter(sent_at__isnull=False)

    def last_sent_at(self):
        return self.sent().aggregate(last=Max("sent_at"))["last"]

    def inboxes_with_held(self):
        return self.held().values_list("inbox_id", flat=True).distinct().order_by("inbox_id")


class OutboxMessage(models.Model):
    """Something the agent wants to tell its owner, held until the dispatcher's gap allows."""

    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="outbox")
    body = models.TextField()
    # Urgent messages bypass the gap, and take whatever is held along with them.
    urgent = models.BooleanField(default=False)
    created = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)

    objects = OutboxQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [
            # dispatch: the held messages of one inbox in order, and which inboxes have any.
            models.Index(
                fields=["inbox", "id"], condition=Q(sent_at__isnull=True), name="outbox_held_idx"
            ),
            # dispatch: the last send of one inbox, for the gap.
            models.Index(fields=["inbox", "sent_at"], name="outbox_sent_idx"),
        ]

    def __str__(self):
        return f"{self.inbox_id}#{self.pk}: {self.body[:40]}"
