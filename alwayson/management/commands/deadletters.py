from django.core.management.base import BaseCommand, CommandError

from inbox.models import Event
from inbox.services import requeue as requeue_events


class Command(BaseCommand):
    help = "List dead events, or put some back to pending with their attempts reset."

    def add_arguments(self, parser):
        parser.add_argument("--inbox", help="only this inbox (slug)")
        parser.add_argument(
            "--requeue", nargs="+", type=int, metavar="ID", help="event ids to put back to pending"
        )

    def handle(self, *args, inbox=None, requeue=None, **options):
        dead = Event.objects.dead().select_related("inbox").order_by("id")
        if inbox:
            dead = dead.filter(inbox__slug=inbox)
        if requeue:
            found = set(dead.filter(pk__in=requeue).values_list("pk", flat=True))
            missing = sorted(set(requeue) - found)
            if missing:
                raise CommandError(f"not dead (or unknown) event ids: {missing}; nothing requeued")
            count = requeue_events(requeue)
            self.stdout.write(f"requeued {count} event(s)")
            return
        rows = list(dead)
        for event in rows:
            self.stdout.write(
                f"{event.pk}\t{event.inbox.slug}\t{event.source}\t{event.source_id}"
                f"\t{event.attempts}\t{event.error}"
            )
        self.stdout.write(f"{len(rows)} dead event(s)")
