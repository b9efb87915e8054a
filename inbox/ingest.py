"""Storing events: a delivery (ingest), a batch (ingest_many), and the machinery's own
(store_event). Validated here, stored by the database's backend (inbox/backends/), then
announced (event_stored)."""

from django.conf import settings

from . import clock, store, tracing
from .backends import current
from .models import Event, EventTrace, Inbox
from .rules import RESERVED_SOURCES, SOURCE_ID_MAX, SOURCE_MAX, require_unreserved_source
from .signals import event_stored, reserved_event_stored
from .validation import mapping_text, require_key


def ingest(inbox, source, source_id, payload=None, now=None) -> bool:
    """Store an event; False for a duplicate delivery of the same (source, source_id).

    Call it after the sender's signature check, then acknowledge. On PostgreSQL, outside a
    transaction, it is one statement and one commit (inbox/backends/postgresql.py).
    InboxBusy when the inbox's lock stays taken past ALWAYSON_INGEST_LOCK_WAIT: nothing is
    stored, the sender is told to retry.
    """
    row, text = _checked("", source, source_id, payload)
    stored = _store(inbox, [row], clock.in_statement(now), settings.ALWAYSON_INGEST_LOCK_WAIT, text)
    return bool(stored)


def ingest_many(inbox, events, now=None) -> list[bool]:
    """Store many events in one inbox at once: for each (source, source_id, payload) in
    order, whether it was new (False for a key already stored or repeated earlier in the
    batch, whose first copy wins).

    Validated like ingest, all before anything is written: one bad event and nothing is
    stored. One statement on PostgreSQL, one transaction on SQLite; the same lock, marker
    and wake-up as one ingest.
    """
    if isinstance(events, str | bytes | dict):
        raise ValueError("events must be a list of (source, source_id, payload) tuples")
    checked = []
    for n, item in enumerate(events):
        if not isinstance(item, list | tuple) or len(item) not in (2, 3):
            raise ValueError(
                f"events[{n}] must be a (source, source_id, payload) tuple, not {item!r}"
            )
        checked.append(_checked(f"events[{n}].", *item, *([None] * (3 - len(item))))[0])
    now = clock.in_statement(now)
    if not checked:
        Inbox.objects.pk_of(inbox)
        return []
    first = {}
    for n, (source, source_id, _) in enumerate(checked):
        first.setdefault((source, source_id), n)
    rows = [checked[n] for n in sorted(first.values())]
    stored = _store(inbox, rows, now, settings.ALWAYSON_INGEST_LOCK_WAIT)
    new = {first[row.source, row.source_id] for row in stored}
    return [n in new for n in range(len(checked))]


def store_event(inbox_id, source, source_id, payload, now, lock_wait=None) -> bool:
    """Insert one event; False if (inbox, source, source_id) is already stored.

    For callers that validated their input (ingest does), including the machinery's own
    sources. The UNIQUE constraint decides, not a prior SELECT, so two concurrent deliveries
    of one key store one row; the duplicate raises nothing, so a caller's surrounding
    transaction stays usable. `lock_wait` bounds the wait for the inbox's lock (InboxBusy
    past it), see inbox/locks.py bounded_write.
    """
    return bool(_store(inbox_id, [(source, source_id, payload)], now, lock_wait))


def announce_stored(inbox_id, event_id, source, source_id, payload, at) -> None:
    """Announce an event a statement of an app above inbox/ stored together with what that
    app records of it (approvals' answer.sql: the row settled, the audit entry): as _store
    announces one, with `recorded=True`, so that a receiver which records the same outcome
    (approvals' record_answer) knows it is written, and the others (the metrics) count it."""
    row = store.Stored(event_id, source, source_id, at)
    event = store.as_event(inbox_id, row, payload)
    if event_stored.receivers:
        event_stored.send(sender=Event, event=event, now=at, recorded=True)
    if source in RESERVED_SOURCES:
        reserved_event_stored.send(sender=Event, event=event, now=at, recorded=True)


def event_traces(event_ids) -> dict[int, str]:
    """The traceparents stored with these events at ingest, by event id: one query, for a
    caller with tracing on (the worker's run span continues them)."""
    return EventTrace.objects.of_events(event_ids)


def _checked(field, source, source_id, payload):
    """The row (source, source_id, payload) checked, and the payload's JSON text."""
    require_unreserved_source(f"{field}source", require_key(f"{field}source", source, SOURCE_MAX))
    require_key(f"{field}source_id", source_id, SOURCE_ID_MAX)
    payload = {} if payload is None else payload
    return (source, source_id, payload), mapping_text(f"{field}payload", payload)


def _store(inbox, rows, now, lock_wait, text=None) -> list[store.Stored]:
    """Store validated rows ((source, source_id, payload), keys distinct) in one inbox; the
    rows stored. event_stored is sent for each, in the caller's transaction when there is
    one; otherwise the insert has already committed (on PostgreSQL it commits on its own).
    `text`: a single row's payload as JSON already (validation made it)."""
    # The request's span (the webhook's, a chat post's), kept with what it stored so the
    # run that handles the events continues its trace; "" (nothing written) when tracing is
    # off or no span is current.
    inbox_id, stored = current().store(inbox, rows, now, lock_wait, text, tracing.traceparent())
    if not stored:
        return stored
    # With nobody listening, no Event is built: this runs on every delivery.
    if event_stored.receivers or not RESERVED_SOURCES.isdisjoint(row.source for row in stored):
        payloads = {(source, source_id): payload for source, source_id, payload in rows}
        for row in stored:
            event = store.as_event(inbox_id, row, payloads[row.source, row.source_id])
            event_stored.send(sender=Event, event=event, now=row.at)
            if row.source in RESERVED_SOURCES:
                reserved_event_stored.send(sender=Event, event=event, now=row.at)
    return stored
