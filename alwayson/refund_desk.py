"""The example agent: a refund desk. No model call; the shape is what a real agent keeps.

- A chat message "refund order 881" asks the owner for approval `refund-881` (4 hours);
  any other message gets a short help text.
- The answer comes back as an event: "yes" refunds through the payments tool under an
  idempotency key and says so; "no" and "expired" say nothing was refunded, and why.
- The daily digest timer sums up the last day, dead events included: a poison event nobody
  sees looks like an agent that went quiet.
"""

import re
from datetime import timedelta

from approvals.models import Approval, approval_url
from inbox.models import Event

from . import payments

APPROVAL_WINDOW = timedelta(hours=4)
DIGEST_EVERY = 24 * 3600
REFUND_REQUEST = re.compile(r"\brefund\s+order\s+#?(\d+)\b", re.IGNORECASE)

UNCLEAR = object()  # what on_chat returns for a message it does not understand
HELP = (
    'I\'m the refund desk. Write "refund order" and the order number, for example '
    '"refund order 881", and I\'ll ask you to approve it before anything is refunded.'
)

NOT_REFUNDED = {
    "no": "Did not refund order {order}: the request was denied.",
    "expired": "Did not refund order {order}: nobody approved it in time.",
}


def agent(run):
    unclear = False
    for event in run.events:
        handler = HANDLERS.get(event.source)
        if handler and handler(run, event) is UNCLEAR:
            unclear = True
    if unclear:
        # A first-time user must never be met with silence: once per run, however many.
        run.say(HELP, urgent=True)


def on_chat(run, event):
    match = REFUND_REQUEST.search(str(event.payload.get("text", "")))
    if not match:
        return UNCLEAR
    order = match.group(1)
    awaiting = run.state.setdefault("awaiting", {})
    waiting = next((rid for rid, o in awaiting.items() if o == order), None)
    if waiting:
        link = approval_url(run.inbox.slug, waiting)
        run.say(f"Order {order} is already waiting for your answer: {link}", urgent=True)
        return
    request_id = new_request_id(run.inbox, order)
    run.ask(request_id, f"refund order {order}", APPROVAL_WINDOW)
    awaiting[request_id] = order
    link = approval_url(run.inbox.slug, request_id)
    run.say(f"Refund order {order}? Approve or deny within 4 hours: {link}", urgent=True)


def new_request_id(inbox, order):
    """refund-881 the first time; refund-881-2, -3... when the order is asked about again
    after an answer, since an answered request keeps its answer for good."""
    base = f"refund-{order}"
    used = Approval.objects.filter(inbox=inbox, request_id__startswith=base).values_list(
        "request_id", flat=True
    )
    if base not in used:
        return base
    return f"{base}-{len(used) + 1}"


def on_approval(run, event):
    request_id = event.source_id
    order = run.state.get("awaiting", {}).pop(request_id, None) or request_id.split("-")[1]
    answer = event.payload.get("answer")
    if answer == "yes":
        payments.refund(order, idempotency_key=run.key("refund", event))
        run.say(f"Refunded order {order}", urgent=True)
    else:
        run.say(NOT_REFUNDED.get(answer, NOT_REFUNDED["no"]).format(order=order), urgent=True)


def on_timer(run, event):
    if event.payload.get("task") != "daily digest":
        return
    # By when events settled, not when they arrived: an event that arrived before the last
    # digest and died after it must still be reported once.
    since = event.created - timedelta(days=1)
    recent = Event.objects.filter(inbox=run.inbox, updated__gte=since).exclude(pk=event.pk)
    done = recent.filter(status=Event.Status.DONE).count()
    dead = list(recent.filter(status=Event.Status.DEAD).order_by("id"))
    lines = [f"Daily digest: {done} event(s) handled, {len(dead)} dead."]
    lines += [f"- dead: {e.source}:{e.source_id} ({e.error})" for e in dead]
    run.say("\n".join(lines))


HANDLERS = {"chat": on_chat, "approval": on_approval, "timer": on_timer}


def install(inbox, first_digest_at):
    """Register the refund desk's daily digest for an inbox."""
    from timers.services import add_timer

    return add_timer(inbox, "digest", first_digest_at, {"task": "daily digest"}, every=DIGEST_EVERY)
