"""The inbox's operations: ingest, acquire, claim_batch, finish, and the lease verbs.

Each takes an optional `now` (an aware datetime; omitted, the database's clock) and works on
one inbox, named by an `Inbox`, its slug or its id.

The lease row is the inbox's lock. Every write that touches an inbox's events or what a run
produced locks that row first (SELECT ... FOR UPDATE on PostgreSQL; on SQLite the IMMEDIATE
transaction already holds the database's write lock), so the rows beneath it are always
locked in the same order and two writers on one inbox can never deadlock.
"""

import logging
import random
from collections.abc import Callable, Iterable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections, transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Greatest

from . import clock, store
from .exceptions import InboxBusy, UnknownInbox
from .models import Event, Inbox, Lease, Session
from .signals import event_stored, events_dead, lease_taken_over, reserved_event_stored
from .store import WORK_CHANNEL  # idle workers LISTEN there; a stored event NOTIFYs
from .validation import (
    mapping_text,
    require_duration,
    require_ids,
    require_int,
    require_json,
    require_key,
    require_text,
)

log = logging.getLogger("alwayson.events")

# Something a run produced that must commit with its finish: called with `now` inside the
# fenced transaction, after the fence check. Apps above inbox/ build these (outbox rows,
# approvals, timers) so that inbox/ never imports them.
Effect = Callable[[datetime], object]

# Sources only the machinery writes, through store_event: a timer tick or an approval answer
# ingested from outside could take the key of a real occurrence or bypass a deadline.
RESERVED_SOURCES = frozenset({"timer", "approval"})

# The columns' widths: a longer key is refused on both databases (PostgreSQL would refuse it
# mid-transaction; SQLite would store it).
SOURCE_MAX = Event._meta.get_field("source").max_length
SOURCE_ID_MAX = Event._meta.get_field("source_id").max_length
HOLDER_MAX = Lease._meta.get_field("holder").max_length


def require_unreserved_source(field: str, source: str) -> str:
    if source in RESERVED_SOURCES:
        raise ValueError(f"{field} {source!r} is reserved for alwayson's own timers and approvals")
    return source


_jitter = random.Random()


def lease_ttl() -> timedelta:
    return timedelta(seconds=settings.ALWAYSON_LEASE_TTL)


def retry_delay(attempts: int) -> timedelta:
    """Exponential backoff with jitter before the next attempt, capped.

    Half the delay is fixed and half random ("equal jitter"): retries of events that failed
    together spread out, and none comes back sooner than half its step.
    """
    step = min(
        settings.ALWAYSON_RETRY_CAP, settings.ALWAYSON_RETRY_BASE * 2 ** max(attempts - 1, 0)
    )
    return timedelta(seconds=step / 2 + _jitter.uniform(0, step / 2))


def _locked_lease(inbox_id) -> Lease:
    return Lease.objects.select_for_update().get(inbox_id=inbox_id)


def lock_inbox(inbox_id) -> Lease:
    """Take the inbox's lock (its lease row) for the rest of the current transaction.

    For writers above inbox/ that decide from rows of their own before they store an event
    (answer_approval): read after this, those rows include every write committed by the
    others, who take the same lock first.
    """
    return _locked_lease(inbox_id)


def _notify_work(inbox_id):
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [WORK_CHANNEL, str(inbox_id)])


@contextmanager
def bounded_write(inbox_id, wait: float | None):
    """A transaction on one inbox whose wait for that inbox's lock is bounded: InboxBusy
    after `wait` seconds (None: wait as long as the database's own timeouts allow).

    Deliveries and people's answers use it: a worker frozen inside a transaction (SIGSTOP,
    a debugger, a swap storm) holds its inbox's lease row until PostgreSQL ends its idle
    session (idle_in_transaction_session_timeout), longer than a webhook sender waits. On
    PostgreSQL the bound is the transaction's lock_timeout; on SQLite, whose IMMEDIATE
    transaction takes the database's write lock at BEGIN, it is the busy timeout.
    """
    bounded_sqlite = (
        wait is not None and connection.vendor == "sqlite" and not connection.in_atomic_block
    )
    try:
        if bounded_sqlite:
            restore = _sqlite_busy_timeout(wait)
        with transaction.atomic():
            if wait is not None and connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    # Local to this transaction: the next one on the connection waits as usual.
                    cursor.execute(
                        "SELECT set_config('lock_timeout', %s, true)", [f"{round(wait * 1000)}ms"]
                    )
            yield
    except OperationalError as exc:
        if wait is not None and _is_lock_timeout(exc):
            raise InboxBusy(inbox_id, wait) from exc
        raise
    finally:
        if bounded_sqlite:
            _sqlite_busy_timeout(restore)


def _sqlite_busy_timeout(seconds: float) -> float:
    """Set the connection's busy timeout; the previous one, in seconds."""
    connection.ensure_connection()
    raw = connection.connection
    previous = raw.execute("PRAGMA busy_timeout").fetchone()[0] / 1000
    raw.execute(f"PRAGMA busy_timeout = {round(seconds * 1000)}")
    return previous


