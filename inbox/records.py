"""A run's record (RunRecord): the values a finish writes it with, and the two records
written apart from a finish, a lost run's and a refused one's.

A finish that commits writes its run's record in the same transaction (finish_done.sql on
PostgreSQL, `write_finished` otherwise), so a record marked done always has what the run
produced, and a run whose finish did not commit has no record that says it did.
"""

import json

from django.conf import settings
from django.db.models import Min

from .models import Event, RunRecord
from .validation import json_text, require_text

TRACE_MAX = RunRecord._meta.get_field("trace").max_length


def record_values(produced, trace) -> dict:
    """The record's parameters of a finish, checked before anything is locked."""
    produced = {} if produced is None else produced
    if not isinstance(produced, dict):
        raise ValueError(f"produced must be a dict, not {type(produced).__name__}")
    require_text("trace", trace)
    if len(trace) > TRACE_MAX:
        raise ValueError(f"trace must be at most {TRACE_MAX} characters, not {len(trace)}")
    return {
        "record": bool(settings.ALWAYSON_RUN_RECORDS),
        "produced": json_text("produced", produced),  # checked and encoded at once
        "trace": trace,
    }


def claimed_times(run, claimed) -> dict | None:
    """When the run's events were claimed and the oldest arrived, read before a finish
    writes them (the claim stamped `updated`)."""
    if not run["record"]:
        return None
    return claimed.aggregate(started=Min("updated"), waiting_since=Min("created"))


def write_finished(run, times, outcome, error, now):
    """The record of a finish that passed its fence and wrote every one of its events."""
    if times is None:
        return
    RunRecord.objects.create(
        inbox_id=run["inbox"],
        generation=run["generation"],
        worker=run["holder"],
        started=times["started"] or now,
        ended=now,
        outcome=outcome,
        error=error,
        events=run["ids"],
        waiting_since=times["waiting_since"],
        produced=json.loads(run["produced"]),
        trace=run["trace"],
    )


def write_lost(inbox_id, orphans, holder, now):
    """Lost runs, found by a take under the lease row's lock: each older generation whose
    events were still running. `orphans` are (id, claim_gen, attempts, updated) rows."""
    if not settings.ALWAYSON_RUN_RECORDS:
        return
    runs: dict[int, list] = {}
    for pk, generation, _, updated in orphans:
        runs.setdefault(generation, []).append((pk, updated))
    # A run refused before this take found it is recorded already, with its events.
    recorded = {
        generation
        for generation, events in RunRecord.objects.filter(
            inbox_id=inbox_id, generation__in=runs
        ).values_list("generation", "events")
        if set(events) & {pk for pk, _ in runs[generation]}
    }
    arrivals = dict(
        Event.objects.filter(pk__in=[pk for pk, *_ in orphans]).values_list("pk", "created")
    )
    RunRecord.objects.bulk_create(
        RunRecord(
            inbox_id=inbox_id,
            generation=generation,
            worker=holder,
            started=min(updated for _, updated in rows),
            ended=now,
            outcome=RunRecord.Outcome.LOST,
            error=f"worker lost its lease during the run (generation {generation})",
            events=sorted(pk for pk, _ in rows),
            waiting_since=min(arrivals[pk] for pk, _ in rows),
        )
        for generation, rows in sorted(runs.items())
        if generation not in recorded
    )


def write_refused(inbox_id, generation, holder, event_ids, started, now, error, produced):
    """A run whose finish was refused, recorded apart from any finish: it committed
    nothing, and this says so. A take that found it lost first recorded it; then the row
    gets what the worker knows. Compare-and-set: a record of these events that says the run
    ended (a second finish of one claim) is never overwritten."""
    if not settings.ALWAYSON_RUN_RECORDS:
        return
    values = {
        "worker": holder,
        "started": started,
        "ended": now,
        "outcome": RunRecord.Outcome.REFUSED,
        "error": error,
        "produced": produced or {},
    }
    runs = RunRecord.objects.filter(inbox_id=inbox_id, generation=generation)
    mine = [pk for pk, events in runs.values_list("pk", "events") if set(events) & set(event_ids)]
    if mine:
        runs.filter(pk__in=mine, outcome=RunRecord.Outcome.LOST).update(**values)
        return
    events = Event.objects.filter(pk__in=event_ids)
    RunRecord.objects.bulk_create(
        [
            RunRecord(
                inbox_id=inbox_id,
                generation=generation,
                events=sorted(event_ids),
                waiting_since=events.aggregate(at=Min("created"))["at"],
                **values,
            )
        ]
    )
