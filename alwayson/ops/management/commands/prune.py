from django.core.management.base import CommandError

from alwayson.command import AlwaysonCommand
from alwayson.ops.retention import DEFAULT_BATCH_SIZE, prune, would_prune
from inbox import clock


class Command(AlwaysonCommand):
    help = (
        "Delete finished rows past their retention (ALWAYSON_RETAIN_*), in batches of their own "
        "short transactions; safe while workers run. One pass, then exit: run it daily."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"rows per batch, each its own transaction (default {DEFAULT_BATCH_SIZE})",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="print what would be deleted, change nothing"
        )

    def handle(self, *args, batch_size, dry_run, **options):
        if batch_size < 1:
            raise CommandError(f"--batch-size must be a positive integer, not {batch_size}")
        # The database's clock, like the workers': a host clock that is off must not age rows.
        now = clock.database_now()
        if dry_run:
            counts = would_prune(now)
            verb = "would prune"
        else:
            counts = prune(now, batch_size)
            verb = "pruned"
        for table, count in counts.items():
            self.stdout.write(f"{table}\t{count}")
        self.stdout.write(f"{verb} {sum(counts.values())} row(s)")
