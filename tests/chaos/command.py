"""The chaos run's command line (`python -m tests.chaos`), with a management command's
flags and errors."""

import json
import math
import random
import shutil
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from .check import Observed, check
from .cluster import ClusterError
from .plan import make_plan
from .run import ChaosRun, Interrupted


class Command(BaseCommand):
    help = (
        "The chaos run: the product's processes on a PostgreSQL cluster of the run's own, under "
        "load, killed, stalled and disconnected, their network to PostgreSQL delayed, silenced "
        "and reset, with PostgreSQL restarted and stopped (or failed over); then "
        "drain and check every invariant. Exits non-zero when one fails. Needs root (or the "
        "postgres user) for pg_createcluster; never touches the DATABASE_URL database."
    )

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=float, default=60, help="the fault window")
        parser.add_argument("--seed", type=int, default=None, help="replay a schedule")
        parser.add_argument("--outage", type=float, default=20, help="seconds PostgreSQL is down")
        parser.add_argument("--inboxes", type=int, default=24)
        parser.add_argument("--rate", type=float, default=8, help="new event keys per second")
        parser.add_argument("--workers", type=int, default=3, help="runworker processes")
        parser.add_argument("--concurrency", type=int, default=3, help="slots per runworker")
        parser.add_argument(
            "--failover",
            action="store_true",
            help="the failover scenario: a synchronous standby, promoted mid-run in place of"
            " the restarts and the outage",
        )
        parser.add_argument(
            "--asynchronous-standby",
            action="store_true",
            help="with --failover: an asynchronous standby, to see the checks catch what its"
            " failover loses (the run must fail)",
        )
        parser.add_argument("--drain-timeout", type=float, default=180)
        parser.add_argument("--workdir", type=Path, default=None, help="logs and records")
        parser.add_argument("--report", type=Path, default=None, help="write the table as JSON")
        parser.add_argument(
            "--recheck",
            type=Path,
            default=None,
            metavar="WORKDIR",
            help="check the records an earlier run kept in WORKDIR again, without running",
        )

    def handle(self, *args, seed, workdir, report, drain_timeout, recheck, failover, **options):
        asynchronous = options.pop("asynchronous_standby")
        if asynchronous and not failover:
            raise CommandError("--asynchronous-standby is an option of --failover")
        if recheck:
            try:
                result = check(Observed.load(recheck))
            except (OSError, ValueError) as exc:
                raise CommandError(f"--recheck {recheck}: {exc}") from None
            self.stdout.write(result.render())
            if result.failures:
                raise CommandError(f"{len(result.failures)} invariant(s) failed")
            return

        seed = random.randrange(1, 1_000_000) if seed is None else seed
        for name in ("seconds", "inboxes", "rate", "workers", "concurrency", "drain_timeout"):
            value = drain_timeout if name == "drain_timeout" else options[name]
            # NaN passes a `<= 0` test; infinity would never end the run.
            if not math.isfinite(value) or value <= 0:
                flag = name.replace("_", "-")
                raise CommandError(f"--{flag} must be positive and finite, not {value}")
        if not math.isfinite(options["outage"]):
            raise CommandError(f"--outage must be finite, not {options['outage']}")
        try:
            plan = make_plan(
                seed,
                seconds=options["seconds"],
                outage=options["outage"],
                inboxes=options["inboxes"],
                rate=options["rate"],
                workers=options["workers"],
                concurrency=options["concurrency"],
                failover=failover,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        keep = workdir is not None
        workdir = workdir or Path(tempfile.mkdtemp(prefix=f"alwayson-chaos-{seed}-"))
        workdir.mkdir(parents=True, exist_ok=True)
        run = ChaosRun(
            plan,
            workdir,
            say=self.stdout.write,
            drain_timeout=drain_timeout,
            synchronous=not asynchronous,
        )
        try:
            result = run.execute()
        except ClusterError as exc:
            raise CommandError(str(exc)) from None
        except (Interrupted, KeyboardInterrupt):
            raise CommandError(f"interrupted; records kept in {workdir}") from None
        self.stdout.write(result.render())
        if report:
            report.write_text(json.dumps({"seed": seed, **result.as_dict()}, indent=1))
        replay = f"python -m tests.chaos --seed {seed} --seconds {options['seconds']:g}"
        replay += " --failover" if failover else f" --outage {options['outage']:g}"
        if asynchronous:
            replay += " --asynchronous-standby"
        if result.failures:
            raise CommandError(
                f"{len(result.failures)} invariant(s) failed (seed {seed}; replay: {replay});"
                f" logs and records in {workdir}"
            )
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        self.stdout.write(f"seed {seed}; replay: {replay}")