def _is_lock_timeout(exc: OperationalError) -> bool:
    # PostgreSQL: lock_not_available (55P03). SQLite: SQLITE_BUSY after the busy timeout.
    return getattr(exc.__cause__, "sqlstate", None) == "55P03" or "database is locked" in str(exc)


def _store(inbox, rows, now, lock_wait, text=None) -> list[store.Stored]:
    """Store validated rows ((source, source_id, payload), keys distinct) in one inbox; the
    rows stored. event_stored is sent for each, in the caller's transaction when there is
    one; otherwise the insert has already committed (on PostgreSQL it commits on its own).
    `text`: a single row's payload as JSON already (validation made it)."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "postgresql":
        # Inside a caller's transaction a lock timeout must not abort it: a savepoint there.
        bounded = lock_wait is not None and db.in_atomic_block
        try:
            with transaction.atomic() if bounded else nullcontext():
                if len(rows) == 1:
                    inbox_id, row = store.insert_one_pg(db, inbox, *rows[0], now, lock_wait, text)
                    stored = [row] if row else []
                else:
                    inbox_id, stored = store.insert_pg(inbox, rows, now, lock_wait)
        except OperationalError as exc:
            if lock_wait is not None and _is_lock_timeout(exc):
                raise InboxBusy(inbox, lock_wait) from exc
            raise
    else:
        # Looked up even for an id: SQLite checks the foreign key only at commit, too late
        # for UnknownInbox.
        inbox_id = Inbox.objects.resolve(inbox).pk
        now = clock.resolve(now)
        with bounded_write(inbox_id, lock_wait):
            stored = store.insert_sqlite(inbox_id, rows, now)
    if not stored:
        return stored
    if event_stored.receivers or not RESERVED_SOURCES.isdisjoint(row.source for row in stored):
        payloads = {(source, source_id): payload for source, source_id, payload in rows}
        for row in stored:
            event = store.as_event(inbox_id, row, payloads[row.source, row.source_id])
            event_stored.send(sender=Event, event=event, now=row.at)
            if row.source in RESERVED_SOURCES:
                reserved_event_stored.send(sender=Event, event=event, now=row.at)
    return stored


def store_event(inbox_id, source, source_id, payload, now, lock_wait=None) -> bool:
    """Insert one event; False if (inbox, source, source_id) is already stored.

    For callers that validated their input (ingest does), including the machinery's own
    sources. The UNIQUE constraint decides, not a prior SELECT, so two concurrent deliveries
    of one key store one row; the duplicate raises nothing, so a caller's surrounding
    transaction stays usable. `lock_wait` bounds the wait for the inbox's lock (InboxBusy
    past it), see bounded_write.
    """
    return bool(_store(inbox_id, [(source, source_id, payload)], now, lock_wait))


def _checked(field, source, source_id, payload):
    """The row (source, source_id, payload) checked, and the payload's JSON text."""
    require_unreserved_source(f"{field}source", require_key(f"{field}source", source, SOURCE_MAX))
    require_key(f"{field}source_id", source_id, SOURCE_ID_MAX)
    payload = {} if payload is None else payload
    return (source, source_id, payload), mapping_text(f"{field}payload", payload)


def _given_now(now):
    """`now` checked; None stays None, so the database reads its clock inside the insert."""
    return None if now is None else clock.resolve(now)


def ingest(inbox, source, source_id, payload=None, now=None) -> bool:
    """Store an event; False for a duplicate delivery of the same (source, source_id).

    Call it after the sender's signature check, then acknowledge. On PostgreSQL, outside a
    transaction, it is one statement and one commit (inbox/store.py). InboxBusy when the
    inbox's lock stays taken past ALWAYSON_INGEST_LOCK_WAIT: nothing is stored, the sender
    is told to retry.
    """
    row, text = _checked("", source, source_id, payload)
    stored = _store(inbox, [row], _given_now(now), settings.ALWAYSON_INGEST_LOCK_WAIT, text)
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
    now = _given_now(now)
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


def acquire(inbox, holder, now=None) -> int | None:
    """Take or renew the inbox's lease: the generation, or None while another holds it."""
    require_key("holder", holder, HOLDER_MAX)
    _given_now(now)
    inbox = Inbox.objects.resolve(inbox)
    with transaction.atomic():
        now = clock.resolve(now)
        return _locked_lease(inbox.pk).take(holder, now, lease_ttl())


def acquire_next(holder, now=None) -> tuple[int, int] | None:
    """Take the lease of some inbox that has work and no live holder: (inbox_id, generation).

    SKIP LOCKED lets many workers on many hosts look at once without queueing behind each
    other; the row each one locks is an inbox nobody else can take in the meantime.
    """
    require_key("holder", holder, HOLDER_MAX)
    with transaction.atomic():
        now = clock.resolve(now)
        lease = (
            Lease.objects.with_work(now)
            .select_for_update(skip_locked=True)
            .order_by("work_at")
            .first()
        )
        if lease is None:
            return None
        return lease.inbox_id, lease.take(holder, now, lease_ttl())


