"""The table statistics a measure runs under: a database set up the way a real one starts.

    fresh   migrated, inboxes created, `VACUUM ANALYZE` while no lease has work (every
            `work_at` NULL): what the planner knows of a new deployment, or of any quiet
            moment at which autovacuum analyzed these small, hot tables.
    marked  every lease's marker set (one pending event per inbox that had none), `ANALYZE`.

Autovacuum is turned off on the benchmark's tables first, so the statistics stay what the
phase set up while the measures write (`freeze`; `thaw` gives autovacuum back). Each phase
then measures on new connections, whose prepared statements plan under its statistics.
"""

PHASES = ("fresh", "marked")

_TABLES = """
    SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = current_schema() AND c.relkind = 'r' ORDER BY c.relname
"""


def tables(cursor) -> list[str]:
    cursor.execute(_TABLES)
    return [name for (name,) in cursor.fetchall()]


def freeze(cursor) -> None:
    """No autovacuum (nor its ANALYZE) on any table of the schema."""
    for name in tables(cursor):
        cursor.execute(f'ALTER TABLE "{name}" SET (autovacuum_enabled = false)')


def thaw(cursor) -> None:
    for name in tables(cursor):
        cursor.execute(f'ALTER TABLE "{name}" RESET (autovacuum_enabled)')


def unmarked_inboxes(cursor) -> list[int]:
    cursor.execute("SELECT inbox_id FROM inbox_lease WHERE work_at IS NULL ORDER BY inbox_id")
    return [inbox_id for (inbox_id,) in cursor.fetchall()]


def prepare(cursor, phase, mark=None) -> dict:
    """Set the statistics `phase` names (the cursor in autocommit: VACUUM runs outside a
    transaction) and return what the catalog then says (`describe`).

    fresh: VACUUM ANALYZE, which must find every marker NULL (it refuses otherwise: a
    measure already ran). marked: `mark(inbox_ids)` stores a pending event in each inbox
    without work (the product's ingest, so the marker is what it would set), then ANALYZE.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    if phase == "marked" and mark is None:
        raise ValueError("the marked phase needs mark(inbox_ids) to set the markers")
    freeze(cursor)
    if phase == "fresh":
        cursor.execute("SELECT count(*) FROM inbox_lease WHERE work_at IS NOT NULL")
        (marked,) = cursor.fetchone()
        if marked:
            raise RuntimeError(f"fresh statistics need every work_at NULL; {marked} are set")
        cursor.execute("VACUUM ANALYZE")
    else:
        unmarked = unmarked_inboxes(cursor)
        if unmarked:
            mark(unmarked)
        cursor.execute("ANALYZE")
    return describe(cursor)


def describe(cursor) -> dict:
    """What the planner believes: rows per table (pg_class.reltuples; -1 never analyzed)
    and the fraction of leases without a marker (pg_stats.null_frac of work_at; None never
    analyzed), with the true counts beside them, and whether autovacuum is off."""
    cursor.execute(
        "SELECT relname, reltuples, coalesce(array_to_string(reloptions, ','), '')"
        " FROM pg_class WHERE relname IN ('inbox_inbox', 'inbox_lease', 'inbox_event')"
        " AND relkind = 'r' AND relnamespace = current_schema()::regnamespace"
    )
    catalog = {name: (reltuples, options) for name, reltuples, options in cursor.fetchall()}
    cursor.execute(
        "SELECT null_frac FROM pg_stats WHERE schemaname = current_schema()"
        " AND tablename = 'inbox_lease' AND attname = 'work_at'"
    )
    found = cursor.fetchone()
    cursor.execute("SELECT count(*), count(work_at) FROM inbox_lease")
    leases, marked = cursor.fetchone()
    cursor.execute("SELECT count(*) FROM inbox_inbox")
    (inboxes,) = cursor.fetchone()
    return {
        "inboxes": inboxes,
        "leases": leases,
        "marked_leases": marked,
        "planner_inboxes": catalog["inbox_inbox"][0],
        "planner_leases": catalog["inbox_lease"][0],
        "planner_events": catalog["inbox_event"][0],
        "work_at_null_frac": None if found is None else float(found[0]),
        "autovacuum_off": all(
            "autovacuum_enabled=false" in options for _, options in catalog.values()
        ),
    }


def summary(phase, described) -> str:
    """One line for the run's output: what the phase set up."""
    null_frac = described["work_at_null_frac"]
    return (
        f"statistics '{phase}': planner sees {described['planner_inboxes']:.0f} inboxes,"
        f" {described['planner_leases']:.0f} leases, {described['planner_events']:.0f} events;"
        f" work_at null_frac {'-' if null_frac is None else f'{null_frac:.2f}'}"
        f" ({described['marked_leases']} of {described['leases']} leases marked now);"
        f" autovacuum {'off' if described['autovacuum_off'] else 'ON'}"
    )
