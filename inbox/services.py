"""The inbox's operations: ingest, acquire, claim_batch, finish.

Each takes an optional `now` (an aware datetime; omitted, the database's clock) and works on
one inbox, named by an `Inbox`, its slug or its id. The lease row is the lock: every
operation that decides on ownership reads it with SELECT ... FOR UPDATE (on SQLite the
IMMEDIATE transaction already holds the database's write lock).
"""

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F

from . import clock
from .models import Event, Inbox, Lease
from .validation import require_json, require_key

# Something a run produced that must commit with its finish: called with `now` inside the
# fenced transaction, after the fence check. Apps above inbox/ build these (outbox rows,
# approvals, timers) so that inbox/ never imports them.
Effect = Callable[[datetime], object]


def ingest(inbox, source, source_id, payload=None, now=None) -> bool:
    """Store an event; False for a duplicate delivery of the same (source, source_id).

    Call it after the sender's signature check, then acknowledge.
    """
    require_key("source", source)
    require_key("source_id", source_id)
    require_json("payload", payload)
    inbox = Inbox.objects.resolve(inbox)
    now = clock.resolve(now)
    return Event.objects.store(inbox.pk, source, source_id, payload, now)


def _locked_lease(inbox) -> Lease:
    return Lease.objects.select_for_update().get(inbox=inbox)


def acquire(inbox, holder, now=None) -> int | None:
    """Take or renew the inbox's lease: the generation, or None while another holds it.

    Renewing keeps the generation; any takeover, even by the same holder after its lease
    lapsed, starts a new one, so claims made under the lapsed lease can be told apart.
    """
    require_key("holder", holder)
    inbox = Inbox.objects.resolve(inbox)
    with transaction.atomic():
        now = clock.resolve(now)
        lease = _locked_lease(inbox)
        if lease.is_free(now):
            lease.generation += 1
        elif lease.holder != holder:
            return None
        lease.holder = holder
        lease.until = now + timedelta(seconds=settings.ALWAYSON_LEASE_TTL)
        lease.save(update_fields=["holder", "generation", "until"])
        return lease.generation


def claim_batch(inbox, holder, generation, now=None) -> list[Event]:
    """Claim the work for one run, oldest first; [] unless (holder, generation) holds the lease.

    Rows left running by an older generation go back to pending: their worker lost the
    lease. Pending rows out of attempts are parked as dead. A retried event is claimed
    alone, so a poison event cannot take the healthy events of its first batch down with it.
    """
    inbox = Inbox.objects.resolve(inbox)
    with transaction.atomic():
        now = clock.resolve(now)
        if not _locked_lease(inbox).is_held_by(holder, generation, now):
            return []
        events = Event.objects.filter(inbox=inbox)
        events.orphaned_by(generation).update(status=Event.Status.PENDING, updated=now)
        max_attempts = settings.ALWAYSON_MAX_ATTEMPTS
        for dead in events.out_of_attempts(max_attempts):
            dead.status = Event.Status.DEAD
            dead.error = _dead_reason(dead.error, max_attempts)
            dead.updated = now
            dead.save(update_fields=["status", "error", "updated"])
        retry = events.retries().order_by("id").values_list("id", flat=True).first()
        batch = events.filter(pk=retry) if retry else events.pending()
        ids = list(batch.values_list("id", flat=True))
        Event.objects.filter(pk__in=ids).update(
            status=Event.Status.RUNNING,
            attempts=F("attempts") + 1,
            claim_gen=generation,
            updated=now,
        )
        return list(Event.objects.filter(pk__in=ids).order_by("id"))


def _dead_reason(last_error, max_attempts):
    reason = f"too many attempts ({max_attempts})"
    return f"{reason}; last error: {last_error}" if last_error else reason


def finish(
    inbox,
    holder,
    generation,
    event_ids: Iterable[int],
    effects: Iterable[Effect] = (),
    error: str | None = None,
    now=None,
) -> bool:
    """Record a run's outcome, and commit what it produced, in one fenced transaction.

    Refused (False, nothing written) unless (holder, generation) still holds the lease and
    every event is still running under that generation. With `error`, the events go back to
    pending with the error and the effects are dropped; the attempt was counted at claim.
    """
    event_ids = sorted(set(event_ids))
    inbox = Inbox.objects.resolve(inbox)
    with transaction.atomic():
        now = clock.resolve(now)
        if not _locked_lease(inbox).is_held_by(holder, generation, now):
            return False
        status = Event.Status.PENDING if error else Event.Status.DONE
        finished = (
            Event.objects.running()
            .filter(inbox=inbox, pk__in=event_ids, claim_gen=generation)
            .update(status=status, error=error or "", updated=now)
        )
        if finished != len(event_ids):
            # A second finish of the same claim, or ids that were never claimed by this
            # generation: refuse the whole run rather than commit its effects twice.
            transaction.set_rollback(True)
            return False
        if not error:
            for effect in effects:
                effect(now)
        return True
