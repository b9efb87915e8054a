"""How a finish ends a run: Done, Failed or Defer, one value each, so a run cannot end with
an error and a deferral at once. Each says what it does to the run's events (called inside
the fenced transaction with the events still claimed, it answers how many it wrote), whether
the run's effects commit with it, and the word and error its run's record is written with
(RunRecord.Outcome, the one vocabulary of the records, the pages, the worker's log line, its
span and the metrics).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F
from django.db.models.functions import Greatest

from .models import Event, RunRecord
from .rules import per_row, retry_delay
from .validation import require_duration, require_text


@dataclass(frozen=True)
class Done:
    """A run that ended well: its events done, its effects committed."""

    outcome = RunRecord.Outcome.DONE
    commits_effects = True

    @property
    def error(self) -> str:
        return ""

    def __call__(self, claimed, now) -> int:
        return claimed.update(status=Event.Status.DONE, error="", updated=now)


DONE = Done()


@dataclass(frozen=True)
class Failed:
    """A run that raised, or whose effects could not commit: its events back to pending after
    each one's backoff, with `error`; the attempt was counted at claim. Its effects are
    dropped."""

    error: str
    outcome = RunRecord.Outcome.ERROR
    commits_effects = False

    def __post_init__(self):
        require_text("error", self.error)
        if not self.error:
            raise ValueError("error must be a non-empty string")

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
class Defer:
    """A run that could not do its work yet, through no fault of its events (a spent budget,
    a service that is down): the events go back to pending, claimable again at `until` (or
    `delay` after the finish), with `reason` as their error, and the attempt their claim
    counted is given back, so waiting never makes an event dead. Its effects commit (a
    notice, the session state).
    """

    reason: str
    until: datetime | None = None
    delay: timedelta | None = None
    outcome = RunRecord.Outcome.DEFERRED
    commits_effects = True

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

    @property
    def error(self) -> str:
        return self.reason

    def available_at(self, now) -> datetime:
        return max(now, self.until) if self.until is not None else now + self.delay

    def __call__(self, claimed, now) -> int:
        return claimed.update(
            status=Event.Status.PENDING,
            error=self.reason,
            available_at=self.available_at(now),
            # Claimed means counted; a deferral is not the events' failure.
            attempts=Greatest(F("attempts") - 1, 0),
            updated=now,
        )


Ending = Done | Failed | Defer


def require_ending(ending) -> Ending:
    if not isinstance(ending, Done | Failed | Defer):
        raise ValueError(f"a run ends Done, Failed or Defer, not {type(ending).__name__}")
    return ending