@dataclass
class Claim:
    """What take_next took: an inbox's lease and the batch claimed under it, with the
    session state the run resumes from. `events` is empty when the inbox had nothing
    claimable after all; the lease is then already given back."""

    inbox: Inbox
    generation: int
    events: list[Event]
    state: dict | None
    # What CLAIM_EXTRAS read with the take, by name; empty where the take could not.
    extras: dict = field(default_factory=dict)


# Values an app above inbox/ reads with the claim, by name: a scalar SQL expression over the
# taken inbox's id (`t.inbox_id`), read in take_next's statement on PostgreSQL instead of in
# a round trip of its own. alwayson registers the inbox's agent (alwayson/apps.py).
CLAIM_EXTRAS: dict[str, str] = {}


def take_next(holder, now=None) -> Claim | None:
    """acquire_next and claim_batch together: take the lease of some inbox with work and no
    live holder, and claim its batch, by the same rules (orphans back to pending, dead
    parked, a due retry alone). None when no inbox has work.

    On PostgreSQL, in the common case, it is one statement and one commit (_TAKE_SQL): the
    lease under SKIP LOCKED, the batch and the session state. When the inbox has leftovers
    to settle first (rows an older generation left running, events out of attempts) the
    statement only takes the lease, and the settling and the claim follow in a transaction
    under the lease row's lock (_claim_locked).
    """
    require_key("holder", holder)
    now = _given_now(now)
    if connection.vendor != "postgresql":
        with transaction.atomic():
            taken = acquire_next(holder, now)
            if taken is None:
                return None
            inbox_id, generation = taken
            inbox = Inbox.objects.get(pk=inbox_id)
            events = claim_batch(inbox, holder, generation, now)
            if not events:
                release(inbox_id, holder, generation)
                return Claim(inbox, generation, [], None)
            state = Session.objects.filter(inbox_id=inbox_id).values_list("state", flat=True)
            return Claim(inbox, generation, events, state.first())
    take = _take_statement(holder, now)
    with store.prepared_cursor() as cursor:
        cursor.execute(take.sql, take.params)
        rows = cursor.fetchall()
    return take.claim(rows)


@dataclass(frozen=True)
class _Take:
    """take_next's statement for one holder, and what its rows make (after they commit)."""

    holder: str
    sql: str
    params: dict
    extras: list

    def claim(self, rows) -> Claim | None:
        if not rows:
            return None
        holder = self.holder
        extras = dict(zip(self.extras, rows[0][23:], strict=True))
        now, generation, leftovers, old_holder, old_until, *inbox_row = rows[0][:10]
        inbox = Inbox.from_db(connection.alias, _INBOX_FIELDS, inbox_row)
        if old_until is not None:  # lapsed, not released: a takeover, as in Lease.take
            lapsed = Lease(
                inbox_id=inbox.pk, holder=old_holder, generation=generation - 1, until=old_until
            )
            lease_taken_over.send(sender=Lease, lease=lapsed, now=now)
        if leftovers:
            return _claim_locked(inbox, holder, generation, now)
        if rows[0][10] is None:
            # Nothing claimable after all (a retry waiting for its backoff, or events this
            # statement's snapshot predates): give the lease back with the work recounted,
            # in statements that see what committed before the lock.
            with transaction.atomic():
                if _fence(inbox, inbox.pk, holder, generation, now, release=True) is not None:
                    _recount_work(inbox.pk)
            return Claim(inbox, generation, [], None)
        return _claimed(inbox, generation, [row[10:23] for row in rows], extras)


def _take_statement(holder, now) -> _Take:
    names = sorted(CLAIM_EXTRAS)
    extras_sql = "".join(f",\n    ({CLAIM_EXTRAS[name]})" for name in names)
    params = {
        "now": now,
        "holder": holder,
        "ttl": lease_ttl(),
        "max_attempts": settings.ALWAYSON_MAX_ATTEMPTS,
    }
    return _Take(holder, _TAKE_SQL.replace("{extras}", extras_sql), params, names)


def _claim_locked(inbox, holder, generation, now) -> Claim:
    """The claim after take_next's lease when leftovers need settling first: in one
    transaction under the lease row's lock, fenced as a finish is."""
    with transaction.atomic():
        if _fence(inbox, inbox.pk, holder, generation, now, release=False) is None:
            return Claim(inbox, generation, [], None)
        _settle_leftovers(inbox.pk, generation, now)
        with store.prepared_cursor() as cursor:
            cursor.execute(_CLAIM_SQL, {"inbox": inbox.pk, "now": now, "generation": generation})
            rows = cursor.fetchall()
        if not rows:
            _fence(inbox, inbox.pk, holder, generation, now, release=True)
            _recount_work(inbox.pk)
            return Claim(inbox, generation, [], None)
    return _claimed(inbox, generation, rows)


