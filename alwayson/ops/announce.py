"""Telling the approvers: a new approval request becomes one notice per approver.

The approvals app sends `approval_requested` inside the transaction that creates the request
(for an agent's `run.ask`, the run's fenced finish); the notices are made there too, so they
commit with the request or not at all, and the unique (inbox, topic, recipient) makes each
one once per approval. The dispatcher sends them (outbox.services.dispatch_notices).

The owner is not among them: the owner hears from the agent itself, through the inbox's
channel.

The calls a model asked in one turn (a group, answered on one page) are one notice per
person: each member's request, made in the same transaction, rewrites the notice held for the
group so it lists them all, and it links the group's page.
"""

from approvals.models import Approval, approval_url, short_name
from inbox.models import Role
from outbox.models import Notice
from outbox.services import queue_notice


def approval_topic(request_id) -> str:
    return f"approval:{request_id}"


def announce_approval(sender, approval, now, **kwargs):
    inbox = approval.inbox
    people = inbox.people_with_role(Role.APPROVER).exclude(pk=inbox.owner_id).order_by("pk")
    if approval.group:
        announce_group(approval, people, now)
        return
    for person in people:
        queue_notice(
            inbox.pk,
            person,
            approval_topic(approval.request_id),
            f"[{inbox.slug}] Approval needed: {approval.shown_action}",
            notice_body(approval, person, now),
            now,
        )


def announce_group(approval, people, now):
    inbox = approval.inbox
    calls = list(Approval.objects.filter(inbox_id=inbox.pk, group=approval.group).order_by("id"))
    topic = approval_topic(approval.group)
    subject = f"[{inbox.slug}] Approval needed: {len(calls)} calls of one turn"
    for person in people:
        body = group_notice_body(inbox, calls, person, now)
        if not queue_notice(inbox.pk, person, topic, subject, body, now):
            # Made for an earlier call of the group in this transaction: it lists them all now.
            Notice.objects.held().filter(inbox_id=inbox.pk, topic=topic, recipient=person).update(
                subject=subject[:200], body=body
            )


def notice_body(approval, person, now) -> str:
    inbox = approval.inbox
    two = "Two different approvers must approve it. " if approval.needs_two else ""
    return (
        f"{short_name(person)},\n\n"
        f"the agent of {inbox.name or inbox.slug} asks for approval:\n\n"
        f"{approval.shown_action}\n\n"
        f"{two}Approve or deny before {approval.expires_at:%Y-%m-%d %H:%M} UTC"
        f" ({approval.time_left(now)} from when it was asked):\n"
        f"{approval_url(inbox.slug, approval.request_id)}\n\n"
        f"You get this email because you are an approver of {inbox.slug}."
    )


def group_notice_body(inbox, calls, person, now) -> str:
    lead = calls[0]
    listed = "\n".join(
        f"- {call.shown_action}" + (" (two different approvers)" if call.needs_two else "")
        for call in calls
    )
    return (
        f"{short_name(person)},\n\n"
        f"the agent of {inbox.name or inbox.slug} asks for approval of {len(calls)} calls"
        f" it made in one turn:\n\n{listed}\n\n"
        f"Answer them one by one or all at once before {lead.expires_at:%Y-%m-%d %H:%M} UTC"
        f" ({lead.time_left(now)} from when they were asked):\n"
        f"{approval_url(inbox.slug, lead.request_id)}\n\n"
        f"You get this email because you are an approver of {inbox.slug}."
    )
