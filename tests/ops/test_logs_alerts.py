"""Logs and alerts: a dead event is logged at ERROR and its operators told by email once per
interval, in the transaction that parks it, never through the inbox's channel; a parked outbox
send is logged at ERROR; JSON log lines carry the run id; bad settings stop start-up.

Events are put out of attempts directly (attempts = ALWAYSON_MAX_ATTEMPTS, pending): the
next claim parks them, which is the path under test. Sentry is in tests/ops/test_sentry.py.
"""

import json
import logging
import logging.config
import os
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission
from django.core import mail
from django.core.management import call_command

from alwayson.ops.alerts import flush_dead_alerts
from alwayson.ops.models import DeadAlert
from alwayson.runtime.worker import Worker
from alwayson.settings.logs import logging_config
from inbox import services
from inbox.backends import base as inbox_backend
from inbox.models import Event, Membership, Role
from inbox.services import ingest, mark_dead
from outbox.channels import SendFailed
from outbox.models import Channel, Notice, OutboxMessage
from outbox.services import dispatch_inbox, dispatch_notices
from tests.support.events import claim, out_of_attempts
from tests.support.paths import ROOT as BASE_DIR

MINUTE = timedelta(minutes=1)


def alerts(inbox):
    """The dead-event alerts of `inbox`: notices to its operators, oldest first."""
    return list(Notice.objects.filter(inbox=inbox, topic__startswith="dead-events:"))


@pytest.fixture
def events_log(caplog, monkeypatch):
    """alwayson's loggers do not propagate (they have their own handler): let them reach
    caplog's for the test."""
    monkeypatch.setattr(logging.getLogger("alwayson"), "propagate", True)
    caplog.set_level(logging.INFO, logger="alwayson")
    return caplog


def records(caplog, logger, level):
    return [r for r in caplog.records if r.name == logger and r.levelno == level]


# --- dead events: the log line --------------------------------------------------------------


@pytest.mark.django_db
def test_an_event_out_of_attempts_is_logged_at_error_with_its_fields(
    inbox, t0, events_log, django_capture_on_commit_callbacks
):
    out_of_attempts(inbox, "m1", now=t0)

    with django_capture_on_commit_callbacks(execute=True):
        claim(inbox, t0)

    [record] = records(events_log, "alwayson.events", logging.ERROR)
    event = Event.objects.get(source_id="m1")
    assert event.status == "dead"
    assert (record.inbox, record.source, record.source_id, record.attempts) == (
        "desk",
        "chat",
        "m1",
        3,
    )
    assert record.event_id == event.pk
    assert record.last_error == "ValueError: refund 881 failed"
    assert record.getMessage() == (
        "event went dead: inbox=desk source=chat key=m1 attempts=3"
        " last error: ValueError: refund 881 failed"
    )


@pytest.mark.django_db
def test_a_claim_that_rolls_back_logs_no_dead_event(
    inbox, t0, events_log, monkeypatch, django_capture_on_commit_callbacks
):
    out_of_attempts(inbox, "m1", now=t0)

    def fail(*args):
        raise RuntimeError("the claim fails after the alert was written")

    monkeypatch.setattr(inbox_backend, "_dead_reason", fail)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError):
        claim(inbox, t0)

    assert records(events_log, "alwayson.events", logging.ERROR) == []


@pytest.mark.django_db
def test_an_operators_mark_dead_is_logged_at_warning_and_alerts_nobody(
    inbox, t0, events_log, django_capture_on_commit_callbacks
):
    ingest(inbox, "chat", "m1", {}, now=t0)
    ingest(inbox, "chat", "m2", {}, now=t0)

    with django_capture_on_commit_callbacks(execute=True):
        assert len(mark_dead(Event.objects.values_list("pk", flat=True), "spam", now=t0)) == 2

    [record] = records(events_log, "alwayson.events", logging.WARNING)
    assert (record.inbox_id, record.count, record.reason) == (inbox.pk, 2, "spam")
    assert records(events_log, "alwayson.events", logging.ERROR) == []
    assert alerts(inbox) == []
    assert not DeadAlert.objects.exists()


# --- dead events: the operators' alert -----------------------------------------------------


@pytest.fixture
def operator(django_user_model):
    """Staff who may view events: who can open the alert's link to the admin."""
    user = django_user_model.objects.create_user("ops", email="ops@example.com", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="inbox", codename="view_event")
    )
    return user


def footer(why="you may view events in the admin"):
    return f"\n\nYou get this email because {why}."