def _claimed(inbox, generation, rows, extras=None) -> Claim:
    """A Claim from claimed rows: the event's columns (_EVENT_FIELDS), then the state."""
    payload = Event._meta.get_field("payload")
    events = []
    for *values, _ in rows:
        values[4] = payload.from_db_value(values[4], None, connection)
        event = Event.from_db(connection.alias, _EVENT_FIELDS, values)
        event.inbox = inbox
        events.append(event)
    events.sort(key=lambda event: event.pk)  # oldest first; RETURNING has no order
    state = Session._meta.get_field("state").from_db_value(rows[0][-1], None, connection)
    return Claim(inbox, generation, events, state, extras or {})


_INBOX_FIELDS = ["id", "owner_id", "slug", "name", "created"]
_EVENT_FIELDS = [
    "id", "inbox_id", "source", "source_id", "payload", "status", "attempts", "claim_gen",
    "error", "available_at", "created", "updated",
]  # fmt: skip

# take_next: an inbox with work, soonest first, by lease_work_idx under SKIP LOCKED; the
# leftovers checks by event_running_idx and event_pending_idx; the batch by
# event_pending_idx (the oldest due retry alone, if any).
#
# One snapshot serves the whole statement, taken before the lease row was locked: the
# events a delivery committed after it are not claimed now (the finish's recount, a later
# statement, finds them), and `e.status = 'pending'` in the claim is re-checked on the
# newest row version, so an event an operator parked meanwhile is not claimed. A finish of
# the previous run that this snapshot predates shows as leftovers (its events still
# running), and the claim then happens in _claim_locked, which reads everything afresh.
_TAKE_SQL = """
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now),
picked AS (
    SELECT inbox_id, holder AS old_holder, until AS old_until FROM inbox_lease, clock
    WHERE work_at <= clock.now AND (until IS NULL OR until < clock.now)
    ORDER BY work_at LIMIT 1
    FOR UPDATE OF inbox_lease SKIP LOCKED
),
taken AS (
    UPDATE inbox_lease AS l
    SET holder = %(holder)s::text, generation = l.generation + 1,
        until = clock.now + %(ttl)s::interval
    FROM picked, clock
    WHERE l.inbox_id = picked.inbox_id
    RETURNING l.inbox_id, l.generation, clock.now, picked.old_holder, picked.old_until,
        EXISTS (SELECT 1 FROM inbox_event AS e WHERE e.inbox_id = l.inbox_id
                AND e.status = 'running' AND e.claim_gen < l.generation)
        OR EXISTS (SELECT 1 FROM inbox_event AS e WHERE e.inbox_id = l.inbox_id
                   AND e.status = 'pending' AND e.attempts >= %(max_attempts)s::int)
        AS leftovers
),
due AS (
    SELECT e.id, e.attempts FROM inbox_event AS e, taken AS t
    WHERE e.inbox_id = t.inbox_id AND e.status = 'pending' AND e.available_at <= t.now
      AND NOT t.leftovers
),
retry AS (SELECT min(id) AS id FROM due WHERE attempts > 0),
chosen AS (SELECT due.id FROM due, retry WHERE retry.id IS NULL OR due.id = retry.id),
claimed AS (
    UPDATE inbox_event AS e
    SET status = 'running', attempts = e.attempts + 1, claim_gen = t.generation, updated = t.now
    FROM chosen, taken AS t
    WHERE e.id = chosen.id AND e.status = 'pending'
    RETURNING e.id, e.inbox_id, e.source, e.source_id, e.payload, e.status, e.attempts,
        e.claim_gen, e.error, e.available_at, e.created, e.updated
)
SELECT t.now, t.generation, t.leftovers, t.old_holder, t.old_until,
    i.id, i.owner_id, i.slug, i.name, i.created,
    c.id, c.inbox_id, c.source, c.source_id, c.payload, c.status, c.attempts,
    c.claim_gen, c.error, c.available_at, c.created, c.updated,
    s.state{extras}
FROM taken AS t
JOIN inbox_inbox AS i ON i.id = t.inbox_id
LEFT JOIN inbox_session AS s ON s.inbox_id = t.inbox_id
LEFT JOIN claimed AS c ON true
"""

