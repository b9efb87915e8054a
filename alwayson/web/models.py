from django.db import models, transaction
from django.db.models.expressions import RawSQL


class PasswordResetRequestQuerySet(models.QuerySet):
    def allow(self, email, now, limit, window) -> bool:
        """Record a password reset asked for `email`, unless `limit` were asked within
        `window` before `now`; whether its email may go out. Counted per address, whether or
        not it belongs to anybody, so the answer tells nothing about who has an account. A
        bound for a victim's mailbox, not an exact quota: concurrent requests may all pass.
        """
        email = email.strip().lower()
        since = now - window
        with transaction.atomic():
            self.filter(created__lt=since).delete()
            if self.filter(email=email, created__gte=since).count() >= limit:
                return False
            self.create(email=email, created=now)
        return True


class PasswordResetRequest(models.Model):
    """A password reset email asked for: the throttle on /accounts/password_reset/ counts
    these per address (alwayson/web/views.py)."""

    email = models.CharField(max_length=254)
    created = models.DateTimeField()

    objects = PasswordResetRequestQuerySet.as_manager()

    class Meta:
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_passwordresetrequest"
        # The throttle's count: one address's requests within the cool-off.
        indexes = [models.Index(fields=["email", "created"], name="reset_email_created")]

    def __str__(self):
        return f"password reset for {self.email}"


class LiveChange(models.Model):
    """Something a live page shows changed in an inbox: written by database triggers (this
    app's migration 0002) in the transaction that makes the change, never by Python. The
    newest row's id per inbox is the pages' cursor. Only appended, so no write waits on
    another for this table; prune keeps the newest per inbox, all a cursor needs.
    """

    # No foreign key in the database: the triggers' inserts check nothing on the hot path,
    # and an inbox's rows go with it (Django's cascade).
    inbox = models.ForeignKey(
        "inbox.Inbox",
        on_delete=models.CASCADE,
        db_constraint=False,
        db_index=False,  # live_inbox_newest leads with it
        related_name="+",
    )
    kind = models.CharField(max_length=10)  # message, event, approval

    class Meta:
        indexes = [models.Index(fields=["inbox", "-id"], name="live_inbox_newest")]

    def __str__(self):
        return f"{self.inbox_id}: {self.kind} #{self.pk}"


class LiveWatchQuerySet(models.QuerySet):
    def of_dead_listeners(self):
        """Rows whose LISTEN connection is gone (PostgreSQL: no such backend now)."""
        alive = RawSQL("SELECT pid FROM pg_stat_activity", [])
        return self.exclude(listener__in=alive)

    def replace(self, listener, add, drop):
        """`listener`'s rows: those for the inbox ids `add` written, those for `drop` gone;
        committed when this returns."""
        with transaction.atomic():
            self.filter(listener=listener, inbox_id__in=drop).delete()
            self.bulk_create(
                [self.model(inbox_id=inbox_id, listener=listener) for inbox_id in add],
                ignore_conflicts=True,
            )


class LiveWatch(models.Model):
    """An inbox some open page of a web process is pushed (0: every inbox), under the
    backend pid of that process's LISTEN connection. The triggers NOTIFY only for watched
    inboxes (migration 0003): notifying commits wait for each other, and unwatched inboxes'
    runs should not pay for it (docs/explanation/live-pages.md). A dead process's rows only
    cost a NOTIFY nobody hears, until a hub reconnects or `prune` deletes them.
    """

    inbox_id = models.BigIntegerField()  # no foreign key: 0 is every inbox
    listener = models.IntegerField()  # pg_backend_pid() of the LISTEN connection

    EVERY_INBOX = 0

    objects = LiveWatchQuerySet.as_manager()

    class Meta:
        constraints = [
            # The triggers' probe (inbox_id IN (NEW.inbox_id, 0)) leads with inbox_id.
            models.UniqueConstraint(fields=["inbox_id", "listener"], name="live_watch_unique")
        ]

    def __str__(self):
        return f"inbox {self.inbox_id or 'every'} watched by backend {self.listener}"