@pytest.mark.django_db
def test_many_dead_events_make_one_alert_with_their_keys_and_the_admin_link(inbox, operator, t0):
    out_of_attempts(inbox, *[f"m{n}" for n in range(1, 8)], now=t0)

    claim(inbox, t0)

    [alert] = alerts(inbox)
    assert alert.recipient == operator
    assert alert.created == alert.due_at == t0
    assert alert.subject == "[desk] 7 events went dead"
    assert alert.body == (
        "7 events went dead in inbox desk (keys: chat:m1, chat:m2, chat:m3, chat:m4, chat:m5"
        " and 2 more); last error: ValueError: refund 881 failed. See "
        f"http://127.0.0.1:8000/admin/inbox/event/?inbox__id__exact={inbox.pk}&status__exact=dead"
        + footer()
    )


@pytest.mark.django_db
def test_a_dead_event_leaves_no_alert_in_the_conversation(inbox, operator, t0, client):
    out_of_attempts(inbox, "m1", now=t0)

    claim(inbox, t0)

    client.force_login(inbox.owner)
    response = client.get(f"/inbox/{inbox.slug}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "went dead" not in page
    assert "/admin/inbox/event/" not in page
    assert not OutboxMessage.objects.filter(inbox=inbox).exists()
    assert len(alerts(inbox)) == 1


@pytest.mark.django_db
def test_the_operators_get_the_alert_by_email_and_the_inboxs_people_do_not(
    inbox, operator, t0, django_user_model
):
    inbox.owner.email = "owner@example.com"
    inbox.owner.save()
    root = django_user_model.objects.create_superuser("root", email="root@example.com")
    staff = django_user_model.objects.create_user("lee", email="lee@example.com", is_staff=True)
    approver = django_user_model.objects.create_user("dana", email="dana@example.com")
    Membership.objects.create(inbox=inbox, user=approver, role=Role.APPROVER)
    Membership.objects.create(inbox=inbox, user=staff, role=Role.MANAGER)
    gone = django_user_model.objects.create_user("old-ops", email="old@example.com")
    gone.user_permissions.add(*operator.user_permissions.all())
    gone.is_staff, gone.is_active = True, False
    gone.save()
    out_of_attempts(inbox, "m1", now=t0)
    claim(inbox, t0)

    assert dispatch_notices(now=t0) == 2

    assert sorted(email.to[0] for email in mail.outbox) == [operator.email, root.email]
    for email in mail.outbox:
        assert email.subject == "[desk] 1 event went dead"
        assert email.body.startswith("1 event went dead in inbox desk (keys: chat:m1)")
        assert f"/admin/inbox/event/?inbox__id__exact={inbox.pk}&status__exact=dead" in email.body


@pytest.mark.django_db
def test_without_an_operator_the_alert_goes_to_the_inboxs_owner(inbox, t0):
    inbox.owner.email = "owner@example.com"
    inbox.owner.save()
    out_of_attempts(inbox, "m1", now=t0)
    claim(inbox, t0)

    assert dispatch_notices(now=t0) == 1

    [email] = mail.outbox
    assert email.to == ["owner@example.com"]
    assert email.body.endswith(
        footer("you own inbox desk and no operator may view its events in the admin")
    )
    assert not OutboxMessage.objects.filter(inbox=inbox).exists()


@pytest.mark.django_db
def test_an_alert_never_delays_the_agents_next_message(inbox, operator, t0):
    out_of_attempts(inbox, "m1", now=t0)
    claim(inbox, t0)
    sent = []
    dispatch_inbox(inbox, sent.append, now=t0)

    OutboxMessage.objects.create(inbox=inbox, body="Refunded order 881", created=t0 + MINUTE)

    assert dispatch_inbox(inbox, sent.append, now=t0 + MINUTE) == 1
    assert [message.body for delivery in sent for message in delivery.messages] == [
        "Refunded order 881"
    ]


@pytest.mark.django_db
def test_the_alert_is_sent_at_once_while_the_inbox_waits_for_its_gap(inbox, operator, t0):
    OutboxMessage.objects.create(inbox=inbox, body="earlier news", created=t0)
    assert dispatch_inbox(inbox, [].append, now=t0) == 1
    out_of_attempts(inbox, "m1", now=t0 + MINUTE)
    claim(inbox, t0 + MINUTE)

    assert dispatch_notices(now=t0 + MINUTE) == 1

    assert mail.outbox[-1].to == [operator.email]
    assert mail.outbox[-1].body.startswith("1 event went dead in inbox desk")


urlpatterns = []  # a project that does not mount the admin


@pytest.mark.django_db
def test_without_the_admin_mounted_the_alert_goes_without_a_link(inbox, operator, t0, settings):
    settings.ROOT_URLCONF = __name__
    out_of_attempts(inbox, "m1", now=t0)

    claim(inbox, t0)

    [alert] = alerts(inbox)
    assert alert.body.endswith(
        "last error: ValueError: refund 881 failed. See the dead events in the admin" + footer()
    )
    assert Event.objects.get().status == "dead"


@pytest.mark.django_db
def test_dead_events_within_the_interval_wait_for_it_then_make_one_alert(
    inbox, operator, t0, settings
):
    settings.ALWAYSON_DEAD_ALERT_INTERVAL = 3600
    out_of_attempts(inbox, "m1", now=t0)
    claim(inbox, t0)
    assert len(alerts(inbox)) == 1

    out_of_attempts(inbox, "m2", now=t0 + 10 * MINUTE)
    claim(inbox, t0 + 10 * MINUTE, holder="W2")
    out_of_attempts(inbox, "m3", now=t0 + 20 * MINUTE)
    claim(inbox, t0 + 20 * MINUTE, holder="W3")
    assert len(alerts(inbox)) == 1
    assert flush_dead_alerts(now=t0 + 59 * MINUTE) == 0
    assert len(alerts(inbox)) == 1

    assert flush_dead_alerts(now=t0 + 60 * MINUTE) == 1
    assert flush_dead_alerts(now=t0 + 60 * MINUTE) == 0

    first, second = alerts(inbox)
    assert first.body.startswith("1 event went dead in inbox desk (keys: chat:m1)")
    assert second.body.startswith("2 events went dead in inbox desk (keys: chat:m2, chat:m3)")
    assert second.created == t0 + 60 * MINUTE
    state = DeadAlert.objects.get(inbox=inbox)
    assert (state.alerts, state.unreported, state.last_alert_at) == (2, 0, t0 + 60 * MINUTE)


@pytest.mark.django_db
def test_a_dead_event_after_the_interval_alerts_at_once_counting_those_before(inbox, operator, t0):
    out_of_attempts(inbox, "m1", now=t0)
    claim(inbox, t0)
    out_of_attempts(inbox, "m2", now=t0 + 10 * MINUTE)
    claim(inbox, t0 + 10 * MINUTE, holder="W2")

    later = t0 + 61 * MINUTE
    out_of_attempts(inbox, "m3", now=later)
    claim(inbox, later, holder="W3")

    first, second = alerts(inbox)
    assert second.created == later
    assert second.body.startswith("2 events went dead in inbox desk (keys: chat:m2, chat:m3)")
    assert flush_dead_alerts(now=later + 61 * MINUTE) == 0


@pytest.mark.django_db
def test_each_inbox_has_its_own_interval(make_inbox, operator, t0):
    desk, billing = make_inbox("desk"), make_inbox("billing")
    out_of_attempts(desk, "m1", now=t0)
    claim(desk, t0)
    out_of_attempts(billing, "m1", now=t0 + MINUTE)
    claim(billing, t0 + MINUTE)

    assert len(alerts(desk)) == 1
    assert len(alerts(billing)) == 1


@pytest.mark.django_db
def test_the_alert_commits_with_the_dead_transition_or_not_at_all(inbox, operator, t0, monkeypatch):
    out_of_attempts(inbox, "m1", "m2", now=t0)
    real_reason = inbox_backend._dead_reason

    def fail(*args):
        raise RuntimeError("crash after the alert was written, before the claim commits")

    monkeypatch.setattr(inbox_backend, "_dead_reason", fail)
    with pytest.raises(RuntimeError):
        claim(inbox, t0)

    assert alerts(inbox) == []
    assert not DeadAlert.objects.filter(unreported__gt=0).exists()
    assert not DeadAlert.objects.filter(last_alert_at__isnull=False).exists()
    assert set(Event.objects.values_list("status", flat=True)) == {"pending"}

    monkeypatch.setattr(inbox_backend, "_dead_reason", real_reason)
    claim(inbox, t0 + MINUTE, holder="W2")

    [alert] = alerts(inbox)
    assert alert.body.startswith("2 events went dead in inbox desk (keys: chat:m1, chat:m2)")
    assert set(Event.objects.values_list("status", flat=True)) == {"dead"}


@pytest.mark.django_db(transaction=True)  # the loop closes and reopens its connection
def test_rundispatcher_flushes_the_alerts_that_waited(inbox, operator, t0, loop_command, settings):
    settings.ALWAYSON_DEAD_ALERT_INTERVAL = 1
    DeadAlert.objects.create(
        inbox=inbox, last_alert_at=t0, alerts=1, unreported=2, keys=["chat:m2", "chat:m3"]
    )

    call_command("rundispatcher", "--once", verbosity=0)

    [alert] = alerts(inbox)
    assert alert.body.startswith("2 events went dead in inbox desk (keys: chat:m2, chat:m3).")
    assert alert.status == "sent"  # the same pass sent it
    assert mail.outbox[-1].to == [operator.email]
    assert "2 events went dead in inbox desk" in mail.outbox[-1].body
    assert not OutboxMessage.objects.filter(inbox=inbox).exists()


# --- the outbox -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_send_parked_as_failed_is_logged_at_error(inbox, t0, settings, events_log):
    settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS = 2
    message = OutboxMessage.objects.create(inbox=inbox, body="hello", created=t0)

    def refuse(delivery):
        raise SendFailed("HTTP 500 from the receiver")

    dispatch_inbox(inbox, refuse, now=t0)
    assert records(events_log, "alwayson.outbox", logging.ERROR) == []
    dispatch_inbox(inbox, refuse, now=t0 + timedelta(hours=2))

    [record] = records(events_log, "alwayson.outbox", logging.ERROR)
    message.refresh_from_db()
    assert message.status == "failed"
    assert (record.inbox_id, record.channel, record.message_ids) == (
        inbox.pk,
        "email",
        [message.pk],
    )
    assert (record.send, record.attempts) == (message.send_key, 2)
    assert record.last_error == "HTTP 500 from the receiver"


@pytest.mark.django_db
def test_a_failed_at_most_once_send_is_logged_at_error(inbox, t0, events_log):
    Channel.objects.update_or_create(inbox=inbox, defaults={"mode": "at_most_once"})
    message = OutboxMessage.objects.create(inbox=inbox, body="hello", created=t0)

    def refuse(delivery):
        raise SendFailed("connection refused")

    dispatch_inbox(inbox, refuse, now=t0)

    [record] = records(events_log, "alwayson.outbox", logging.ERROR)
    assert (record.message_ids, record.attempts, record.last_error) == (
        [message.pk],
        1,
        "connection refused",
    )


# --- log lines: JSON and the run id ---------------------------------------------------------


@pytest.fixture
def log_lines():
    """Configure logging as a process with ALWAYSON_LOG_FORMAT=<format> would, into a buffer;
    the lines written. Put back as configured afterwards."""
    buffer = StringIO()

    def configure(log_format):
        logging.config.dictConfig(logging_config(log_format))
        logging.getLogger("alwayson").handlers[0].setStream(buffer)
        return lambda: buffer.getvalue().splitlines()

    yield configure
    logging.config.dictConfig(django_settings.LOGGING)


def logging_agent(run):
    logging.getLogger("alwayson.agent.test").info("handling %s event(s)", len(run.events))
    run.say("done")


@pytest.mark.django_db(transaction=True)  # dead events are logged at commit: let it happen
def test_json_lines_parse_and_carry_the_run_id_through_a_worker_step(inbox, log_lines):
    lines = log_lines("json")
    out_of_attempts(inbox, "poison", now=None)
    ingest(inbox, "chat", "hello", {})

    worker = Worker("W", agent=logging_agent)
    assert worker.step().events == 1
    first = [json.loads(line) for line in lines()]
    ingest(inbox, "chat", "again", {})
    assert worker.step().events == 1
    second = [json.loads(line) for line in lines()][len(first) :]

    by_logger = {line["logger"]: line for line in first}
    assert {"alwayson.events", "alwayson.agent.test", "alwayson.worker"} <= set(by_logger)
    dead = by_logger["alwayson.events"]
    assert (dead["level"], dead["source_id"], dead["attempts"]) == ("ERROR", "poison", 3)
    assert dead["last_error"] == "ValueError: refund 881 failed"
    assert by_logger["alwayson.agent.test"]["message"] == "handling 1 event(s)"
    for line in first:
        assert set(line) >= {"time", "level", "logger", "message", "run_id", "inbox_id"}
        assert (line["inbox_id"], line["generation"]) == (inbox.pk, 1)
    [run_id] = {line["run_id"] for line in first}
    [next_run_id] = {line["run_id"] for line in second}
    assert run_id and next_run_id and run_id != next_run_id


@pytest.mark.django_db
def test_text_lines_name_the_run(inbox, log_lines):
    lines = log_lines("text")
    ingest(inbox, "chat", "hello", {})

    Worker("W", agent=logging_agent).step()
    logging.getLogger("alwayson.worker").info("between runs")

    run_line, worker_line, outside = lines()
    run_tag = run_line.split(" alwayson.agent.test ")[1].split(" ")[:2]
    assert run_tag[0] == "[run" and run_tag[1].endswith("]")
    assert f"{' '.join(run_tag)} run inbox=desk" in worker_line
    assert outside.endswith(" INFO alwayson.worker between runs")


@pytest.mark.django_db(transaction=True)  # the loop closes and reopens its connection
def test_json_lines_follow_the_loop_commands_verbosity(log_lines, loop_command):
    lines = log_lines("json")

    call_command("rundispatcher", "--once", "--worker-id", "d1", verbosity=0)
    assert lines() == []
    call_command("rundispatcher", "--once", "--worker-id", "d1", verbosity=1)

    [started] = [json.loads(line) for line in lines()]
    assert (started["logger"], started["level"]) == ("alwayson.dispatcher", "INFO")
    assert started["message"] == "dispatcher d1: interval 1.00s"
    assert started["run_id"] is None


# --- settings that stop start-up ------------------------------------------------------------


def start_up(**variables):
    """A process that loads the settings with these variables: (exit code, stderr)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ALWAYSON_LOG", "ALWAYSON_DEAD", "SENTRY_"))
    }
    env.update(DJANGO_SETTINGS_MODULE="alwayson.settings", **variables)
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stderr


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("ALWAYSON_LOG_FORMAT", "xml", "ALWAYSON_LOG_FORMAT must be one of text, json, not 'xml'"),
        ("ALWAYSON_DEAD_ALERT_INTERVAL", "0", "ALWAYSON_DEAD_ALERT_INTERVAL must be a positive"),
        ("ALWAYSON_DEAD_ALERT_INTERVAL", "hourly", "ALWAYSON_DEAD_ALERT_INTERVAL must be an"),
        ("SENTRY_DSN", "not a dsn", "SENTRY_DSN is not a usable DSN"),
    ],
)
def test_a_bad_value_stops_start_up(name, value, says):
    code, stderr = start_up(**{name: value})

    assert code != 0
    assert "ImproperlyConfigured" in stderr and says in stderr


def test_json_is_accepted_in_any_case():
    assert start_up(ALWAYSON_LOG_FORMAT=" JSON ") == (0, "")


# --- the flush's query plan (PostgreSQL) ----------------------------------------------------


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_the_flush_finds_due_alerts_by_the_partial_due_index(t0, owner):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from inbox.models import Inbox

    quiet = Inbox.objects.bulk_create(
        Inbox(owner=owner, slug=f"quiet-{n}", created=t0) for n in range(3000)
    )
    DeadAlert.objects.bulk_create(
        DeadAlert(inbox=inbox, last_alert_at=t0 - timedelta(days=n % 30), alerts=1)
        for n, inbox in enumerate(quiet)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {DeadAlert._meta.db_table}")

    with CaptureQueriesContext(connection) as captured:
        assert flush_dead_alerts(now=t0) == 0
    [due] = [q["sql"] for q in captured.captured_queries]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + due)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "dead_alert_due_idx" in plan, plan


@pytest.mark.postgres_only
@pytest.mark.django_db(
    transaction=True
)  # the dispatchers are threads with connections of their own
def test_two_dispatchers_flushing_at_once_queue_one_alert(inbox, operator, t0):
    import threading

    from django.db import connection, transaction

    DeadAlert.objects.create(
        inbox=inbox, last_alert_at=t0, alerts=1, unreported=2, keys=["chat:m2", "chat:m3"]
    )
    results, errors = [], []

    def dispatcher():
        try:
            results.append(flush_dead_alerts(now=t0 + timedelta(hours=2)))
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=dispatcher) for _ in range(2)]
    # Both find the row due, then queue behind the inbox's lock held here.
    with transaction.atomic():
        services.lock_inbox(inbox.pk)
        for thread in threads:
            thread.start()
        waiting = 0
        for _ in range(200):
            with connection.cursor() as cursor:
                # pg_stat_activity is read once per transaction unless its snapshot is cleared.
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                )
                waiting = cursor.fetchone()[0]
            if waiting == 2:
                break
            threading.Event().wait(0.05)
        assert waiting == 2, errors
    for thread in threads:
        thread.join(30)

    assert errors == []
    assert sorted(results) == [0, 1]
    [alert] = alerts(inbox)
    assert alert.body.startswith("2 events went dead in inbox desk (keys: chat:m2, chat:m3)")