# _claim_locked, the batch after settling: as in _TAKE_SQL, in a statement of its own.
_CLAIM_SQL = """
WITH due AS (
    SELECT id, attempts FROM inbox_event
    WHERE inbox_id = %(inbox)s::bigint AND status = 'pending'
      AND available_at <= %(now)s::timestamptz
),
retry AS (SELECT min(id) AS id FROM due WHERE attempts > 0),
chosen AS (
    SELECT due.id FROM due, retry WHERE retry.id IS NULL OR due.id = retry.id
)
UPDATE inbox_event AS e
SET status = 'running', attempts = e.attempts + 1, claim_gen = %(generation)s::bigint,
    updated = %(now)s::timestamptz
FROM chosen
WHERE e.id = chosen.id
RETURNING e.id, e.inbox_id, e.source, e.source_id, e.payload, e.status, e.attempts,
    e.claim_gen, e.error, e.available_at, e.created, e.updated,
    (SELECT state FROM inbox_session WHERE inbox_id = %(inbox)s::bigint)
"""


def renew(inbox, holder, generation, now=None) -> bool:
    """Extend a live lease by one TTL; False if (holder, generation) no longer holds it."""
    _require_run(holder, generation)
    inbox_id = Inbox.objects.pk_of(inbox)
    now = clock.resolve(now)
    renewed = Lease.objects.filter(
        inbox_id=inbox_id, holder=holder, generation=generation, until__gte=now
    ).update(until=now + lease_ttl())
    return renewed == 1


def release(inbox, holder, generation) -> bool:
    """Give the lease up early; a no-op (False) once somebody else's generation holds it."""
    _require_run(holder, generation)
    inbox_id = Inbox.objects.pk_of(inbox)
    released = Lease.objects.filter(
        inbox_id=inbox_id, holder=holder, generation=generation, until__isnull=False
    ).update(until=None)
    return released == 1


def claim_batch(inbox, holder, generation, now=None) -> list[Event]:
    """Claim the work for one run, oldest first; [] unless (holder, generation) holds the lease.

    Rows left running by an older generation go back to pending, after their backoff: their
    worker lost the lease mid-run. Pending rows out of attempts are parked as dead. A due
    retry is claimed alone, so a poison event cannot take healthy events down with it, and
    healthy events are claimed while a retry waits for its backoff.
    """
    _require_run(holder, generation)
    _given_now(now)
    inbox = Inbox.objects.resolve(inbox)
    with transaction.atomic():
        now = clock.resolve(now)
        lease = _locked_lease(inbox.pk)
        if not lease.is_held_by(holder, generation, now):
            return []
        _settle_leftovers(inbox.pk, generation, now)
        due = Event.objects.filter(inbox=inbox).pending().due(now)
        retry = due.filter(attempts__gt=0).order_by("id").values_list("id", flat=True).first()
        ids = [retry] if retry else list(due.values_list("id", flat=True))
        Event.objects.filter(pk__in=ids).update(
            status=Event.Status.RUNNING,
            attempts=F("attempts") + 1,
            claim_gen=generation,
            updated=now,
        )
        if not ids:
            lease.recount_work()
        return list(Event.objects.filter(pk__in=ids).order_by("id"))


def _settle_leftovers(inbox_id, generation, now):
    """Before a claim, under the lease row's lock: rows left running by an older generation
    go back to pending after their backoff, and pending rows out of attempts are parked."""
    events = Event.objects.filter(inbox_id=inbox_id)
    orphans = list(
        events.orphaned_by(generation).values_list("pk", "claim_gen", "attempts", "updated")
    )
    if orphans:
        # One UPDATE; the backoff is drawn per row, as a retry's is.
        events.filter(pk__in=[pk for pk, *_ in orphans]).update(
            status=Event.Status.PENDING,
            error=_per_row(
                (pk, f"worker lost its lease during the run (generation {gen})")
                for pk, gen, _, _ in orphans
            ),
            # The attempt started when it was claimed; its backoff runs from then.
            available_at=_per_row(
                (pk, updated + retry_delay(attempts)) for pk, _, attempts, updated in orphans
            ),
            updated=now,
        )
    max_attempts = settings.ALWAYSON_MAX_ATTEMPTS
    going_dead = list(events.out_of_attempts(max_attempts))
    if going_dead:
        # Before parking: the receivers see each event's last error, and their writes
        # (the owner's alert) join this transaction.
        events_dead.send(
            sender=Event, inbox_id=inbox_id, generation=generation, events=going_dead, now=now
        )
        events.filter(pk__in=[event.pk for event in going_dead]).update(
            status=Event.Status.DEAD,
            error=_per_row(
                (event.pk, _dead_reason(event.error, max_attempts)) for event in going_dead
            ),
            updated=now,
        )


def _per_row(values):
    """A value per primary key, for one UPDATE of many rows (CASE id WHEN ... THEN ...)."""
    return Case(*(When(pk=pk, then=Value(value)) for pk, value in values))


def _require_run(holder, generation):
    """A run's (holder, generation), checked before the fence compares them: a mistyped
    one would only ever be fenced off, silently. None is acquire()'s "not yours": fenced
    off like any generation that does not hold the lease."""
    require_key("holder", holder, HOLDER_MAX)
    if generation is not None:
        require_int("generation", generation)


def _dead_reason(last_error, max_attempts):
    reason = f"too many attempts ({max_attempts})"
    return f"{reason}; last error: {last_error}" if last_error else reason


