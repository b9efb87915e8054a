from django.db import models


class Refund(models.Model):
    """The example payments system's ledger: one row per refund, keyed by the caller's
    idempotency key, so a run retried after a takeover cannot refund twice."""

    idempotency_key = models.CharField(max_length=100, unique=True)
    order = models.CharField(max_length=50)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_refund"

    def __str__(self):
        return f"refund of order {self.order}"
