import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Max, Q

from inbox.models import Inbox


class OutboxQuerySet(models.QuerySet):
    def held(self):
        return self.filter(status=OutboxMessage.Status.HELD)

    def sent(self):
        return self.filter(status=OutboxMessage.Status.SENT)

    def failed(self):
        return self.filter(status=OutboxMessage.Status.FAILED)

    def last_sent_at(self):
        """The last send attempted: an at-most-once send that failed still spent the gap."""
        return self.filter(sent_at__isnull=False).aggregate(last=Max("sent_at"))["last"]

    def inboxes_with_held(self):
        return self.held().values_list("inbox_id", flat=True).distinct().order_by("inbox_id")

    def of_run(self, inbox_id, generation):
        """What one run (its inbox and lease generation) said, in the order it said it."""
        return self.filter(inbox_id=inbox_id, generation=generation).order_by("id")


def send_key_for(inbox_id, messages) -> str:
    """The key of a send: from what its messages are (each one's say_key), so the same
    messages make the same key, even when a failover lost the stamp, or the run's commit and
    a rerun said them again under new ids. A message no run said is known by its id."""
    basis = ",".join(message.say_key or f"#{message.pk}" for message in messages)
    return hashlib.sha256(f"{inbox_id}:{basis}".encode()).hexdigest()[:32]


class OutboxMessage(models.Model):
    """Something the agent wants to tell its owner, held until the dispatcher's gap allows."""

    class Status(models.TextChoices):
        HELD = "held"
        SENT = "sent"
        FAILED = "failed"

    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="outbox")
    body = models.TextField()
    # Urgent messages bypass the gap, and take whatever is held along with them.
    urgent = models.BooleanField(default=False)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.HELD)
    created = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    # The send this message belongs to, for good: stamped on its rows and committed before
    # the send's first attempt. Every retry and every resend carries exactly the rows with
    # this key, under it; messages queued later go in a later send.
    send_key = models.CharField(max_length=32, blank=True)
    # The lease generation of the run that said it (its RunRecord); null when no run did.
    generation = models.PositiveBigIntegerField(null=True, blank=True)
    # What said it, the same when a rerun of the same events says the same again (Run.key of
    # its events, its place among the run's messages and its words): its send's key comes
    # from it. Null when no run said it: a nullable column without a default is added in
    # place on SQLite, whose table rebuild would drop the live pages' triggers on this table.
    say_key = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001

    objects = OutboxQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [
            # dispatch: the held messages of one inbox in order (and those of the send it
            # just stamped), and which inboxes have any.
            models.Index(
                fields=["inbox", "id"], condition=Q(status="held"), name="outbox_held_idx"
            ),
            # last_sent_at for one inbox; the inbox page's newest-first list.
            models.Index(fields=["inbox", "sent_at"], name="outbox_sent_idx"),
            # deadletters and the admin: messages parked after failed sends.
            models.Index(
                fields=["inbox", "id"], condition=Q(status="failed"), name="outbox_failed_idx"
            ),
            # prune (alwayson/ops/retention.py): sent messages, oldest first.
            models.Index(
                fields=["sent_at", "id"], condition=Q(status="sent"), name="outbox_sent_age_idx"
            ),
            # A run's timeline (alwayson/web/runs.py): what it said, among everything its
            # inbox ever said and kept. Rows no run wrote (before run records) are left out.
            models.Index(
                fields=["inbox", "generation", "id"],
                condition=Q(generation__isnull=False),
                name="outbox_run_idx",
            ),
        ]

    def __str__(self):
        return f"{self.inbox_id}#{self.pk}: {self.body[:40]}"


