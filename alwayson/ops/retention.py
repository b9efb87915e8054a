"""What `manage.py prune` deletes, and what it must never touch (docs/how-to/operations.md,
"Retention", lists both).

Every rule is a queryset of rows that are finished and older than their retention. Rows are
taken in bounded batches, oldest first, by a cursor on (age, primary key); each batch is its
own short transaction that deletes (or clears) only the rows that still match the rule, so a
row a worker changed in between is left alone. Workers never wait on prune for longer than
one batch's statement, and prune never locks a lease row: nothing it touches is read by a run.

Principle 1 keeps a key for as long as a sender may deliver it again: a done event is first
cleared to a tombstone (its key kept), and its row goes only after
ALWAYSON_RETAIN_EVENT_KEYS. A key a timer still to fire will write (an approval's expiry) is
kept while that timer waits. Timers decide what fired from their own row, never from the
event history, so deleting old occurrences' events cannot fire them again; and a settled
approval's row, which refuses every later answer once its event is gone, outlives both.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.sessions.models import Session as LoginSession
from django.db import models, transaction
from django.db.models import Exists, OuterRef, Q, Value
from django.db.models.functions import Concat

from alwayson.egress.models import EgressCall
from alwayson.ops.models import PROCESS_RETENTION, Process
from approvals.models import APPROVAL_SOURCE, Approval, AuditEntry
from inbox.extensions import Extension
from inbox.models import Event, RunRecord
from outbox.models import Notice, OutboxMessage
from timers.models import RESERVED_KEY_PREFIX, Timer

DEFAULT_BATCH_SIZE = 500
# A cleared event: its key stays, what it carried goes.
TOMBSTONE = {"payload": {}, "error": ""}


@dataclass(frozen=True)
class Rule:
    """Rows of one table that may go: `rows` older than their retention, taken oldest first
    by `age`. With `clear`, the rows stay and these fields are emptied instead."""

    name: str
    rows: models.QuerySet
    age: str
    clear: dict | None = None
    # Rows another transaction holds FOR UPDATE are left to the next pass, not waited for.
    skip_locked: bool = False

    def batches(self, batch_size) -> "Batches":
        return Batches(self, batch_size)

    def apply(self, ids) -> dict[str, int]:
        """Delete or clear the rows among `ids` that still match; counts per table."""
        still = self.rows.filter(pk__in=ids)
        if self.skip_locked:
            locked = still.select_for_update(skip_locked=True, of=("self",))
            still = self.rows.model.objects.filter(pk__in=list(locked.values_list("pk", flat=True)))
        if self.clear is not None:
            return {self.name: still.update(**self.clear)}
        _, per_model = still.delete()
        return {label: count for label, count in per_model.items() if count}


class Batches:
    """Ids of up to `batch_size` rows at a time, in (age, pk) order, from where the last
    batch ended: rows a rule skips (or only clears) are not read again in the same pass."""

    def __init__(self, rule, batch_size):
        self.rule, self.batch_size, self.after = rule, batch_size, None

    def next(self) -> list:
        rows = self.rule.rows
        if self.after is not None:
            at, pk = self.after
            rows = rows.filter(
                Q(**{f"{self.rule.age}__gt": at}) | Q(**{self.rule.age: at, "pk__gt": pk})
            )
        page = list(
            rows.order_by(self.rule.age, "pk").values_list(self.rule.age, "pk")[: self.batch_size]
        )
        if page:
            self.after = page[-1]
        return [pk for _, pk in page]


def days_before(now, days):
    return now - timedelta(days=days)


def unfinished_run_since(model):
    """Rows of `model` a run that may still be retried reads again: the Claude agent's cached
    answers and tool results are looked up by a retried run, which makes the same requests
    as the run it retries; those requests came after its oldest unfinished event arrived,
    and after the approval it waits for was asked."""
    unfinished = Event.objects.filter(
        inbox_id=OuterRef("inbox_id"),
        status__in=[Event.Status.PENDING, Event.Status.RUNNING],
        created__lte=OuterRef("created"),
    )
    waiting = Approval.objects.filter(
        inbox_id=OuterRef("inbox_id"), answer="", requested_at__lte=OuterRef("created")
    )
    return model.objects.exclude(Exists(unfinished)).exclude(Exists(waiting))


def settled_approvals_without_keys():
    """Settled approvals whose answer event and expiry timer are gone. The row is what
    refuses a late answer once they are (and what makes asking again with the same
    request_id the same request), so it outlives both: it goes only after their keys did,
    and no later answer or second request finds the key free while the row is gone."""
    answer_event = Event.objects.filter(
        inbox_id=OuterRef("inbox_id"), source=APPROVAL_SOURCE, source_id=OuterRef("request_id")
    )
    expiry_timer = Timer.objects.filter(
        inbox_id=OuterRef("inbox_id"),
        key=Concat(Value(RESERVED_KEY_PREFIX), OuterRef("request_id")),
    )
    return (
        Approval.objects.filter(answer__gt="")
        .exclude(Exists(answer_event))
        .exclude(Exists(expiry_timer))
    )


# Rules for the tables of apps above this one (the Claude agent's cached calls, the login
# throttle's rows), by app label: each app adds a function of `now` returning its tables'
# Rules in its ready(), so prune knows every table without importing the apps that own them.
# They are pruned after the egress audit.
table_rules = Extension("the tables prune keeps, by app label")


def rules(now) -> list[Rule]:
    """Every table prune looks at, in the order it prunes them, as of `now`."""
    keys_cutoff = days_before(now, settings.ALWAYSON_RETAIN_EVENT_KEYS)
    done = Event.objects.filter(status=Event.Status.DONE)
    # The key an approval's expiry timer will write: it must still refuse the timer's copy
    # when the answer came first, however long the request was open.
    timer_will_write = Timer.objects.filter(
        done=False,
        inbox_id=OuterRef("inbox_id"),
        event_source=OuterRef("source"),
        event_id=OuterRef("source_id"),
    )
    sent_cutoff = days_before(now, settings.ALWAYSON_RETAIN_SENT_OUTBOX)
    # The newest sent message of an inbox is when its gap started: it stays.
    later_sent = OutboxMessage.objects.filter(
        inbox_id=OuterRef("inbox_id"), sent_at__gt=OuterRef("sent_at")
    )
    found = [
        Rule(
            "inbox.Event (payload cleared)",
            done.filter(updated__lt=days_before(now, settings.ALWAYSON_RETAIN_DONE_EVENTS)).exclude(
                payload={}, error=""
            ),
            "updated",
            clear=TOMBSTONE,
        ),
        Rule(
            "inbox.Event",
            done.filter(updated__lt=keys_cutoff).exclude(Exists(timer_will_write)),
            "updated",
        ),
        # The run history, by when each run ended (runrecord_ended_idx).
        Rule(
            "inbox.RunRecord",
            RunRecord.objects.filter(
                ended__lt=days_before(now, settings.ALWAYSON_RETAIN_RUN_RECORDS)
            ),
            "ended",
        ),
        # A fired one-off (an approval's expiry among them): its event's key is gone too.
        Rule("timers.Timer", Timer.objects.filter(done=True, due__lt=keys_cutoff), "due"),
        Rule(
            "outbox.OutboxMessage",
            OutboxMessage.objects.sent().filter(sent_at__lt=sent_cutoff).filter(Exists(later_sent)),
            "sent_at",
        ),
        Rule(
            "outbox.Notice",
            Notice.objects.filter(status=Notice.Status.SENT, sent_at__lt=sent_cutoff),
            "sent_at",
        ),
        Rule(
            "alwayson_egress.EgressCall",
            EgressCall.objects.filter(
                at__lt=days_before(now, settings.ALWAYSON_RETAIN_EGRESS_CALLS)
            ),
            "at",
        ),
        *(rule for make in table_rules.values() for rule in make(now)),
        Rule(
            "alwayson_ops.Process",
            Process.objects.filter(last_beat__lt=now - PROCESS_RETENTION),
            "last_beat",
        ),
        # Past its cool-off an attempt counts for nothing (django-axes ignores it).
        Rule(
            "axes.AccessAttempt",
            AccessAttempt.objects.filter(attempt_time__lt=now - settings.AXES_COOLOFF_TIME),
            "attempt_time",
        ),
        # Django's `clearsessions`: logins past their expiry.
        Rule("sessions.Session", LoginSession.objects.filter(expire_date__lt=now), "expire_date"),
    ]
    if settings.ALWAYSON_RETAIN_AUDIT is not None:
        audit_cutoff = days_before(now, settings.ALWAYSON_RETAIN_AUDIT)
        found += [
            # With its audit entries (on_delete=CASCADE); a waiting request is never settled.
            Rule(
                "approvals.Approval",
                settled_approvals_without_keys().filter(answered_at__lt=audit_cutoff),
                "answered_at",
                # An answer being refused holds the row (approvals/services.py).
                skip_locked=True,
            ),
            Rule(
                "approvals.AuditEntry",
                AuditEntry.objects.filter(at__lt=audit_cutoff).exclude(approval__answer=""),
                "at",
            ),
            Rule(
                "admin.LogEntry",
                LogEntry.objects.filter(action_time__lt=audit_cutoff),
                "action_time",
            ),
            Rule(
                "axes.AccessLog",
                AccessLog.objects.filter(attempt_time__lt=audit_cutoff),
                "attempt_time",
            ),
            Rule(
                "axes.AccessFailureLog",
                AccessFailureLog.objects.filter(attempt_time__lt=audit_cutoff),
                "attempt_time",
            ),
        ]
    return found


def prune(now, batch_size=DEFAULT_BATCH_SIZE, on_batch: Callable | None = None) -> dict[str, int]:
    """Delete (or clear) every rule's rows, `batch_size` at a time, each batch in its own
    transaction; the number of rows per table ("inbox.Event (payload cleared)" for the
    tombstones). `on_batch(name, counts)` is called after each batch."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
    totals = {}
    for rule in rules(now):
        totals.setdefault(rule.name, 0)
        batches = rule.batches(batch_size)
        while True:
            with transaction.atomic():
                ids = batches.next()
                if not ids:
                    break
                counts = rule.apply(ids)
            for name, count in counts.items():
                totals[name] = totals.get(name, 0) + count
            if on_batch is not None:
                on_batch(rule.name, counts)
    return totals


def would_prune(now) -> dict[str, int]:
    """What prune would delete (or clear) now, per rule; rows cascading from a deleted row
    (an approval's audit entries) are not counted."""
    return {rule.name: rule.rows.count() for rule in rules(now)}
