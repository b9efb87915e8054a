from django.db import models, transaction


class PasswordResetRequestQuerySet(models.QuerySet):
    def allow(self, email, now, limit, window) -> bool:
        """Record a password reset asked for `email`, unless `limit` were asked within
        `window` before `now`; whether its email may go out.

        Counted per address, whether or not it belongs to anybody, so the answer tells
        nothing about who has an account. Two requests at the same instant may both pass the
        count: the bound is the limit plus the concurrent requests, which is what it is for
        (a victim's mailbox), not an exact quota. Rows past the window are dropped here.
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
    app's migration 0002) in the transaction that makes the change, never by Python.

    The newest row's id per inbox is the pages' cursor (alwayson/web/live.py): a fallback
    poll reads it by one index lookup, and a pushed page that reconnects says the one it saw.
    Rows are only appended (no row is locked or updated, so no write waits on another for
    this table); prune keeps the newest per inbox, all a cursor needs.
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
