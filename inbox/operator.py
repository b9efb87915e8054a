"""An operator's actions on events: put dead ones back (requeue), park pending ones by hand
(mark_dead). Each inbox's events are moved under its lock, as every other writer's.

Each action answers which events it moved (the admin's history names each); the count the
command line prints is len() of that.
"""

import logging
from collections.abc import Iterable

from django.db import transaction

from . import clock
from .backends import current
from .locks import lock_inbox
from .models import Event
from .validation import require_ids, require_key

log = logging.getLogger("alwayson.events")


def requeue(event_ids: Iterable[int], now=None) -> list[int]:
    """Put dead events back to pending with their attempts reset; the ids put back."""
    event_ids = require_ids("event_ids", event_ids)
    now = clock.resolve(now)
    requeued = []
    by_inbox = {}
    for pk, inbox_id in Event.objects.dead().filter(pk__in=event_ids).values_list("pk", "inbox_id"):
        by_inbox.setdefault(inbox_id, []).append(pk)
    for inbox_id, ids in sorted(by_inbox.items()):
        with transaction.atomic():
            lease = lock_inbox(inbox_id)
            # Under the inbox's lock nobody else moves a dead event: these are the ones.
            ids = list(Event.objects.dead().filter(pk__in=ids).values_list("pk", flat=True))
            Event.objects.filter(pk__in=ids).update(
                status=Event.Status.PENDING,
                attempts=0,
                claim_gen=None,
                error="",
                available_at=now,
                updated=now,
            )
            if ids:
                lease.note_work(now)
                current().notify_work(inbox_id)
            requeued += ids
    return requeued


def mark_dead(event_ids: Iterable[int], reason: str, now=None) -> list[int]:
    """Park pending events as dead by hand (an operator's decision); the ids parked."""
    require_key("reason", reason)
    event_ids = require_ids("event_ids", event_ids)
    now = clock.resolve(now)
    parked = []
    inbox_ids = set(
        Event.objects.pending().filter(pk__in=event_ids).values_list("inbox_id", flat=True)
    )
    for inbox_id in sorted(inbox_ids):
        with transaction.atomic():
            lease = lock_inbox(inbox_id)
            # Claims and finishes take the inbox's lock too: these stay pending until commit.
            ids = list(
                Event.objects.pending()
                .filter(inbox_id=inbox_id, pk__in=event_ids)
                .values_list("pk", flat=True)
            )
            Event.objects.filter(pk__in=ids).update(
                status=Event.Status.DEAD, error=reason, updated=now
            )
            parked += ids
            lease.recount_work()
        if ids:
            # A decision, not a failure: logged, and the owner is not alerted (events_dead).
            log.warning(
                "events marked dead by hand: inbox=%s count=%s reason=%s",
                inbox_id,
                len(ids),
                reason,
                extra={"inbox_id": inbox_id, "count": len(ids), "reason": reason},
            )
    return parked
