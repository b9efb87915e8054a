"""The demo's login and inbox for `runall` (and a person trying alwayson): a staff user with a
fresh password, the refund desk's inbox with its channel, and its morning timer."""

import secrets
from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from alwayson.demo import refund_desk
from inbox.models import Inbox
from outbox.models import Channel

DEMO_USER = "demo"
DEMO_INBOX = "demo-desk"


class Command(BaseCommand):
    help = "Create (or reset the password of) the demo login and the refund desk's inbox."

    def add_arguments(self, parser):
        parser.add_argument(
            "--addr", default="127.0.0.1:8000", help="where the server listens, for the links"
        )

    def handle(self, *args, addr, **options):
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