@dataclass(frozen=True)
class Defer:
    """A run that could not do its work yet, through no fault of its events (a spent budget,
    a service that is down): the events go back to pending, claimable again at `until` (or
    `delay` after the finish), with `reason` as their error, and the attempt their claim
    counted is given back, so waiting never makes an event dead.
    """

    reason: str
    until: datetime | None = None
    delay: timedelta | None = None

    def __post_init__(self):
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError(f"reason must be a non-empty string, not {self.reason!r}")
        require_text("reason", self.reason)
        if (self.until is None) == (self.delay is None):
            raise ValueError("defer: give either until (a datetime) or delay, not both or none")
        if self.until is not None and (
            not isinstance(self.until, datetime) or self.until.tzinfo is None
        ):
            raise ValueError(f"until must be an aware datetime, not {self.until!r}")
        if self.delay is not None:
            delay = require_duration("delay", self.delay)
            if delay < timedelta(0):
                raise ValueError(f"delay must not be negative, not {self.delay!r}")
            object.__setattr__(self, "delay", delay)

    def available_at(self, now) -> datetime:
        return max(now, self.until) if self.until is not None else now + self.delay


def finish(
    inbox,
    holder,
    generation,
    event_ids: Iterable[int],
    effects: Iterable[Effect] = (),
    error: str | None = None,
    now=None,
    defer: Defer | None = None,
    release: bool = False,
) -> bool:
    """Record a run's outcome, and commit what it produced, in one fenced transaction.

    Refused (False, nothing written) unless (holder, generation) still holds the lease and
    every event is still running under that generation. With `error`, the events go back to
    pending after a backoff, with the error, and the effects are dropped; the attempt was
    counted at claim. With `defer`, the events go back to pending until the deferral's time
    with their attempt given back, and the effects commit (a notice, the session state).
    With `release`, the lease is given up in the same transaction (not when refused).
    """
    if error and defer is not None:
        raise ValueError("finish: a run ends with an error or a deferral, not both")
    if error is not None:
        require_text("error", error)
    if defer is not None and not isinstance(defer, Defer):
        raise ValueError(f"defer must be a Defer, not {type(defer).__name__}")
    run, effects = _checked_run(inbox, holder, generation, event_ids, effects, now)
    if connection.vendor == "postgresql" and not error and defer is None:
        return _finish_done_pg(inbox, run, effects, release)[0]
    inbox_id, event_ids, now = run["inbox"], run["ids"], run["now"]
    with transaction.atomic():
        now = _fence(inbox, inbox_id, holder, generation, now, release)
        if now is None:
            return False
        if error or defer is not None:
            claimed = Event.objects.running().filter(
                inbox_id=inbox_id, pk__in=event_ids, claim_gen=generation
            )
        if error:
            attempts = list(claimed.values_list("pk", "attempts"))
            finished = (
                claimed.update(
                    status=Event.Status.PENDING,
                    error=error,
                    available_at=_per_row((pk, now + retry_delay(n)) for pk, n in attempts),
                    updated=now,
                )
                if attempts
                else 0
            )
        elif defer is not None:
            finished = claimed.update(
                status=Event.Status.PENDING,
                error=defer.reason,
                available_at=defer.available_at(now),
                # Claimed means counted; a deferral is not the events' failure.
                attempts=Greatest(F("attempts") - 1, 0),
                updated=now,
            )
        else:
            finished = _finish_done(inbox_id, generation, event_ids, now)
        if finished != len(event_ids):
            # A second finish of the same claim, or ids that were never claimed by this
            # generation: refuse the whole run rather than commit its effects twice.
            transaction.set_rollback(True)
            return False
        _recount_work(inbox_id)
        if not error:
            for effect in effects:
                effect(now)
        return True


def _fence(inbox, inbox_id, holder, generation, now, release):
    """Lock the lease row and check, under that lock, that (holder, generation) holds it;
    with `release`, give the lease up in the same write (one statement on PostgreSQL). The
    fence's `now`, or None if refused."""
    if connection.vendor == "postgresql":
        with store.prepared_cursor() as cursor:
            # The lease row by its primary key, locked first whoever holds it, then checked.
            cursor.execute(_FENCE_SQL, [now, inbox_id, release, holder, generation])
            row = cursor.fetchone()
        if row is not None:
            return row[0]
    else:
        now = clock.resolve(now)
        lease = _locked_lease(inbox_id)
        if lease.is_held_by(holder, generation, now):
            if release:
                lease.until = None
                lease.save(update_fields=["until"])
            return now
    if not Lease.objects.filter(inbox_id=inbox_id).exists():
        raise UnknownInbox(inbox)
    return None


def _finish_done(inbox_id, generation, event_ids, now) -> int:
    """Mark the run's events done (SQLite; PostgreSQL's is _finish_done_pg)."""
    return (
        Event.objects.running()
        .filter(inbox_id=inbox_id, pk__in=event_ids, claim_gen=generation)
        .update(status=Event.Status.DONE, error="", updated=now)
    )


