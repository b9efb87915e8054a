"""Events at the edge of being dead: out of attempts, and the claim that parks them."""

from django.conf import settings as django_settings

from inbox.models import Event
from inbox.services import acquire, claim_batch, ingest, release

TRACEBACK = (
    'Traceback (most recent call last):\n  File "agent.py", line 3\nValueError: refund 881 failed'
)


def out_of_attempts(inbox, *keys, now, error=TRACEBACK):
    """Pending events that the next claim parks as dead."""
    for key in keys:
        ingest(inbox, "chat", key, {}, now=now)
    Event.objects.filter(inbox=inbox, source_id__in=keys).update(
        attempts=django_settings.ALWAYSON_MAX_ATTEMPTS, error=error
    )


def claim(inbox, now, holder="W"):
    """One claim, as a worker's step makes it, lease released after."""
    generation = acquire(inbox, holder, now=now)
    assert generation is not None
    try:
        return claim_batch(inbox, holder, generation, now=now)
    finally:
        release(inbox, holder, generation)
