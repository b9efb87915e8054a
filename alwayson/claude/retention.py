"""What `manage.py prune` may delete of the Claude agent's tables (alwayson/ops/retention.py)."""

from django.conf import settings
from django.db.models import Exists, OuterRef

from alwayson.ops.retention import Rule, days_before, unfinished_run_since

from .models import MemoryVersion, ModelCall, ToolResult


def rules(now) -> list[Rule]:
    """The cached model answers and tool results, after ALWAYSON_RETAIN_MODEL_CALLS days,
    except those a run that may still be retried reads again."""
    cutoff = days_before(now, settings.ALWAYSON_RETAIN_MODEL_CALLS)
    return [
        Rule(
            "alwayson_claude.ModelCall",
            unfinished_run_since(ModelCall).filter(created__lt=cutoff),
            "created",
        ),
        Rule(
            "alwayson_claude.ToolResult",
            unfinished_run_since(ToolResult).filter(created__lt=cutoff),
            "created",
        ),
        *memory_rules(now),
    ]


def memory_rules(now) -> list[Rule]:
    """Memory versions after ALWAYSON_RETAIN_MEMORY_VERSIONS days, once a later version of the
    same file exists: a file's latest version stays (its page names who wrote it), and so do
    the files. Unset: kept forever."""
    days = settings.ALWAYSON_RETAIN_MEMORY_VERSIONS
    if days is None:
        return []
    later = MemoryVersion.objects.filter(
        inbox_id=OuterRef("inbox_id"), path=OuterRef("path"), pk__gt=OuterRef("pk")
    )
    old = MemoryVersion.objects.filter(created__lt=days_before(now, days)).filter(Exists(later))
    return [Rule("alwayson_claude.MemoryVersion", old, "created")]