def finish_and_take(
    inbox, holder, generation, event_ids: Iterable[int], effects: Iterable[Effect] = (), now=None
) -> tuple[bool, Claim | None]:
    """finish(..., release=True) of a run that ended well, then take_next(holder): whether
    the finish was accepted, and the next claim (None when there is no work; it may also be
    None after a refused finish, which the caller then follows with take_next).

    On PostgreSQL the take is a statement of the finish's own transaction, after the finish
    (one commit and, without effects, one round trip for both): the take then sees the
    finish's recount and may pick the same inbox again. The finish's lease row is locked
    first and waited for; the take's is taken under SKIP LOCKED and never waited for, so
    holding both cannot deadlock.
    """
    if connection.vendor != "postgresql":
        finished = finish(inbox, holder, generation, event_ids, effects, now=now, release=True)
        return finished, take_next(holder, now) if finished else None
    run, effects = _checked_run(inbox, holder, generation, event_ids, effects, now)
    take = _take_statement(holder, run["now"])
    finished, rows = _finish_done_pg(inbox, run, effects, True, take)
    return finished, take.claim(rows)


def _checked_run(inbox, holder, generation, event_ids, effects, now) -> tuple[dict, list]:
    """A finish's run checked before anything is locked: its inbox id, holder, generation,
    `now` and sorted event ids (the finish statements' parameters), and its effects."""
    _require_run(holder, generation)
    event_ids = sorted(set(require_ids("event_ids", event_ids)))
    effects = _require_effects(effects)
    run = {"holder": holder, "generation": generation, "ids": event_ids, "now": _given_now(now)}
    return {**run, "inbox": Inbox.objects.pk_of(inbox)}, effects


def _finish_done_pg(inbox, run, effects, release, take=None) -> tuple[bool, list]:
    """A run that ended well, on PostgreSQL: the lease row locked (_LOCK_SQL), then one
    statement that checks the fence, marks the events done, recounts the work and gives the
    lease back, all or nothing (_FINISH_DONE_SQL), then the effects; one transaction.

    Without effects, and outside a caller's transaction, the four (BEGIN, the lock, the
    finish, COMMIT) go in one pipeline: one round trip. The finish still runs after the lock
    is granted, so its snapshot holds every event committed before, as the recount needs,
    and it writes nothing when refused, so committing blind is safe.

    Whether the finish was accepted, and the rows of `take` (a _Take run in the same
    transaction), [] without one.
    """
    params = {**run, "count": len(run["ids"]), "release": release}
    if effects or connection.in_atomic_block or not psycopg.Pipeline.is_supported():
        with transaction.atomic():
            locked, (now, ok) = _lock_and_finish(params)
            if locked is None:
                raise UnknownInbox(inbox)
            if not ok:
                return False, []
            for effect in effects:
                effect(now)
            if take is None:
                return True, []
            with store.prepared_cursor() as cursor:
                cursor.execute(take.sql, take.params)
                return True, cursor.fetchall()
    connection.ensure_connection()
    raw = connection.connection
    try:
        with connection.wrap_database_errors, raw.pipeline():
            raw.execute("BEGIN", prepare=False)
            locked, finished = _lock_and_finish(params, fetch=False)
            if take is not None:
                taken = store.prepared_cursor()
                taken.execute(take.sql, take.params)
            raw.execute("COMMIT", prepare=False)
    except BaseException:
        # The pipeline stopped at the error: COMMIT was never run.
        status = psycopg.pq.TransactionStatus
        if not raw.broken and raw.info.transaction_status in (status.INTRANS, status.INERROR):
            with connection.wrap_database_errors:
                raw.execute("ROLLBACK", prepare=False)
        raise
    if locked.fetchone() is None:
        raise UnknownInbox(inbox)
    ok = finished.fetchone()[1]
    # The take committed whether or not the finish was accepted: its claim stands either way.
    return ok, taken.fetchall() if take is not None else []


def _lock_and_finish(params, fetch=True):
    """Send _LOCK_SQL then _FINISH_DONE_SQL: their rows, or (in a pipeline) their cursors."""
    lock, finish = store.prepared_cursor(), store.prepared_cursor()
    lock.execute(_LOCK_SQL, [params["inbox"]])
    finish.execute(_FINISH_DONE_SQL, params)
    if not fetch:
        return lock, finish
    return lock.fetchone(), finish.fetchone()


# The lease row by its primary key, locked first whoever holds it (then checked).
_LOCK_SQL = "SELECT inbox_id FROM inbox_lease WHERE inbox_id = %s::bigint FOR UPDATE"

