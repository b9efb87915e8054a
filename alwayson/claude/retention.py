"""What `manage.py prune` may delete of the Claude agent's tables (alwayson/ops/retention.py)."""

from django.conf import settings

from alwayson.ops.retention import Rule, days_before, unfinished_run_since

from .models import ModelCall, ToolResult


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
    ]
