"""People's pages as the tests read them: the approval page's address, an approval to show,
every row a page could change, the response's text and its chat form's message id."""

import re
from datetime import timedelta

from approvals.models import Approval, AuditEntry
from approvals.services import request_approval
from inbox.models import Event, Lease, Membership, Session
from outbox.models import Notice, OutboxMessage
from timers.models import Timer

WINDOW = timedelta(hours=4)


def detail_url(inbox_slug, request_id):
    return f"/approvals/{inbox_slug}/{request_id}/"


def ask(inbox, request_id="refund-881", action="refund order 881"):
    return request_approval(inbox, request_id, action, WINDOW)


def snapshot():
    """Every row the pages could change, so "nothing changed" means exactly that."""
    return {
        model.__name__: list(model.objects.order_by("pk").values())
        for model in (
            Event,
            Approval,
            AuditEntry,
            Timer,
            OutboxMessage,
            Notice,
            Lease,
            Session,
            Membership,
        )
    }


def text_of(response):
    return response.content.decode()


def message_id_of(response):
    match = re.search(r'name="message_id" value="([0-9a-f-]{36})"', text_of(response))
    assert match, "the chat form carries a generated message_id"
    return match.group(1)
