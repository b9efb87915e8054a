from django.core.management.base import CommandError
from django.db.models import Count

from alwayson.command import AlwaysonCommand
from alwayson.ops import durability
from alwayson.ops.database import DatabaseUnusable, check_database
from alwayson.ops.health import check
from alwayson.ops.models import Process, live_window
from inbox import clock


class Command(AlwaysonCommand):
    help = (
        "The health check /healthz answers, then the loop processes, live and lost; "
        "exits non-zero when unhealthy."
    )

    def add_arguments(self, parser):
        parser.add_argument("--all", action="store_true", help="list cleanly stopped processes too")

    def handle(self, *args, all=False, **options):
        try:
            check_database()
        except DatabaseUnusable as exc:
            raise CommandError(str(exc)) from None
        health = check()
        for name, outcome in health.checks.items():
            self.stdout.write(f"{name}\t{outcome}")
        if health.checks["database"] == "ok":
            self.list_processes(all)
        found = durability.read()
        self.stdout.write(f"durability\t{found.status}")
        for reason in found.reasons:
            self.stdout.write(f"! {reason}")
        if not health.ok:
            raise CommandError(f"unhealthy: {', '.join(health.failing)} failing")
        self.stdout.write("healthy")

    def list_processes(self, include_stopped):
        now = clock.database_now()
        rows = Process.objects.with_state(now)
        counts = dict(rows.order_by().values_list("state").annotate(n=Count("id")))
        State = Process.State
        live, lost, stopped = (counts.get(s, 0) for s in (State.LIVE, State.LOST, State.STOPPED))
        # What each count is, in the words of the admin's process list, which lists them all.
        listed = "listed below" if include_stopped else "--all lists them"
        self.stdout.write(
            f"processes: {live} live (beating), {lost} lost (not stopped, no beat for"
            f" {live_window().total_seconds():.0f}s), {stopped} stopped cleanly ({listed})"
        )
        if not include_stopped:
            rows = rows.running()
        for row in rows.order_by("kind", "-last_beat"):
            self.stdout.write(
                f"  {row.kind}\t{row.state}\t{row.worker_id}\t{row.host}\t{row.pid}"
                f"\t{row.runs} run(s)\tbeat {(now - row.last_beat).total_seconds():.0f}s ago"
                f"\tup since {row.started:%Y-%m-%d %H:%M:%S}Z\t{row.version}"
            )
