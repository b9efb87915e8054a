from django.db import models


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
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_egresscall"
        ordering = ["-id"]
        indexes = [
            # The admin's per-service counts of the last day, for one inbox or all.
            models.Index(fields=["inbox", "service", "at"], name="egress_inbox_service_idx"),
            models.Index(fields=["at"], name="egress_at_idx"),
        ]

    def __str__(self):
        return f"{self.service} {self.method} {self.path}: {self.outcome}"
