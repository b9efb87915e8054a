"""A stand-in payments tool for the example agent. Like a real payments API (Stripe's
Idempotency-Key), it refuses to repeat a request it has seen under the same key."""

from django.db import IntegrityError, transaction

from alwayson.demo.models import Refund


def refund(order: str, idempotency_key: str) -> bool:
    """Refund an order; False if this key was already used (the refund happened before).

    Runs in its own transaction, outside the run's: an external side effect happens when
    it is called, whether or not the run's finish later commits.
    """
    try:
        with transaction.atomic():
            Refund.objects.create(order=order, idempotency_key=idempotency_key)
    except IntegrityError:
        return False
    return True
