"""The interface of a database backend, and the portable form of each operation.

Every method works on one inbox under its lease row's lock, the lock order of every writer
(inbox/services.py). The forms here are Django's ORM and hold on any database; SQLite runs
them as they are. A backend that states a rule in statements of its own overrides every
method that states it (PostgreSQL: backends/postgresql.py), so that no rule has two homes
on one database.
"""

from contextlib import contextmanager

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from ..exceptions import InboxBusy, UnknownInbox
from ..models import Event, EventTrace, Inbox, Lease, Session
from ..outcomes import DONE
from ..records import claimed_times, write_finished, write_lost
from ..rules import HOLDER_MAX, Claim, lease_ttl, per_row, retry_delay
from ..signals import events_dead
from ..store import Stored
from ..validation import require_key


class Backend:
    # --- the clock, cursors, wake-ups and bounded waits ------------------------------------

    def database_now(self):
        """The clock every operation compares against (inbox/clock.py)."""
        return timezone.now()

    def at(self, now):
        """`now` as the operation handed it (inbox/clock.py `in_statement`: checked, the
        pin applied), or else this database's clock."""
        return self.database_now() if now is None else now

    def cursor(self):
        """A cursor for statements that run on every worker cycle."""
        return connection.cursor()

    def notify_work(self, inbox_id):
        """Wake an idle worker for this inbox's new work, at commit; nothing listens here."""

    @contextmanager
    def bounded(self, wait: float | None):
        """A transaction whose wait for an inbox's lock ends after `wait` seconds (None: the
        database's own timeouts) with an error out_of_time recognises."""
        with transaction.atomic():
            yield

    def out_of_time(self, exc, wait: float) -> str | None:
        """Why the database error `exc` (Django's) means the work could not reach the inbox
        in time, rolled back whole (InboxBusy's reason); None for any other error, which
        stays an error (a lost connection among them)."""
        raise NotImplementedError

    @contextmanager
    def lease_statements(self):
        """A transaction for a worker's lease statements (a take and its claim, a renewal, a
        release), none of which may hang: each is bounded by ALWAYSON_LEASE_STATEMENT_TIMEOUT.
        Here, the wait for the write lock (`bounded`); PostgreSQL bounds each statement."""
        with self.bounded(settings.ALWAYSON_LEASE_STATEMENT_TIMEOUT):
            yield

    @contextmanager
    def bounded_write(self, inbox_id, wait: float | None):
        """`bounded(wait)`, with a lock wait that ran out raised as InboxBusy (inbox/locks.py)."""
        try:
            with self.bounded(wait):
                yield
        except OperationalError as exc:
            reason = None if wait is None else self.out_of_time(exc, wait)
            if reason:
                raise InboxBusy(inbox_id, wait, reason) from exc
            raise

    def write_in_one(self, ref, sql, params, wait):
        """A whole write as one statement of its own (a database function): PostgreSQL's
        (postgresql.py); elsewhere the caller takes its portable path."""
        raise NotImplementedError(f"{type(self).__name__} runs no database functions")

    def lock_timeout(self, wait):
        raise NotImplementedError(f"{type(self).__name__} runs no database functions")

    @contextmanager
    def locked_write(self, ref, wait: float | None, now, then=()):
        """bounded_write on the inbox `ref` (an Inbox, its id or its slug) with its lock taken
        first, `now` resolved once it is granted, then the reads `then` ((sql, params)):
        yields (the inbox's id, now, the rows of each read). UnknownInbox for no such inbox
        (inbox/locks.py)."""
        inbox_id = Inbox.objects.pk_of(ref)
        with self.bounded_write(inbox_id, wait):
            try:
                self.lock(inbox_id)
            except Lease.DoesNotExist:
                raise UnknownInbox(ref) from None
            yield inbox_id, self.at(now), [self.read(statement) for statement in then]

    def read(self, statement) -> list:
        """The rows one statement (sql, params) answers."""
        with connection.cursor() as cursor:
            cursor.execute(*statement)
            return cursor.fetchall()

    def write(self, statement) -> None:
        """Run one statement (sql, params) that answers nothing the caller reads."""
        with connection.cursor() as cursor:
            cursor.execute(*statement)

    # --- storing events ----------------------------------------------------------------------

    def store(self, ref, rows, now, lock_wait, text=None, trace="") -> tuple[int, list[Stored]]:
        """Store validated rows ((source, source_id, payload), keys distinct) in inbox `ref`,
        mark its work and wake a worker: the inbox's id and the rows stored. `now` None: the
        database's clock. `lock_wait` bounds the wait for the lease row (InboxBusy past it).
        `text`: a single row's payload as JSON already. `trace`: the traceparent of the
        request storing them (tracing on), written with the rows stored (store_traces)."""
        raise NotImplementedError

    def store_traces(self, stored, trace):
        """In the insert's transaction: each stored event's trace context (EventTrace)."""
        if trace and stored:
            EventTrace.objects.bulk_create(
                [EventTrace(event_id=row.id, traceparent=trace) for row in stored]
            )

    # --- leases ------------------------------------------------------------------------------

    def lock(self, inbox_id) -> Lease:
        """The inbox's lease row, locked for the rest of the transaction."""
        return Lease.objects.select_for_update().get(inbox_id=inbox_id)

    def acquire(self, ref, holder, now) -> int | None:
        inbox = Inbox.objects.resolve(ref)
        with self.lease_statements():
            now = self.at(now)
            return self.lock(inbox.pk).take(holder, now, lease_ttl())

    def acquire_next(self, holder, now) -> tuple[int, int] | None:
        with self.lease_statements():
            now = self.at(now)
            lease = (
                Lease.objects.with_work(now)
                .select_for_update(skip_locked=True)
                .order_by("work_at")
                .first()
            )
            if lease is None:
                return None
            return lease.inbox_id, lease.take(holder, now, lease_ttl())

    def renew(self, inbox_id, holder, generation, now) -> bool:
        with self.lease_statements():
            now = self.at(now)
            renewed = Lease.objects.filter(
                inbox_id=inbox_id, holder=holder, generation=generation, until__gte=now
            ).update(until=now + lease_ttl())
        return renewed == 1

    def release(self, inbox_id, holder, generation) -> bool:
        with self.lease_statements():
            released = Lease.objects.filter(
                inbox_id=inbox_id, holder=holder, generation=generation, until__isnull=False
            ).update(until=None)
        return released == 1

    def fence(self, ref, inbox_id, holder, generation, now, release):
        """Lock the lease row and check, under that lock, that (holder, generation) holds it;
        with `release`, give the lease up in the same transaction. The fence's `now`, or
        None if refused."""
        now = self.at(now)
        lease = self.lock(inbox_id)
        if lease.is_held_by(holder, generation, now):
            if release:
                lease.until = None
                lease.save(update_fields=["until"])
            return now
        return self.refused(ref, inbox_id)

    def refused(self, ref, inbox_id):
        """A refused fence: None, or UnknownInbox when the inbox is gone."""
        if not Lease.objects.filter(inbox_id=inbox_id).exists():
            raise UnknownInbox(ref)
        return None

    def recount_work(self, inbox_id):
        Lease(inbox_id=inbox_id).recount_work()

    # --- claims ------------------------------------------------------------------------------

    def claim_batch(self, inbox, holder, generation, now) -> list[Event]:
        """Fenced: the leftovers settled, then the batch claimed; [] when refused."""
        with self.lease_statements():
            now = self.fence(inbox, inbox.pk, holder, generation, now, release=False)
            if now is None:
                return []
            self.settle_leftovers(inbox.pk, generation, now)
            events = self.claim(inbox, generation, now)
            if not events:
                self.recount_work(inbox.pk)
            return events

    def claim(self, inbox, generation, now) -> list[Event]:
        """The batch, under the fence: the due pending events, oldest first, or the oldest
        due retry alone."""
        due = Event.objects.filter(inbox=inbox).claimable(now)
        retry = due.filter(attempts__gt=0).order_by("id").values_list("id", flat=True).first()
        ids = [retry] if retry else list(due.values_list("id", flat=True))
        return self.mark_claimed(ids, generation, now)

    def mark_claimed(self, ids, generation, now) -> list[Event]:
        """What a claim writes, a batch's or a join's: the chosen events running under
        `generation`, each attempt counted. Oldest first."""
        Event.objects.filter(pk__in=ids).pending().update(
            status=Event.Status.RUNNING,
            attempts=F("attempts") + 1,
            claim_gen=generation,
            updated=now,
        )
        return list(Event.objects.filter(pk__in=ids).order_by("id"))

    def claim_more(self, inbox, holder, generation, sources, now) -> list[Event] | None:
        """A run's join, fenced: None when (holder, generation) no longer holds the lease,
        else the fresh due events of `sources`, claimed under the run's generation."""
        with self.lease_statements():
            now = self.fence(inbox, inbox.pk, holder, generation, now, release=False)
            if now is None:
                return None
            return self.claim_fresh(inbox, generation, sources, now)

    def claim_fresh(self, inbox, generation, sources, now) -> list[Event]:
        """The join's choice, under the fence: due pending events of `sources` never attempted,
        oldest first."""
        fresh = Event.objects.filter(inbox=inbox, source__in=sources).claimable(now).fresh()
        return self.mark_claimed(list(fresh.values_list("id", flat=True)), generation, now)

    def settle_leftovers(self, inbox_id, generation, now):
        """Before a claim, under the lease row's lock: rows left running by an older
        generation go back to pending after their backoff, and pending rows out of attempts
        are parked. The one form on every database: the backoff is drawn here, per row, and
        events_dead's receivers get the rows as they were."""
        events = Event.objects.filter(inbox_id=inbox_id)
        orphans = list(
            events.orphaned_by(generation).values_list("pk", "claim_gen", "attempts", "updated")
        )
        if orphans:
            # The worker that claimed them is gone from the lease row by now (this take
            # holds it): a late finish of that worker names itself (write_refused).
            write_lost(inbox_id, orphans, "", now)
            events.filter(pk__in=[pk for pk, *_ in orphans]).update(
                status=Event.Status.PENDING,
                error=per_row(
                    (pk, f"worker lost its lease during the run (generation {gen})")
                    for pk, gen, _, _ in orphans
                ),
                # The attempt started when it was claimed; its backoff runs from then.
                available_at=per_row(
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
                error=per_row(
                    (event.pk, _dead_reason(event.error, max_attempts)) for event in going_dead
                ),
                updated=now,
            )

    def take_next(self, holder, now) -> Claim | None:
        """acquire_next and claim_batch in one transaction; the lease given back when the
        inbox had nothing claimable after all."""
        require_key("holder", holder, HOLDER_MAX)  # as acquire_next checks it
        with self.lease_statements():
            taken = self.acquire_next(holder, now)
            if taken is None:
                return None
            inbox_id, generation = taken
            inbox = Inbox.objects.get(pk=inbox_id)
            events = self.claim_batch(inbox, holder, generation, now)
            if not events:
                self.release(inbox_id, holder, generation)
                return Claim(inbox, generation, [], None)
            state = Session.objects.filter(inbox_id=inbox_id).values_list("state", flat=True)
            return Claim(inbox, generation, events, state.first())

    # --- finishing a run ---------------------------------------------------------------------

    def finish(self, ref, run, effects, release, outcome) -> bool:
        """A run's end in one fenced transaction: `outcome(claimed, now)` (Done, Failed or
        Defer, inbox/outcomes.py) writes the run's
        events (a queryset of them, still running under the run's generation) and answers
        how many it wrote; anything but all of them refuses the whole run. Then the work is
        recounted and the effects run."""
        with transaction.atomic():
            inbox_id, generation = run["inbox"], run["generation"]
            now = self.fence(ref, inbox_id, run["holder"], generation, run["now"], release)
            if now is None:
                return False
            claimed = Event.objects.running().filter(
                inbox_id=inbox_id, pk__in=run["ids"], claim_gen=generation
            )
            claim_times = claimed_times(run, claimed)
            if outcome(claimed, now) != len(run["ids"]):
                # A second finish of the same claim, or ids that were never claimed by this
                # generation: refuse the whole run rather than commit its effects twice.
                transaction.set_rollback(True)
                return False
            write_finished(run, claim_times, outcome.outcome, outcome.error, now)
            self.recount_work(inbox_id)
            for effect in effects:
                effect(now)
            return True

    def finish_done(self, ref, run, effects, release) -> bool:
        """finish of a run that ended well: its events done."""
        return self.finish(ref, run, effects, release, DONE)

    def finish_and_take(self, ref, run, effects) -> tuple[bool, Claim | None]:
        """finish_done with release, then take_next for the same holder."""
        finished = self.finish_done(ref, run, effects, release=True)
        return finished, self.take_next(run["holder"], run["now"]) if finished else None


def _dead_reason(last_error, max_attempts):
    reason = f"too many attempts ({max_attempts})"
    return f"{reason}; last error: {last_error}" if last_error else reason
