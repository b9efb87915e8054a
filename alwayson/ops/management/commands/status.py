from django.core.management.base import BaseCommand, CommandError

import alwayson
from alwayson.ops.health import check
from alwayson.ops.models import Process
from inbox import clock


class Command(BaseCommand):
    help = (
        "The health check /healthz answers, then the loop processes, live and lost; "
        "exits non-zero when unhealthy."
    )

    def get_version(self):
        return alwayson.__version__  # --version: alwayson's, not Django's

    def add_arguments(self, parser):
        parser.add_argument("--all", action="store_true", help="list cleanly stopped processes too")

    def handle(self, *args, all=False, **options):
        health = check()
        for name, outcome in health.checks.items():
            self.stdout.write(f"{name}\t{outcome}")
        if health.checks["database"] == "ok":
            self.list_processes(all)
        if not health.ok:
            raise CommandError(f"unhealthy: {', '.join(health.failing)} failing")
        self.stdout.write("healthy")

    def list_processes(self, include_stopped):
        now = clock.database_now()
        rows = Process.objects.with_state(now).order_by("kind", "-last_beat")
        if not include_stopped:
            rows = rows.running()
        rows = list(rows)
        self.stdout.write(f"{len(rows)} process(es)")
        for row in rows:
            self.stdout.write(
                f"  {row.kind}\t{row.state}\t{row.worker_id}\t{row.host}\t{row.pid}"
                f"\t{row.runs} run(s)\tbeat {(now - row.last_beat).total_seconds():.0f}s ago"
                f"\tup since {row.started:%Y-%m-%d %H:%M:%S}Z\t{row.version}"
            )
