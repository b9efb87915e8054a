"""The article's operations in one import: `from alwayson.runtime.api import ingest, acquire, ...`.

Each lives in the app that owns its tables; this module only gathers them.
"""

from approvals.services import answer_approval, answer_group, request_approval
from inbox.services import (
    Defer,
    Failed,
    Held,
    acquire,
    claim_batch,
    claim_more,
    finish,
    ingest,
    ingest_many,
)
from outbox.services import Say, dispatch, dispatch_inbox, dispatch_notices
from timers.services import add_timer, run_scheduler

__all__ = [
    "Defer",
    "Failed",
    "Held",
    "Say",
    "acquire",
    "add_timer",
    "answer_approval",
    "answer_group",
    "claim_batch",
    "claim_more",
    "dispatch",
    "dispatch_inbox",
    "dispatch_notices",
    "finish",
    "ingest",
    "ingest_many",
    "request_approval",
    "run_scheduler",
]
