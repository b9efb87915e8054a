"""When events go dead: an ERROR log line for each, and one alert to the inbox's owner.

claim_batch parks the events that ran out of attempts and sends `events_dead` inside its
transaction, under the inbox's lease lock; `events_going_dead` receives it there:

- each event is logged at ERROR by `alwayson.events` (inbox, source, key, attempts, the last
  error's last line) once the parking commits, so a rolled-back claim logs nothing;
- the owner is told through the inbox's channel (an urgent outbox message), at most once
  per ALWAYSON_DEAD_ALERT_INTERVAL per inbox, counting every event that went dead since the
  last alert. The message is written in the same transaction that parks the events, so a
  crash either keeps both or neither: the owner is never told twice nor missed. Events that
  go dead within the interval are counted on the inbox's DeadAlert row (in the database, so
  every worker process shares the limit), and the dispatcher's `flush_dead_alerts` tells
  the owner about them once the interval has passed, even if nothing else goes dead.

An operator's mark_dead is a decision, not a failure: inbox/operator.py logs it at WARNING
and sends no alert.
"""

import logging
from datetime import timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.db import transaction
from django.urls import NoReverseMatch, reverse

from alwayson.ops.logs import bind_run
from alwayson.ops.models import DeadAlert
from inbox import clock
from inbox.models import Inbox
from inbox.services import lock_inbox
from outbox.models import OutboxMessage

log = logging.getLogger("alwayson.events")

# Keys named in one alert; the rest are counted.
KEYS_SHOWN = 5


def last_line(error: str) -> str:
    """The line that says what failed: a traceback's last, the whole of a one-line error."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def events_going_dead(sender, inbox_id, events, now, generation=None, **kwargs):
    """Receiver of inbox.signals.events_dead, inside the transaction that parks `events`."""
    # The claim parking them is the start of a worker's run: its lines name that run.
    bind_run(inbox_id, generation)
    slug = Inbox.objects.values_list("slug", flat=True).get(pk=inbox_id)
    note_dead(inbox_id, events, now)
    lines = [
        {
            "inbox": slug,
            "event_id": event.pk,
            "source": event.source,
            # Not "key": Sentry and the error pages mask fields named like a credential.
            "source_id": event.source_id,
            "attempts": event.attempts,
            "last_error": last_line(event.error),
        }
        for event in events
    ]
    transaction.on_commit(lambda: log_dead(lines), robust=True)


def log_dead(lines):
    for fields in lines:
        log.error(
            "event went dead: inbox=%(inbox)s source=%(source)s key=%(source_id)s"
            " attempts=%(attempts)s last error: %(last_error)s",
            fields,
            extra=fields,
        )


def note_dead(inbox_id, events, now) -> OutboxMessage | None:
    """Count `events` on the inbox's DeadAlert row, and queue the alert if the interval
    allows; the message queued, or None. Inside the caller's transaction, after the inbox's
    lock."""
    state, _ = DeadAlert.objects.select_for_update().get_or_create(inbox_id=inbox_id)
    state.unreported += len(events)
    shown = len(state.keys)
    state.keys = state.keys + [
        f"{event.source}:{event.source_id}" for event in events[: max(KEYS_SHOWN - shown, 0)]
    ]
    state.last_error = last_line(events[-1].error) if events else state.last_error
    message = queue_alert(state, now) if state.due(now) else None
    state.save()
    return message


def flush_dead_alerts(now=None) -> int:
    """Tell the owners of inboxes whose dead events went unreported (they went dead within
    the interval of an earlier alert) once that interval has passed; the alerts queued.

    The dispatcher calls it on each pass. Each inbox in its own transaction, under the same
    locks as claim_batch (the lease row, then the DeadAlert row), so an alert is queued once
    even with several dispatchers.
    """
    now = clock.resolve(now)
    queued = 0
    due = DeadAlert.objects.filter(unreported__gt=0, last_alert_at__lte=now - interval())
    for inbox_id in list(due.order_by("last_alert_at").values_list("inbox_id", flat=True)):
        with transaction.atomic():
            lock_inbox(inbox_id)
            state = DeadAlert.objects.select_for_update().get(inbox_id=inbox_id)
            if state.unreported and state.due(now):
                queue_alert(state, now)
                state.save()
                queued += 1
    return queued


def interval():
    return timedelta(seconds=settings.ALWAYSON_DEAD_ALERT_INTERVAL)


def queue_alert(state: DeadAlert, now) -> OutboxMessage:
    """The alert for what `state` counts, as an urgent outbox message; `state` reset (the
    caller saves it in the same transaction)."""
    slug = Inbox.objects.values_list("slug", flat=True).get(pk=state.inbox_id)
    message = OutboxMessage.objects.create(
        inbox_id=state.inbox_id, body=alert_body(slug, state), urgent=True, created=now
    )
    log.info(
        "dead-event alert queued: inbox=%s events=%s message=%s",
        slug,
        state.unreported,
        message.pk,
        extra={"inbox": slug, "dead_events": state.unreported, "message_id": message.pk},
    )
    state.last_alert_at = now
    state.alerts += 1
    state.unreported, state.keys, state.last_error = 0, [], ""
    return message


def alert_body(slug, state: DeadAlert) -> str:
    count = state.unreported
    keys = ", ".join(state.keys)
    if count > len(state.keys):
        keys += f" and {count - len(state.keys)} more"
    what = "1 event went dead" if count == 1 else f"{count} events went dead"
    error = f"; last error: {state.last_error}" if state.last_error else ""
    url = dead_events_url(state.inbox_id)
    see = f"See {url}" if url else "See the dead events in the admin"
    return f"{what} in inbox {slug} (keys: {keys}){error}. {see}"


def dead_events_url(inbox_id) -> str:
    """The admin's list of the inbox's dead events; "" where the admin is not mounted (a
    project's own URLs): the alert goes without a link rather than fail the claim."""
    try:
        path = reverse("admin:inbox_event_changelist")
    except NoReverseMatch:
        return ""
    query = urlencode({"inbox__id__exact": inbox_id, "status__exact": "dead"})
    return f"{settings.ALWAYSON_SITE_URL.rstrip('/')}{path}?{query}"
