"""A run's end: finish (Done, Failed or Defer, with what the run produced), and
finish_and_take for a worker that goes straight on to its next claim. Every finish is
fenced: it commits only while (holder, generation) still holds the lease and every event is
still running under that generation, so a worker that was only slow cannot finish a run
somebody else took over.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from . import clock
from .backends import current
from .models import Inbox, Session
from .outcomes import DONE, Done, Ending, require_ending
from .records import record_values, write_refused
from .rules import Claim, Effect, Held
from .validation import require_json


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
    held: Held,
    effects: Iterable[Effect] = (),
    outcome: Ending = DONE,
    *,
    now=None,
    release: bool = False,
    produced: dict | None = None,
    trace: str = "",
) -> bool:
    """End the run that `held` holds with `outcome` and commit what it produced, with its
    RunRecord, in one fenced transaction: False, nothing written, when the fence refuses.
    The effects commit unless the run Failed. With `release`, the lease is given up in the
    same transaction."""
    outcome = require_ending(outcome)
    run, effects = _checked_run(held, effects, now, produced, trace)
    if isinstance(outcome, Done):
        return current().finish_done(held.inbox, run, effects, release)
    kept = effects if outcome.commits_effects else []
    return current().finish(held.inbox, run, kept, release, outcome)


def finish_and_take(
    held: Held,
    effects: Iterable[Effect] = (),
    *,
    now=None,
    produced: dict | None = None,
    trace: str = "",
) -> tuple[bool, Claim | None]:
    """finish(held, effects, DONE, release=True), then take_next(holder): whether the finish
    was accepted, and the next claim (None after a refused finish too, which the caller
    then follows with take_next). On PostgreSQL one transaction for both."""
    run, effects = _checked_run(held, effects, now, produced, trace)
    return current().finish_and_take(held.inbox, run, effects)


def _checked_run(held, effects, now, produced, trace) -> tuple[dict, list]:
    """A finish's parameters and effects, checked before anything is locked."""
    if not isinstance(held, Held):
        raise ValueError(f"a finish takes what the run holds (a Held), not {type(held).__name__}")
    effects = _require_effects(effects)
    return {
        "holder": held.holder,
        "generation": held.generation,
        "ids": list(held.event_ids),
        "now": clock.in_statement(now),
        "inbox": Inbox.objects.pk_of(held.inbox),
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


def record_refused(held: Held, error="", produced=None, now=None):
    """The record of a run whose finish was refused (or that was fenced off mid-run)."""
    now = clock.resolve(now)
    inbox_id = Inbox.objects.pk_of(held.inbox)
    started = held.claimed_at or now
    write_refused(
        inbox_id, held.generation, held.holder, held.event_ids, started, now, error, produced
    )
