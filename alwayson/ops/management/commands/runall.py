"""Run the whole product in one terminal: web server, worker, scheduler and dispatcher.

Each runs as its own process, as in production; this command supervises them. Ctrl-C (or
SIGTERM) asks each to stop gracefully; a second one kills them. If one dies, the others are
stopped and the command fails, rather than leaving a product that silently does half its job.

A terminal's Ctrl-C is a SIGINT to the whole foreground process group, children included, and
a loop takes a second stop request as "exit now": so the children ignore SIGINT (an ignored
signal stays ignored across exec, and the loops leave it so) and each gets this command's one
SIGTERM. They stay in its process group, so a signal to the group that cannot be caught
(SIGKILL, SIGSTOP) still reaches them all.

By default it is the development entry point (devserver: runserver, its start-up waiting out
a database outage as the loops do); `--demo` (what `make run` passes) first makes the demo
login and inbox, which are never made unasked: in a project that embeds alwayson they would
be a superuser in that project's database. With `--production`
it runs the release steps and then the production process set of alwayson/ops/processes.py
(gunicorn instead of devserver), the commands deploy/ runs.
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.urls import reverse

from alwayson.command import AlwaysonCommand
from alwayson.egress.sealing import hide_from_same_user
from alwayson.ops.database import START_OUTAGE, through_outage
from alwayson.ops.processes import PROCESSES, RELEASE, local_argv

DEFAULT_ADDR = "127.0.0.1:8000"
STOP_GRACE = 15


class Command(AlwaysonCommand):
    help = (
        "Migrate and run the web server, worker, scheduler and dispatcher; --demo makes the demo "
        "login and inbox first."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--addr",
            default=None,
            help=f"web server address:port (default {DEFAULT_ADDR}; with --production, "
            "ALWAYSON_WEB_BIND or that)",
        )
        parser.add_argument(
            "--demo",
            action="store_true",
            help="make the demo login and the refund desk's inbox first (development only; "
            "make run passes it)",
        )
        parser.add_argument("--concurrency", type=int, default=None, help="worker slots (2)")
        parser.add_argument(
            "--production",
            action="store_true",
            help="gunicorn and the production process set (alwayson/ops/processes.py); "
            "needs DEBUG off; no demo login",
        )

    def handle(self, *args, addr, demo, concurrency, production, verbosity, **options):
        # Checked before migrate and the demo login: a typo must not half-start anything.
        if concurrency is not None and concurrency < 1:
            raise CommandError(f"--concurrency must be at least 1, not {concurrency}")
        if addr is not None:
            if not re.fullmatch(r"(\S+:)?\d+", addr):
                raise CommandError(f"--addr must be [address:]port like 0.0.0.0:8000, not {addr!r}")
            addr = addr if ":" in addr else f"127.0.0.1:{addr}"
        if production and demo:
            raise CommandError("--demo is for development; production makes no demo data")
        if production:
            commands, env, addr = self.production_set(addr, concurrency)
        else:
            commands, env, addr = self.development_set(addr or DEFAULT_ADDR, demo, concurrency)
        if env.get("ALWAYSON_EGRESS_SOCKET") or settings.ALWAYSON_EGRESS_PORT:
            # The process with the credentials (alwayson/egress/server.py): the sealed worker
            # and out-of-process agents reach their services through it. First, so it
            # listens before the worker's first call.
            egress = [sys.executable, str(settings.BASE_DIR / "manage.py"), "runegress"]
            commands = {"egress": egress, **commands}
        if env.get("ALWAYSON_EGRESS_SOCKET"):
            # This process's environment holds every credential, and the sealed worker it
            # starts runs as the same user (alwayson/egress/sealing.py).
            hide_from_same_user()
        supervisor = Supervisor(commands, env)
        # Before the first child starts: a Ctrl-C while they start stops those already started
        # (they ignore it themselves) instead of leaving them running.
        signal.signal(signal.SIGINT, supervisor.on_signal)
        signal.signal(signal.SIGTERM, supervisor.on_signal)
        supervisor.start()
        self.stdout.write(f"alwayson is running at {home_url(addr)} (Ctrl-C stops everything)")
        failed = supervisor.wait()
        if failed:
            raise CommandError(f"{failed} stopped unexpectedly; stopped the others")
        self.stdout.write("alwayson stopped")

    def development_set(self, addr, demo, concurrency):
        if demo and not apps.is_installed("alwayson.demo"):
            raise CommandError("--demo needs the app alwayson.demo in INSTALLED_APPS")
        if demo and not settings.DEBUG:
            # Checked before migrate, like the flags: demologin would refuse after it.
            raise CommandError("--demo is for development: DEBUG is off")
        self.through_outage(lambda: call_command("migrate", verbosity=0))
        if demo:
            call_command("demologin", addr=addr, stdout=self.stdout)
        else:
            self.stdout.write(
                "No demo data: log in as a user of this project (createsuperuser makes one), "
                "or run with --demo for a demo login and inbox"
            )
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        commands = {
            "web": [*manage, "devserver", "--noreload", addr],
            "worker": [*manage, "runworker", "--concurrency", str(concurrency or 2)],
            "scheduler": [*manage, "runscheduler"],
            "dispatcher": [*manage, "rundispatcher"],
        }
        # The agent's links must point where this server listens, unless configured.
        return commands, {"ALWAYSON_SITE_URL": f"http://{addr}", **os.environ}, addr

    def production_set(self, addr, concurrency):
        if settings.DEBUG:
            raise CommandError("--production needs DEBUG=false (and a SECRET_KEY)")
        if concurrency is not None:
            raise CommandError(
                "--concurrency is for development; --production runs alwayson/ops/processes.py"
            )
        env = dict(os.environ)
        if addr:
            env["ALWAYSON_WEB_BIND"] = addr
        if not env.get("ALWAYSON_EGRESS_SOCKET"):
            # Production seals its worker (alwayson/egress/sealing.py): the socket goes in a
            # directory only this user can enter, made for this run.
            env["ALWAYSON_EGRESS_SOCKET"] = str(
                Path(tempfile.mkdtemp(prefix="alwayson-egress-")) / "egress.sock"
            )
        # The release steps are processes of their own: the server answers before they start.
        self.through_outage(connection.ensure_connection)
        connection.close()
        for name, command in RELEASE.items():
            self.stdout.write(f"{name}: {shlex.join(command)}")
            done = subprocess.run(local_argv(command, settings.BASE_DIR), env=env, check=False)
            if done.returncode:
                raise CommandError(f"{name} failed (exit {done.returncode}); nothing started")
        commands = {
            name: local_argv(command, settings.BASE_DIR) for name, command in PROCESSES.items()
        }
        return commands, env, env.get("ALWAYSON_WEB_BIND", DEFAULT_ADDR)

    def through_outage(self, work):
        return through_outage(work, START_OUTAGE, self.stderr.write)


def home_url(addr) -> str:
    """alwayson's pages at `addr`, under the prefix the project serves them at (a project
    that embeds alwayson may include its URLs anywhere)."""
    return f"http://{addr}{reverse('home')}"


class Supervisor:
    """Child processes that live and stop together."""

    def __init__(self, commands, env):
        self.commands = commands
        self.env = env
        self.children = {}
        self.stop_started = None

    def start(self):
        """Start each child, unless a stop came first."""
        for name, argv in self.commands.items():
            if self.stop_started is not None:
                return
            self.children[name] = subprocess.Popen(
                argv, env=self.env, cwd=settings.BASE_DIR, preexec_fn=ignore_interrupt
            )

    def running(self):
        return [child for child in self.children.values() if child.poll() is None]

    def on_signal(self, signum=None, frame=None):
        # First request: each child stops gracefully. A second, or the grace running out: kill.
        escalate = self.stop_started is not None
        self.stop_started = self.stop_started or time.monotonic()
        for child in self.running():
            child.send_signal(signal.SIGKILL if escalate else signal.SIGTERM)

    def wait(self) -> str | None:
        """Until every child has exited; the name of one that died on its own, if any."""
        failed = None
        while self.running():
            if self.stop_started is None:
                failed = next((n for n, c in self.children.items() if c.poll() is not None), None)
                if failed:
                    self.on_signal()
            elif time.monotonic() - self.stop_started > STOP_GRACE:
                self.on_signal()
            time.sleep(0.2)
        return failed


def ignore_interrupt():
    """In a child, before it execs: a terminal's Ctrl-C is for the supervisor, which forwards
    one stop to each child (see the module's docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
