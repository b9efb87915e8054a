"""The demo's login and inbox for `runall` (and a person trying alwayson): a staff user with
the password kept between runs (alwayson/demo/login.py), the refund desk's inbox with its
channel, and its morning timer. Development only."""

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.shortcuts import resolve_url
from django.urls import reverse

from alwayson.command import AlwaysonCommand
from alwayson.demo import refund_desk
from alwayson.demo.login import demo_password
from inbox.models import Inbox
from outbox.models import Channel

DEMO_USER = "demo"
DEMO_INBOX = "demo-desk"


class Command(AlwaysonCommand):
    help = (
        "Create the demo login and the refund desk's inbox (development only); the password "
        "stays the same from one run to the next."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--addr", default="127.0.0.1:8000", help="where the server listens, for the links"
        )

    def handle(self, *args, addr, **options):
        # A superuser whose password sits in a file is for a developer's machine.
        if not settings.DEBUG:
            raise CommandError(
                "demologin is for development: DEBUG is off (runall without --demo starts"
                " without it)"
            )
        password = demo_password()
        people = get_user_model()
        email_field = people.get_email_field_name()
        login = "demo@example.com" if email_field == people.USERNAME_FIELD else DEMO_USER
        user, _ = people.objects.get_or_create(
            **{people.USERNAME_FIELD: login}, defaults={email_field: "demo@example.com"}
        )
        user.is_staff = user.is_superuser = True
        # Set only when it differs: a new hash would log out the browsers logged in with it.
        if not user.check_password(password):
            user.set_password(password)
        user.save()
        inbox, created = Inbox.objects.get_or_create(
            slug=DEMO_INBOX, defaults={"owner": user, "name": "Refund desk"}
        )
        Channel.objects.get_or_create(inbox=inbox)
        if created:
            tomorrow = datetime.now(UTC).replace(hour=9, minute=0, second=0, microsecond=0)
            refund_desk.install(inbox, tomorrow + timedelta(days=1))
        # The name the login form asks for (a user model may log in by email), at the
        # addresses the project serves them (a project may put alwayson under a prefix).
        site = f"http://{addr}"
        self.stdout.write(
            f"Demo login: {user.get_username()} / {password}  at"
            f" {site}{resolve_url(settings.LOGIN_URL)}\n"
            f"Post 'refund order 881' at {site}{reverse('inbox', kwargs={'slug': inbox.slug})}"
        )
