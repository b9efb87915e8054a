"""The machinery's tables as rows, so a refused call can be shown to have changed nothing."""

from approvals.models import Approval
from inbox.models import Event, Inbox, Lease
from outbox.models import OutboxMessage
from timers.models import Timer

MODELS = (Inbox, Lease, Event, Timer, Approval, OutboxMessage)


def snapshot():
    """Every table's rows, so a refused call can be shown to have changed nothing."""
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in MODELS}
