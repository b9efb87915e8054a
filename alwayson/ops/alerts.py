"""When events go dead: an ERROR log line for each, and one alert to the operators
(docs/how-to/operations.md, "Logs and alerts").

claim_batch parks the events that ran out of attempts and sends `events_dead` inside its
transaction, under the inbox's lease lock; `events_going_dead` receives it there. The lines
are logged once the parking commits, and the notices are written in that transaction, so a
crash keeps both or neither: nobody is told twice nor missed. At most one alert per
ALWAYSON_DEAD_ALERT_INTERVAL per inbox, counted on its DeadAlert row so every worker shares
the limit; the dispatcher's `flush_dead_alerts` tells what went dead within the interval.
The alert is a notice, never a message through the inbox's channel: it is not the agent
speaking.
"""

import logging
from datetime import timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.urls import NoReverseMatch, reverse

from alwayson.ops.logs import bind_run
from alwayson.ops.models import DeadAlert
from inbox import clock
from inbox.models import Inbox, person_fields
from inbox.services import lock_inbox
from outbox.services import queue_notice

log = logging.getLogger("alwayson.events")

# Keys named in one alert; the rest are counted.
KEYS_SHOWN = 5
# Who may view events: the permission the alert's link needs, from the backend that grants
# Django's model permissions (the other one, axes, only refuses logins).
SEES_EVENTS = "inbox.view_event"
PERMISSIONS_BACKEND = "django.contrib.auth.backends.ModelBackend"


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
            "last_error": event.error_line,
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


def note_dead(inbox_id, events, now) -> int:
    """Count `events` on the inbox's DeadAlert row, and queue the alert if the interval
    allows; the number of notices queued. Inside the caller's transaction, after the inbox's
    lock."""
    state, _ = DeadAlert.objects.select_for_update().get_or_create(inbox_id=inbox_id)
    state.unreported += len(events)
    shown = len(state.keys)
    state.keys = state.keys + [
        f"{event.source}:{event.source_id}" for event in events[: max(KEYS_SHOWN - shown, 0)]
    ]
    state.last_error = events[-1].error_line if events else state.last_error
    queued = queue_alert(state, now) if state.due(now) else 0
    state.save()
    return queued


def flush_dead_alerts(now=None) -> int:
    """Tell the operators of inboxes whose dead events went unreported once the interval has
    passed; the alerts queued. Each inbox under claim_batch's locks (the lease row, then
    the DeadAlert row), so an alert is queued once even with several dispatchers.
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


def operators():
    """Who can open the alert's link: active staff who may view events, superusers too."""
    people = get_user_model().objects.with_perm(SEES_EVENTS, backend=PERMISSIONS_BACKEND)
    return people.filter(is_staff=True).only(*person_fields()).order_by("pk")


def queue_alert(state: DeadAlert, now) -> int:
    """The alert for what `state` counts, as one notice to each operator (the owner if
    there is none); the number queued. `state` is reset (the caller saves it in the same
    transaction)."""
    owner = [f"owner__{name}" for name in person_fields()]
    inbox = Inbox.objects.select_related("owner").only("slug", *owner).get(pk=state.inbox_id)
    people = [(person, "you may view events in the admin") for person in operators()] or [
        (
            inbox.owner,
            f"you own inbox {inbox.slug} and no operator may view its events in the admin",
        )
    ]
    body = alert_body(inbox.slug, state)
    # Numbered by the inbox's count of alerts: each alert is a topic of its own.
    topic = f"dead-events:{state.alerts + 1}"
    subject = f"[{inbox.slug}] {what_went_dead(state.unreported)}"
    for person, why in people:
        queue_notice(
            inbox.pk, person, topic, subject, f"{body}\n\nYou get this email because {why}.", now
        )
    log.info(
        "dead-event alert queued: inbox=%s events=%s notices=%s",
        inbox.slug,
        state.unreported,
        len(people),
        extra={"inbox": inbox.slug, "dead_events": state.unreported, "notices": len(people)},
    )
    state.last_alert_at = now
    state.alerts += 1
    state.unreported, state.keys, state.last_error = 0, [], ""
    return len(people)


def what_went_dead(count) -> str:
    return "1 event went dead" if count == 1 else f"{count} events went dead"


def alert_body(slug, state: DeadAlert) -> str:
    count = state.unreported
    keys = ", ".join(state.keys)
    if count > len(state.keys):
        keys += f" and {count - len(state.keys)} more"
    what = what_went_dead(count)
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
