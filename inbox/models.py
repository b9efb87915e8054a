from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.db.models import F, Q

from .exceptions import UnknownInbox
from .signals import event_stored


class InboxManager(models.Manager):
    def resolve(self, ref) -> "Inbox":
        """An Inbox from an instance, a slug or a primary key; UnknownInbox otherwise."""
        if isinstance(ref, Inbox):
            return ref
        lookup = {"pk": ref} if isinstance(ref, int) and not isinstance(ref, bool) else None
        if lookup is None and isinstance(ref, str) and ref:
            lookup = {"slug": ref}
        if lookup is None:
            raise UnknownInbox(ref)
        try:
            return self.get(**lookup)
        except Inbox.DoesNotExist:
            raise UnknownInbox(ref) from None


class Inbox(models.Model):
    """One agent's inbox for one owner. Every rule (one worker, dedupe, gap) holds per inbox."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="inboxes"
    )
    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    objects = InboxManager()

    class Meta:
        verbose_name_plural = "inboxes"
        ordering = ["slug"]

    def __str__(self):
        return self.slug

    def save(self, *args, **kwargs):
        # The lease row exists from the start, so acquire() always has a row to lock and
        # two first-time acquirers cannot both insert one.
        with transaction.atomic(using=kwargs.get("using")):
            adding = self._state.adding
            super().save(*args, **kwargs)
            if adding:
                Lease.objects.create(inbox=self)


class Lease(models.Model):
    """Who may run an inbox's agent, and until when. One row per inbox.

    `generation` goes up on every takeover; every claimed event is stamped with the generation
    that claimed it, and every write that ends a run checks (holder, generation) under this
    row's lock, so a worker that was only slow cannot finish a run somebody else took over.
    """

    inbox = models.OneToOneField(
        Inbox, on_delete=models.CASCADE, primary_key=True, related_name="lease"
    )
    holder = models.CharField(max_length=200, blank=True)
    generation = models.PositiveBigIntegerField(default=0)
    until = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.inbox_id}: {self.holder or '-'} gen {self.generation}"

    def is_free(self, now) -> bool:
        return self.until is None or self.until < now

    def is_held_by(self, holder, generation, now) -> bool:
        return self.holder == holder and self.generation == generation and not self.is_free(now)


class EventQuerySet(models.QuerySet):
    def pending(self):
        return self.filter(status=Event.Status.PENDING)

    def running(self):
        return self.filter(status=Event.Status.RUNNING)

    def dead(self):
        return self.filter(status=Event.Status.DEAD)

    def orphaned_by(self, generation):
        """Running rows of an older generation: their worker lost the lease mid-run."""
        return self.running().filter(claim_gen__lt=generation)

    def out_of_attempts(self, max_attempts):
        return self.pending().filter(attempts__gte=max_attempts)

    def retries(self):
        return self.pending().filter(attempts__gt=0)

    def store(self, inbox_id, source, source_id, payload, now) -> bool:
        """Insert one event; False if (inbox, source, source_id) is already stored.

        The UNIQUE constraint decides, not a prior SELECT, so two concurrent deliveries of the
        same key store one row: on PostgreSQL the second insert waits for the first to commit
        and then conflicts. The savepoint keeps a caller's surrounding transaction usable.
        """
        try:
            with transaction.atomic(using=self.db):
                event = self.create(
                    inbox_id=inbox_id,
                    source=source,
                    source_id=source_id,
                    payload=payload,
                    created=now,
                    updated=now,
                )
        except IntegrityError:
            if not self.filter(inbox_id=inbox_id, source=source, source_id=source_id).exists():
                raise
            return False
        event_stored.send(sender=Event, event=event, now=now)
        return True


class Event(models.Model):
    """One wake-up of the agent: a webhook, a chat message, a timer tick, an approval answer."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        DEAD = "dead"

    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="events")
    source = models.CharField(max_length=100)
    source_id = models.CharField(max_length=255)
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    claim_gen = models.PositiveBigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    created = models.DateTimeField()
    updated = models.DateTimeField()

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            # The first rule: a retried delivery of the same source key is refused.
            models.UniqueConstraint(
                fields=["inbox", "source", "source_id"], name="event_unique_source_key"
            ),
        ]
        indexes = [
            # claim_batch: the pending rows of one inbox, oldest first.
            models.Index(
                fields=["inbox", "id"], condition=Q(status="pending"), name="event_pending_idx"
            ),
            # claim_batch: running rows of one inbox left behind by an older generation.
            models.Index(
                fields=["inbox", "claim_gen"],
                condition=Q(status="running"),
                name="event_running_idx",
            ),
            # deadletters and the admin's dead filter.
            models.Index(
                fields=["inbox", "updated"], condition=Q(status="dead"), name="event_dead_idx"
            ),
        ]

    def __str__(self):
        return f"{self.source}:{self.source_id} ({self.status})"


def claim_update(generation):
    """The column changes that claim a row: the attempt is counted now, not at failure,
    so an event that kills every worker still runs out of attempts."""
    return {
        "status": Event.Status.RUNNING,
        "attempts": F("attempts") + 1,
        "claim_gen": generation,
    }
