"""Run the whole product in one terminal: web server, worker, scheduler and dispatcher.

Each runs as its own process, as in production; this command supervises them. Ctrl-C (or
SIGTERM) asks each to stop gracefully; a second one kills them. If one dies, the others are
stopped and the command fails, rather than leaving a product that silently does half its job.
"""

import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from alwayson import refund_desk
from inbox.models import Inbox
from outbox.models import Channel

DEMO_USER = "demo"
DEMO_INBOX = "demo-desk"
STOP_GRACE = 15


class Command(BaseCommand):
    help = (
        "Migrate, create the demo login, and run the web server, worker, scheduler and dispatcher."
    )

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="web server address:port")
        parser.add_argument("--no-demo", action="store_true", help="don't create the demo login")
        parser.add_argument("--concurrency", type=int, default=2, help="worker slots")

    def handle(self, *args, addr, no_demo, concurrency, verbosity, **options):
        call_command("migrate", verbosity=0)
        if not no_demo:
            self.create_demo(addr)
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        commands = {
            "web": [*manage, "runserver", "--noreload", addr],
            "worker": [*manage, "runworker", "--concurrency", str(concurrency)],
            "scheduler": [*manage, "runscheduler"],
            "dispatcher": [*manage, "rundispatcher"],
        }
        if settings.ALWAYSON_EGRESS_PORT:
            # Out-of-process agents reach their services through it (alwayson/egress.py).
            commands["egress"] = [*manage, "runegress"]
        # The agent's links must point where this server listens, unless configured.
        env = {"ALWAYSON_SITE_URL": f"http://{addr}", **os.environ}
        supervisor = Supervisor(commands, env)
        signal.signal(signal.SIGINT, supervisor.on_signal)
        signal.signal(signal.SIGTERM, supervisor.on_signal)
        self.stdout.write(f"alwayson is running at http://{addr}/ (Ctrl-C stops everything)")
        failed = supervisor.wait()
        if failed:
            raise CommandError(f"{failed} stopped unexpectedly; stopped the others")
        self.stdout.write("alwayson stopped")

    def create_demo(self, addr):
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(
            username=DEMO_USER, defaults={"email": "demo@example.com"}
        )
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        inbox, created = Inbox.objects.get_or_create(
            slug=DEMO_INBOX, defaults={"owner": user, "name": "Refund desk"}
        )
        Channel.objects.get_or_create(inbox=inbox)
        if created:
            tomorrow = datetime.now(UTC).replace(hour=9, minute=0, second=0, microsecond=0)
            refund_desk.install(inbox, tomorrow + timedelta(days=1))
        self.stdout.write(
            f"Demo login: {DEMO_USER} / {password}  at http://{addr}/accounts/login/\n"
            f"Post 'refund order 881' at http://{addr}/inbox/{DEMO_INBOX}/"
        )


class Supervisor:
    """Child processes that live and stop together."""

    def __init__(self, commands, env):
        self.children = {name: subprocess.Popen(argv, env=env) for name, argv in commands.items()}
        self.stop_started = None

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
