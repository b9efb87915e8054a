"""What `manage.py prune` may delete of the runtime's tables (alwayson/ops/retention.py)."""

from django.conf import settings
from django.db.models import Exists, OuterRef

from alwayson.ops.retention import Rule, days_before

from .models import SavedState


def rules(now) -> list[Rule]:
    """The states runs saved, once their runs' records are past ALWAYSON_RETAIN_RUN_RECORDS:
    each but the newest of its inbox before then, which the oldest run still recorded may
    have started from (a replay reads it)."""
    cutoff = days_before(now, settings.ALWAYSON_RETAIN_RUN_RECORDS)
    superseded = SavedState.objects.filter(
        inbox_id=OuterRef("inbox_id"), generation__gt=OuterRef("generation"), created__lt=cutoff
    )
    return [
        Rule(
            "alwayson.SavedState",
            SavedState.objects.filter(created__lt=cutoff).filter(Exists(superseded)),
            "created",
        )
    ]