class Channel(models.Model):
    """How and how often one inbox's outbox reaches its owner. The dispatcher locks this row
    while it decides and (at-least-once) sends, so one inbox is served by one dispatcher."""

    class Kind(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"
        SLACK = "slack"
        TELEGRAM = "telegram"

    class Mode(models.TextChoices):
        # Send inside the transaction, mark sent after: a crash in between sends again.
        AT_LEAST_ONCE = "at_least_once", "at least once"
        # Mark sent and commit, then send: a crash in between loses the message.
        AT_MOST_ONCE = "at_most_once", "at most once"

    inbox = models.OneToOneField(
        Inbox, on_delete=models.CASCADE, primary_key=True, related_name="channel"
    )
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.EMAIL)
    email = models.EmailField(blank=True, help_text="default: the inbox owner's address")
    url = models.URLField(blank=True, help_text="webhook channel: where to POST")
    target = models.CharField(
        max_length=100,
        blank=True,
        help_text="Slack: the channel id (C0123...); Telegram: the chat id",
    )
    mode = models.CharField(max_length=15, choices=Mode.choices, default=Mode.AT_LEAST_ONCE)
    gap = models.PositiveIntegerField(
        null=True, blank=True, help_text="seconds between sends; default ALWAYSON_OUTBOX_GAP"
    )
    # Dispatcher-owned.
    failures = models.PositiveIntegerField(default=0)
    retry_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=~Q(kind="webhook") | ~Q(url=""), name="channel_webhook_needs_url"
            ),
            models.CheckConstraint(
                condition=~Q(kind__in=["slack", "telegram"]) | ~Q(target=""),
                name="channel_chat_needs_target",
            ),
        ]

    def __str__(self):
        return f"{self.inbox_id}: {self.kind}"

    @property
    def gap_seconds(self) -> int:
        return self.gap if self.gap is not None else settings.ALWAYSON_OUTBOX_GAP

    def waits_for_gap(self, now) -> bool:
        last = OutboxMessage.objects.filter(inbox_id=self.inbox_id).last_sent_at()
        return last is not None and now - last < timedelta(seconds=self.gap_seconds)

    def backing_off(self, now) -> bool:
        return self.retry_at is not None and now < self.retry_at


class NoticeQuerySet(models.QuerySet):
    def held(self):
        return self.filter(status=Notice.Status.HELD)

    def due(self, now):
        return self.held().filter(due_at__lte=now)

    def failed(self):
        return self.filter(status=Notice.Status.FAILED)


def notice_key(inbox_id, topic, recipient_id) -> str:
    """A notice's key, its email's Message-ID: from what makes it unique, so every retry
    and every resend carries the same one."""
    return hashlib.sha256(f"notice:{inbox_id}:{topic}:{recipient_id}".encode()).hexdigest()[:32]


class Notice(models.Model):
    """One email to one person about one thing, such as an approval waiting for them: made
    once per (inbox, topic, recipient), sent by the dispatcher under a stable Message-ID,
    retried with backoff and parked like the outbox's sends. It goes to a person, not
    through the inbox's channel, so it neither waits for nor spends the inbox's gap."""

    Status = OutboxMessage.Status

    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="notices")
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    topic = models.CharField(
        max_length=255, help_text='what it is about, e.g. "approval:refund-881"'
    )
    key = models.CharField(max_length=32, unique=True)
    subject = models.CharField(max_length=200)
    body = models.TextField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.HELD)
    created = models.DateTimeField()
    # Not sent before this: its creation, then pushed back by each failed attempt's backoff.
    due_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    sent_to = models.EmailField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    objects = NoticeQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            # Once per approval and person: a second copy of the same notice is refused.
            models.UniqueConstraint(
                fields=["inbox", "topic", "recipient"], name="notice_once_per_topic"
            ),
        ]
        indexes = [
            # dispatch_notices: held notices that are due, oldest first.
            models.Index(
                fields=["due_at", "id"], condition=Q(status="held"), name="notice_due_idx"
            ),
            # The admin: notices parked after failed sends.
            models.Index(
                fields=["inbox", "id"], condition=Q(status="failed"), name="notice_failed_idx"
            ),
        ]

    def __str__(self):
        return f"{self.topic} to {self.recipient_id} ({self.status})"
