from django.core.management.base import CommandError

from alwayson.command import AlwaysonCommand
from inbox.models import Event, Inbox
from inbox.services import requeue as requeue_events
from inbox.validation import require_ids
from outbox.models import Notice, OutboxMessage
from outbox.services import resend as resend_messages
from outbox.services import resend_notices as resend_parked_notices


class Command(AlwaysonCommand):
    help = (
        "List dead events, and outbox messages and notices parked after failed sends; "
        "--requeue puts events back to pending, --resend puts parked sends back to held, "
        "each whole and under its key, --resend-notices puts parked notices back."
    )

    def add_arguments(self, parser):
        parser.add_argument("--inbox", help="only this inbox (slug)")
        parser.add_argument(
            "--requeue", nargs="+", type=int, metavar="ID", help="dead event ids to run again"
        )
        parser.add_argument(
            "--resend",
            nargs="+",
            type=int,
            metavar="ID",
            help="failed outbox message ids; each goes again with the rest of its send",
        )
        parser.add_argument(
            "--resend-notices",
            nargs="+",
            type=int,
            metavar="ID",
            help="failed notice ids; each goes again under its Message-ID",
        )

    def handle(self, *args, inbox=None, requeue=None, resend=None, resend_notices=None, **options):
        dead = Event.objects.dead().select_related("inbox").order_by("id")
        failed = OutboxMessage.objects.failed().select_related("inbox").order_by("id")
        notices = Notice.objects.failed().select_related("inbox", "recipient").order_by("id")
        if inbox is not None:
            if not inbox or not Inbox.objects.filter(slug=inbox).exists():
                raise CommandError(f"--inbox: unknown inbox {inbox!r}")
            dead = dead.filter(inbox__slug=inbox)
            failed = failed.filter(inbox__slug=inbox)
            notices = notices.filter(inbox__slug=inbox)
        if requeue or resend or resend_notices:
            # Check every id before changing anything: a typo must not leave half a change.
            self.check_ids(dead, requeue or [], "dead events")
            self.check_ids(failed, resend or [], "failed outbox messages")
            self.check_ids(notices, resend_notices or [], "failed notices")
            if requeue:
                self.stdout.write(f"requeued {len(requeue_events(requeue))} event(s)")
            if resend:
                self.stdout.write(f"resent {len(resend_messages(resend))} message(s)")
            if resend_notices:
                self.stdout.write(f"resent {len(resend_parked_notices(resend_notices))} notice(s)")
            return
        events = list(dead)
        self.stdout.write(f"{len(events)} dead event(s)")
        for event in events:
            # One line an event: a traceback's last line names the exception (the admin's
            # event page has the whole of it).
            self.stdout.write(
                f"  {event.pk}\t{event.inbox.slug}\t{event.source}\t{event.source_id}"
                f"\t{event.attempts}\t{event.error_line}"
            )
        messages = list(failed)
        self.stdout.write(f"{len(messages)} failed outbox message(s)")
        for message in messages:
            self.stdout.write(
                f"  {message.pk}\t{message.inbox.slug}\t{message.attempts}\t{message.error}"
                f"\t{message.body[:60]!r}\t{message.send_key}"
            )
        parked = list(notices)
        self.stdout.write(f"{len(parked)} failed notice(s)")
        for notice in parked:
            self.stdout.write(
                f"  {notice.pk}\t{notice.inbox.slug}\t{notice.recipient.get_username()}"
                f"\t{notice.topic}\t{notice.attempts}\t{notice.error}\t{notice.key}"
            )

    def check_ids(self, queryset, ids, what):
        try:
            require_ids(what, ids)
        except ValueError as exc:
            raise CommandError(f"{exc}; nothing changed") from None
        found = set(queryset.filter(pk__in=ids).values_list("pk", flat=True))
        missing = sorted(set(ids) - found)
        if missing:
            raise CommandError(f"not {what} (or unknown): {missing}; nothing changed")