# After _LOCK_SQL, in a statement of its own, so that its snapshot includes every event
# committed before the lock was granted (later ones wait for it): the fence, then, only if
# the lease is held and every event is still running under this generation, the events done
# (by event_running_idx or the primary key), the work recounted (by event_pending_idx: the
# done rows leave the pending set as the snapshot has it) and the lease given back.
_FINISH_DONE_SQL = """
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now),
held AS (
    SELECT l.inbox_id FROM inbox_lease AS l, clock
    WHERE l.inbox_id = %(inbox)s::bigint AND l.holder = %(holder)s::text
      AND l.generation = %(generation)s::bigint AND l.until >= clock.now
),
claimed AS (
    SELECT e.id FROM inbox_event AS e, held
    WHERE e.inbox_id = held.inbox_id AND e.status = 'running'
      AND e.claim_gen = %(generation)s::bigint AND e.id = ANY(%(ids)s::bigint[])
),
whole AS (
    SELECT EXISTS (SELECT 1 FROM held)
        AND (SELECT count(*) FROM claimed) = %(count)s::int AS ok
),
done AS (
    UPDATE inbox_event AS e SET status = 'done', error = '', updated = clock.now
    FROM claimed, whole, clock
    WHERE e.id = claimed.id AND e.status = 'running' AND whole.ok
),
lease AS (
    UPDATE inbox_lease AS l
    SET until = CASE WHEN %(release)s::boolean THEN NULL ELSE l.until END,
        work_at = (SELECT min(available_at) FROM inbox_event
                   WHERE inbox_id = l.inbox_id AND status = 'pending')
    FROM whole
    WHERE l.inbox_id = %(inbox)s::bigint AND whole.ok
)
SELECT clock.now, whole.ok FROM clock, whole
"""


_FENCE_SQL = """
WITH clock AS (SELECT COALESCE(%s::timestamptz, clock_timestamp()) AS now),
locked AS (
    SELECT inbox_id, holder, generation, until FROM inbox_lease
    WHERE inbox_id = %s::bigint FOR UPDATE
)
UPDATE inbox_lease AS l SET until = CASE WHEN %s::boolean THEN NULL ELSE l.until END
FROM locked, clock
WHERE l.inbox_id = locked.inbox_id
  AND locked.holder = %s::text AND locked.generation = %s::bigint AND locked.until >= clock.now
RETURNING clock.now
"""


def _recount_work(inbox_id):
    Lease(inbox_id=inbox_id).recount_work()


def _require_effects(effects) -> list:
    """Checked before the fence: an effect that is not callable would fail inside the
    transaction, after the events were marked done."""
    if callable(effects) or isinstance(effects, str | bytes | dict) or effects is None:
        raise ValueError(f"effects must be a list of callables, not {type(effects).__name__}")
    effects = list(effects)
    for n, effect in enumerate(effects):
        if not callable(effect):
            raise ValueError(f"effects[{n}] is not callable: {type(effect).__name__}")
    return effects


@dataclass(frozen=True)
class SaveState:
    """The run's session state as an effect: replaced only when the run's finish commits."""

    inbox_id: int
    state: dict

    def __call__(self, now):
        require_json("state", self.state)
        # The row exists from the inbox's creation (Inbox.save); one UPDATE, no read first.
        saved = Session.objects.filter(inbox_id=self.inbox_id).update(state=self.state, updated=now)
        if not saved:
            Session.objects.create(inbox_id=self.inbox_id, state=self.state, updated=now)


def requeue(event_ids: Iterable[int], now=None) -> int:
    """Put dead events back to pending with their attempts reset; the number requeued."""
    return len(requeue_ids(event_ids, now))


def requeue_ids(event_ids: Iterable[int], now=None) -> list[int]:
    """requeue, answering which events it put back (the admin's history names each)."""
    event_ids = require_ids("event_ids", event_ids)
    now = clock.resolve(now)
    requeued = []
    by_inbox = {}
    for pk, inbox_id in Event.objects.dead().filter(pk__in=event_ids).values_list("pk", "inbox_id"):
        by_inbox.setdefault(inbox_id, []).append(pk)
    for inbox_id, ids in sorted(by_inbox.items()):
        with transaction.atomic():
            lease = _locked_lease(inbox_id)
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
                _notify_work(inbox_id)
            requeued += ids
    return requeued


def mark_dead(event_ids: Iterable[int], reason: str, now=None) -> int:
    """Park pending events as dead by hand (an operator's decision); the number parked."""
    return len(mark_dead_ids(event_ids, reason, now))


def mark_dead_ids(event_ids: Iterable[int], reason: str, now=None) -> list[int]:
    """mark_dead, answering which events it parked (the admin's history names each)."""
    require_key("reason", reason)
    event_ids = require_ids("event_ids", event_ids)
    now = clock.resolve(now)
    parked = []
    inbox_ids = set(
        Event.objects.pending().filter(pk__in=event_ids).values_list("inbox_id", flat=True)
    )
    for inbox_id in sorted(inbox_ids):
        with transaction.atomic():
            lease = _locked_lease(inbox_id)
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
