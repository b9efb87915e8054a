"""The inbox's operations, the names every caller imports: ingest, acquire, claim_batch,
claim_more, finish, and the lease verbs.

Each takes an optional `now` (an aware datetime; omitted, the database's clock) and works on
one inbox, named by an `Inbox`, its slug or its id.

The lease row is the inbox's lock, taken first by every writer (locks.py).

The bodies live by operation: ingest.py (storing events), leases.py (the lease and the
claim), finish.py (a run's end; outcomes.py, how it ends: Done, Failed or Defer),
operator.py (an operator's actions), locks.py (the lock and its bounded wait), rules.py
(what they share, what a run holds among it: Held); the statements that differ between
PostgreSQL and SQLite in backends/.
"""

from .finish import SaveState, finish, finish_and_take, record_refused
from .ingest import announce_stored, event_traces, ingest, ingest_many, store_event
from .leases import acquire, acquire_next, claim_batch, claim_more, release, renew, take_next
from .locks import bounded_write, lock_inbox, lock_timeout, locked_write, write_in_one
from .operator import mark_dead, requeue
from .outcomes import DONE, Defer, Done, Ending, Failed
from .rules import (
    HOLDER_MAX,
    RESERVED_SOURCES,
    SOURCE_ID_MAX,
    SOURCE_MAX,
    Claim,
    Effect,
    Held,
    lease_ttl,
    require_unreserved_source,
    retry_delay,
)
from .store import WORK_CHANNEL  # idle workers LISTEN there; a stored event NOTIFYs

__all__ = [
    "HOLDER_MAX",
    "RESERVED_SOURCES",
    "SOURCE_ID_MAX",
    "SOURCE_MAX",
    "DONE",
    "WORK_CHANNEL",
    "Claim",
    "Defer",
    "Done",
    "Effect",
    "Ending",
    "Failed",
    "Held",
    "SaveState",
    "acquire",
    "announce_stored",
    "acquire_next",
    "bounded_write",
    "claim_batch",
    "claim_more",
    "event_traces",
    "finish",
    "finish_and_take",
    "ingest",
    "ingest_many",
    "lease_ttl",
    "lock_inbox",
    "lock_timeout",
    "locked_write",
    "record_refused",
    "mark_dead",
    "release",
    "renew",
    "requeue",
    "require_unreserved_source",
    "retry_delay",
    "store_event",
    "take_next",
    "write_in_one",
]
