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
