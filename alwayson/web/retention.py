"""What `manage.py prune` may delete of the pages' tables (alwayson/ops/retention.py)."""

from django.conf import settings
from django.db import connection
from django.db.models import Exists, OuterRef

from alwayson.ops.retention import Rule

from .models import LiveChange, LiveWatch, PasswordResetRequest


def rules(now) -> list[Rule]:
    """Password reset requests past the login cool-off count for nothing; of the live pages'
    changes, a cursor reads only each inbox's newest (alwayson/web/live.py); a watch whose
    LISTEN connection is gone makes a NOTIFY nobody hears (PostgreSQL only: SQLite has none)."""
    newer = LiveChange.objects.filter(inbox_id=OuterRef("inbox_id"), pk__gt=OuterRef("pk"))
    return [
        Rule(
            "alwayson_web.PasswordResetRequest",
            PasswordResetRequest.objects.filter(created__lt=now - settings.ALWAYSON_LOGIN_COOLOFF),
            "created",
        ),
        Rule("alwayson_web.LiveChange", LiveChange.objects.filter(Exists(newer)), "id"),
    ] + (
        [Rule("alwayson_web.LiveWatch", LiveWatch.objects.of_dead_listeners(), "id")]
        if connection.vendor == "postgresql"
        else []
    )
