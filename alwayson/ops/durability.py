"""Can the database lose a commit it acknowledged? Read from PostgreSQL's own settings and
its replication view, for `check --deploy`, /healthz and the metrics.

Every guarantee of alwayson rests on a commit staying committed: a 202 to a webhook, a finish
the worker logged, a send key stamped before the send. Two setups break that without a
sound: `synchronous_commit` below `on` (a commit is answered before it is flushed where a
crash or a failover keeps it), and a standby that replicates asynchronously (promoted after a
lag, it has lost the commits it had not received: docs/explanation/faults.md). A synchronous
standby loses nothing.

What this cannot see: a cascading standby (replicating from another standby, not from this
server), and a failover tool's choice of which standby it promotes. docs/how-to/production.md
says how to set PostgreSQL so a failover loses nothing.
"""

import logging
import time
from dataclasses import dataclass, field

from django.db import DatabaseError, connection

log = logging.getLogger("alwayson.durability")

OK, AT_RISK, UNKNOWN, EMBEDDED = "ok", "at_risk", "unknown", "embedded"

# Below `on`, in PostgreSQL's order (off < local < remote_write < on < remote_apply).
SHORT_OF_ON = ("off", "local", "remote_write")

UNREADABLE = "could not read the database's replication settings"

# /healthz is probed every few seconds; the answer changes when an operator reconfigures.
CACHE_SECONDS = 60


@dataclass(frozen=True)
class Durability:
    status: str  # ok, at_risk, unknown (could not read), embedded (SQLite: no replication)
    synchronous_commit: str = ""
    standbys: dict = field(default_factory=dict)  # application_name -> sync_state
    reasons: tuple = ()

    @property
    def asynchronous(self) -> list[str]:
        """Standbys a failover could promote with commits missing."""
        return sorted(
            name for name, state in self.standbys.items() if state not in ("sync", "quorum")
        )

    def as_json(self) -> dict:
        found = {"status": self.status}
        if self.status != EMBEDDED:
            found["synchronous_commit"] = self.synchronous_commit
            found["standbys"] = dict(sorted(self.standbys.items()))
        if self.reasons:
            found["reasons"] = list(self.reasons)
        return found


def assess(synchronous_commit: str, standbys: dict) -> Durability:
    """The verdict on a server's `synchronous_commit` and its standbys' sync states."""
    reasons = []
    if synchronous_commit in SHORT_OF_ON:
        reasons.append(
            f"synchronous_commit is {synchronous_commit}: a commit is acknowledged before it is"
            " durable, and a crash or a failover can lose it"
        )
    found = Durability(OK, synchronous_commit, dict(standbys))
    unknown = sorted(name for name, state in standbys.items() if state is None)
    if unknown:
        return Durability(
            UNKNOWN,
            synchronous_commit,
            dict(standbys),
            (
                f"the standbys' sync state is hidden from this role ({', '.join(unknown)}):"
                " grant it pg_monitor",
                *reasons,
            ),
        )
    if found.asynchronous:
        reasons.append(
            f"asynchronous standby(s) {', '.join(found.asynchronous)}: promoted after a lag,"
            " a standby has lost the commits it had not received"
        )
    return Durability(
        AT_RISK if reasons else OK, synchronous_commit, dict(standbys), tuple(reasons)
    )


def read(conn=None) -> Durability:
    """The verdict on the default database (or a psycopg connection's server), read now."""
    if conn is None and connection.vendor != "postgresql":
        return Durability(EMBEDDED)
    import psycopg  # PostgreSQL's alone: not loaded by a process on SQLite

    try:
        with (conn or connection).cursor() as cursor:
            # The session's own value: a deployment may lower it for its connections alone.
            cursor.execute("SELECT current_setting('synchronous_commit')")
            [(synchronous_commit,)] = cursor.fetchall()
            # One row per standby streaming from this server (pg_basebackup's too, while it
            # copies); sync_state is NULL to a role without pg_read_all_stats.
            cursor.execute(
                "SELECT application_name, sync_state FROM pg_stat_replication ORDER BY pid"
            )
            standbys = {
                name or f"standby {n}": state for n, (name, state) in enumerate(cursor.fetchall())
            }
    except (DatabaseError, psycopg.Error):
        # Unreachable: the health check's database check says so; here it is only unknown.
        log.debug("could not read the database's replication settings", exc_info=True)
        return Durability(UNKNOWN, reasons=(UNREADABLE,))
    return assess(synchronous_commit, standbys)


_cached = (float("-inf"), None)


def cached(clock=time.monotonic) -> Durability:
    """`read()`, at most once a CACHE_SECONDS per process."""
    global _cached
    at, found = _cached
    if found is None or clock() - at >= CACHE_SECONDS:
        found = read()
        _cached = (clock(), found)
    return found
