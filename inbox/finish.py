"""A run's end: finish (done, failed or deferred, with what the run produced), and
finish_and_take for a worker that goes straight on to its next claim. Every finish is
fenced: it commits only while (holder, generation) still holds the lease and every event is
still running under that generation, so a worker that was only slow cannot finish a run
somebody else took over.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F
from django.db.models.functions import Greatest

from . import clock
from .backends import current
from .models import Event, Inbox, Session
from .records import record_values, write_refused
from .rules import Claim, Effect, per_row, require_run, retry_delay
from .validation import require_duration, require_ids, require_json, require_text


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
    produced: dict | None = None,
    trace: str = "",
) -> bool:
    """Record a run's outcome, and commit what it produced, in one fenced transaction.

    Refused (False, nothing written) unless (holder, generation) still holds the lease and
    every event is still running under that generation. With `error`, the events go back to
    pending after a backoff, with the error, and the effects are dropped; the attempt was
    counted at claim. With `defer`, the events go back to pending until the deferral's time
    with their attempt given back, and the effects commit (a notice, the session state).
    With `release`, the lease is given up in the same transaction (not when refused).

    The run's RunRecord commits with it (ALWAYSON_RUN_RECORDS): what the run `produced` as
    its runtime counts it, and the `trace` (traceparent) of its span.
    """
    if error and defer is not None:
        raise ValueError("finish: a run ends with an error or a deferral, not both")
    if error is not None:
        require_text("error", error)
    if defer is not None and not isinstance(defer, Defer):
        raise ValueError(f"defer must be a Defer, not {type(defer).__name__}")
    run, effects = _checked_run(inbox, holder, generation, event_ids, effects, now, produced, trace)
    if error:
        return current().finish(inbox, run, [], release, _Failed(error))
    if defer is not None:
        return current().finish(inbox, run, effects, release, _Deferred(defer))
    return current().finish_done(inbox, run, effects, release)


def finish_and_take(
    inbox,
    holder,
    generation,
    event_ids: Iterable[int],
    effects: Iterable[Effect] = (),
    now=None,
    produced: dict | None = None,
    trace: str = "",
) -> tuple[bool, Claim | None]:
    """finish(..., release=True) of a run that ended well, then take_next(holder): whether
    the finish was accepted, and the next claim (None when there is no work; it may also be
    None after a refused finish, which the caller then follows with take_next).

    On PostgreSQL the take is a statement of the finish's own transaction (one commit and,
    without effects, one round trip for both).
    """
    run, effects = _checked_run(inbox, holder, generation, event_ids, effects, now, produced, trace)
    return current().finish_and_take(inbox, run, effects)


@dataclass(frozen=True)
class _Failed:
    """A run's error as a finish's outcome: back to pending after each event's backoff."""

    error: str

    def __call__(self, claimed, now) -> int:
        attempts = list(claimed.values_list("pk", "attempts"))
        if not attempts:
            return 0
        return claimed.update(
            status=Event.Status.PENDING,
            error=self.error,
            available_at=per_row((pk, now + retry_delay(n)) for pk, n in attempts),
            updated=now,
        )


@dataclass(frozen=True)
class _Deferred:
    """A deferral as a finish's outcome: back to pending until its time, the attempt given
    back."""

    defer: Defer

    def __call__(self, claimed, now) -> int:
        return claimed.update(
            status=Event.Status.PENDING,
            error=self.defer.reason,
            available_at=self.defer.available_at(now),
            # Claimed means counted; a deferral is not the events' failure.
            attempts=Greatest(F("attempts") - 1, 0),
            updated=now,
        )


def _checked_run(
    inbox, holder, generation, event_ids, effects, now, produced, trace
) -> tuple[dict, list]:
    """A finish's run checked before anything is locked: its inbox id, holder, generation,
    `now`, sorted event ids and its record's values (the finish statements' parameters),
    and its effects."""
    require_run(holder, generation)
    event_ids = sorted(set(require_ids("event_ids", event_ids)))
    effects = _require_effects(effects)
    run = {
        "holder": holder,
        "generation": generation,
        "ids": event_ids,
        "now": clock.in_statement(now),
    }
    return {
        **run,
        "inbox": Inbox.objects.pk_of(inbox),
        **record_values(produced, trace),
    }, effects


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


def record_refused(inbox_id, generation, holder, events, error="", produced=None, now=None):
    """The record of a run whose finish was refused (or that was fenced off mid-run):
    `events` as it claimed them (their `updated` is the claim time)."""
    now = clock.resolve(now)
    started = min((event.updated for event in events), default=now)
    ids = [event.pk for event in events]
    write_refused(inbox_id, generation, holder, ids, started, now, error, produced)
