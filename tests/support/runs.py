"""A Run over a real claim, as the worker makes one, and its fenced finish."""

from alwayson.runtime.api import acquire, claim_batch, finish
from alwayson.runtime.run import Run
from inbox.models import Session
from inbox.services import DONE, Failed, Held


def session_state(inbox):
    return Session.objects.get(inbox=inbox).state


def start_run(inbox, holder, now=None) -> Run:
    """Acquire, claim and wrap the batch in a Run, as the worker does."""
    gen = acquire(inbox, holder, now=now)
    assert gen is not None
    events = claim_batch(inbox, holder, gen, now=now)
    return Run(inbox, holder, gen, events, session_state(inbox))


def finish_run(run, now=None, error=None) -> bool:
    ids = [e.pk for e in run.events]
    return finish(
        Held(run.inbox, run.holder, run.generation, ids),
        run.effects(),
        outcome=DONE if error is None else Failed(error),
        now=now,
    )
