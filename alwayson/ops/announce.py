"""Telling the approvers: a new approval request becomes one notice per approver.

The approvals app sends `approval_requested` inside the transaction that creates the request
(for an agent's `run.ask`, the run's fenced finish); the notices are made there too, so they
commit with the request or not at all, and the unique (inbox, topic, recipient) makes each
one once per approval. The dispatcher sends them (outbox.services.dispatch_notices).

The owner is not among them: the owner hears from the agent itself, through the inbox's
channel, as before.
"""

from approvals.models import approval_url
from inbox.models import Role
from outbox.services import queue_notice


def approval_topic(request_id) -> str:
    return f"approval:{request_id}"


def announce_approval(sender, approval, now, **kwargs):
    inbox = approval.inbox
    people = inbox.people_with_role(Role.APPROVER).exclude(pk=inbox.owner_id).order_by("pk")
    for person in people:
        queue_notice(
            inbox.pk,
            person,
            approval_topic(approval.request_id),
            f"[{inbox.slug}] Approval needed: {approval.shown_action}",
            notice_body(approval, person, now),
            now,
        )


def notice_body(approval, person, now) -> str:
    inbox = approval.inbox
    two = "Two different approvers must approve it. " if approval.needs_two else ""
    return (
        f"{person.get_short_name() or person.get_username()},\n\n"
        f"the agent of {inbox.name or inbox.slug} asks for approval:\n\n"
        f"{approval.shown_action}\n\n"
        f"{two}Approve or deny before {approval.expires_at:%Y-%m-%d %H:%M} UTC"
        f" ({approval.time_left(now)} from when it was asked):\n"
        f"{approval_url(inbox.slug, approval.request_id)}\n\n"
        f"You get this email because you are an approver of {inbox.slug}."
    )
