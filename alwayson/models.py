from django.db import models, transaction


class Refund(models.Model):
    """The example payments system's ledger: one row per refund, keyed by the caller's
    idempotency key, so a run retried after a takeover cannot refund twice."""

    idempotency_key = models.CharField(max_length=100, unique=True)
    order = models.CharField(max_length=50)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"refund of order {self.order}"


class EgressCall(models.Model):
    """One outbound call an agent asked the egress gateway for: made, refused or failed.

    The audit and the admin's counts; never the credential, the query string or a body.
    """

    class Outcome(models.TextChoices):
        SENT = "sent"
        REFUSED = "refused"
        FAILED = "failed"

    inbox = models.ForeignKey(
        "inbox.Inbox", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    service = models.CharField(max_length=50)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=300)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The admin's per-service counts of the last day, for one inbox or all.
            models.Index(fields=["inbox", "service", "at"], name="egress_inbox_service_idx"),
            models.Index(fields=["at"], name="egress_at_idx"),
        ]

    def __str__(self):
        return f"{self.service} {self.method} {self.path}: {self.outcome}"


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
    these per address (alwayson/views.py)."""

    email = models.CharField(max_length=254)
    created = models.DateTimeField()

    objects = PasswordResetRequestQuerySet.as_manager()

    class Meta:
        # The throttle's count: one address's requests within the cool-off.
        indexes = [models.Index(fields=["email", "created"], name="reset_email_created")]

    def __str__(self):
        return f"password reset for {self.email}"
