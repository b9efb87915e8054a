"""What every operation on an inbox shares and no database states: the reserved sources,
the keys' widths, the lease's length, the retry's backoff, the checks of a run's identity,
and the values the operations hand back (Claim, Effect).
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Case, Value, When

from .models import Event, Inbox, Lease
from .validation import require_ids, require_int, require_key

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


def require_run(holder, generation):
    """A run's (holder, generation), checked before the fence compares them: a mistyped
    one would only ever be fenced off, silently. None is acquire()'s "not yours": fenced
    off like any generation that does not hold the lease."""
    require_key("holder", holder, HOLDER_MAX)
    if generation is not None:
        require_int("generation", generation)


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


def per_row(values):
    """A value per primary key, for one UPDATE of many rows (CASE id WHEN ... THEN ...)."""
    return Case(*(When(pk=pk, then=Value(value)) for pk, value in values))


@dataclass
class Claim:
    """What take_next took: an inbox's lease and the batch claimed under it, with the
    session state the run resumes from. `events` is empty when the inbox had nothing
    claimable after all; the lease is then already given back."""

    inbox: Inbox
    generation: int
    events: list[Event]
    state: dict | None
    # What extensions.claim_extras read with the take, by name; empty where the take could not.
    extras: dict = field(default_factory=dict)

    def held_by(self, holder) -> "Held":
        """What the run of this claim holds, run by `holder`."""
        return Held(
            self.inbox.pk,
            holder,
            self.generation,
            [event.pk for event in self.events],
            min((event.updated for event in self.events), default=None),
        )


@dataclass(frozen=True)
class Held:
    """What a run holds: the lease of `inbox` (an Inbox, its id or its slug) as (holder,
    generation), the events it claimed under it, sorted, and when it claimed them (their
    `updated` at the claim; None when not known). Checked when made: a mistyped holder or
    generation would only ever be fenced off, silently."""

    inbox: object
    holder: str
    generation: int | None
    event_ids: tuple[int, ...]
    claimed_at: datetime | None = None

    def __post_init__(self):
        require_run(self.holder, self.generation)
        ids = tuple(sorted(set(require_ids("event_ids", self.event_ids))))
        object.__setattr__(self, "event_ids", ids)
