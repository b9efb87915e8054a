"""The lease and the claim: who may run an inbox's agent (acquire, renew, release), and the
work a run takes under it (claim_batch, or take_next for both at once; claim_more, what a
run in progress joins). Checked here, run by the database's backend (inbox/backends/).
"""

from . import clock
from .backends import current
from .models import Event, Inbox
from .rules import HOLDER_MAX, SOURCE_MAX, Claim, require_run
from .validation import require_key


def acquire(inbox, holder, now=None) -> int | None:
    """Take or renew the inbox's lease: the generation, or None while another holds it."""
    require_key("holder", holder, HOLDER_MAX)
    return current().acquire(inbox, holder, clock.in_statement(now))


def acquire_next(holder, now=None) -> tuple[int, int] | None:
    """Take the lease of some inbox that has work and no live holder: (inbox_id, generation).

    SKIP LOCKED lets many workers on many hosts look at once without queueing behind each
    other; the row each one locks is an inbox nobody else can take in the meantime.
    """
    require_key("holder", holder, HOLDER_MAX)
    return current().acquire_next(holder, clock.in_statement(now))


def renew(inbox, holder, generation, now=None) -> bool:
    """Extend a live lease by one TTL; False if (holder, generation) no longer holds it."""
    require_run(holder, generation)
    return current().renew(Inbox.objects.pk_of(inbox), holder, generation, clock.in_statement(now))


def release(inbox, holder, generation) -> bool:
    """Give the lease up early; a no-op (False) once somebody else's generation holds it."""
    require_run(holder, generation)
    return current().release(Inbox.objects.pk_of(inbox), holder, generation)


def claim_batch(inbox, holder, generation, now=None) -> list[Event]:
    """Claim the work for one run, oldest first; [] unless (holder, generation) holds the lease.

    Rows left running by an older generation go back to pending, after their backoff: their
    worker lost the lease mid-run. Pending rows out of attempts are parked as dead. A due
    retry is claimed alone, so a poison event cannot take healthy events down with it, and
    healthy events are claimed while a retry waits for its backoff.
    """
    require_run(holder, generation)
    now = clock.in_statement(now)
    return current().claim_batch(Inbox.objects.resolve(inbox), holder, generation, now)


def claim_more(inbox, holder, generation, sources, now=None) -> list[Event] | None:
    """A run's join: the fresh events of `sources` (say, ("chat",)) that arrived since its
    claim, claimed into the run under the lease it holds, oldest first; None when (holder,
    generation) no longer holds the lease (fenced off: the run is lost).

    The claim's rules: each attempt counted, the events running under the run's generation,
    so they end with the run's finish (done with it, or back to pending with its other
    events when it fails, is refused or is lost). Fresh only (never attempted): a retry is
    claimed alone by a run of its own and never joins another's batch.
    """
    require_run(holder, generation)
    if not isinstance(sources, list | tuple) or not sources:
        raise ValueError(f"sources must be a non-empty list of sources, not {sources!r}")
    sources = [require_key("sources", source, SOURCE_MAX) for source in sources]
    now = clock.in_statement(now)
    return current().claim_more(Inbox.objects.resolve(inbox), holder, generation, sources, now)


def take_next(holder, now=None) -> Claim | None:
    """acquire_next and claim_batch together: take the lease of some inbox with work and no
    live holder, and claim its batch, by the same rules (orphans back to pending, dead
    parked, a due retry alone). None when no inbox has work.

    On PostgreSQL, in the common case, it is one statement and one commit (take.sql).
    """
    require_key("holder", holder)
    return current().take_next(holder, clock.in_statement(now))
