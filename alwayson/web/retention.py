"""What `manage.py prune` may delete of the pages' tables (alwayson/ops/retention.py)."""

from django.conf import settings

from alwayson.ops.retention import Rule

from .models import PasswordResetRequest


def rules(now) -> list[Rule]:
    """Password reset requests past the login cool-off count for nothing."""
    return [
        Rule(
            "alwayson_web.PasswordResetRequest",
            PasswordResetRequest.objects.filter(created__lt=now - settings.ALWAYSON_LOGIN_COOLOFF),
            "created",
        )
    ]
