"""The example agent: a refund desk. No model call; the shape is what a real agent keeps.

- A chat message "refund order 881" asks the inbox's approvers for approval `refund-881`
  (4 hours); "refund order 881 for 750" says the amount, and above
  ALWAYSON_REFUND_TWO_APPROVERS_ABOVE (500) two different approvers must say yes. Any other
  message gets a short help text.
- The answer comes back as an event: "yes" refunds through the payments tool under an
  idempotency key and says so, naming who approved ("Refunded order 881, approved by Dana
  and Lee"); "no" and "expired" say nothing was refunded, and why.
- The daily digest timer sums up the last day, dead events included: a poison event nobody
  sees looks like an agent that went quiet.
"""

import re
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.utils.text import capfirst

from alwayson.demo import payments
from approvals.models import Approval, and_join, approval_url
from inbox.models import Event
from timers.services import add_timer

APPROVAL_WINDOW = timedelta(hours=4)
DIGEST_EVERY = 24 * 3600
REFUND_REQUEST = re.compile(r"\brefund\s+order\s+#?(\d+)\b", re.IGNORECASE)
# "... for 750", "... for $750.50", "... amount 1200": the amount, after the order number.
AMOUNT = re.compile(r"^\W*(?:for|of|amount)\W*?[$€£]?\s*(\d{1,9}(?:\.\d{1,2})?)\b", re.I)

UNCLEAR = object()  # what on_chat returns for a message it does not understand
HELP = (
    'I\'m the refund desk. Write "refund order" and the order number, for example '
    '"refund order 881", and I\'ll ask you to approve it before anything is refunded.'
)

NOT_REFUNDED = {
    "no": "Did not refund order {order}: the request was denied{by}.",
    "expired": "Did not refund order {order}: nobody approved it in time.",
    "expired-two": "Did not refund order {order}: it needed two approvers, and two did not"
    " approve it in time.",
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
    amount = AMOUNT.match(str(event.payload.get("text", ""))[match.end() :])
    action = f"refund order {order}" + (f" for {amount.group(1)}" if amount else "")
    limit = settings.ALWAYSON_REFUND_TWO_APPROVERS_ABOVE
    two = amount is not None and Decimal(amount.group(1)) > limit
    run.ask(request_id, action, APPROVAL_WINDOW, approvers=2 if two else 1)
    awaiting[request_id] = order
    link = approval_url(run.inbox.slug, request_id)
    if two:
        run.say(
            f"{capfirst(action)}? It is above {limit}, so two different approvers must"
            f" approve it within 4 hours: {link}",
            urgent=True,
        )
    else:
        run.say(f"{capfirst(action)}? Approve or deny within 4 hours: {link}", urgent=True)


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
    payload = event.payload
    answer = payload.get("answer")
    names = payload.get("names") or {}
    if answer == "yes":
        payments.refund(order, idempotency_key=run.key("refund", event))
        approvers = and_join(names.get(user, user) for user in payload.get("approved_by") or [])
        said = f"Refunded order {order}" + (f", approved by {approvers}" if approvers else "")
        run.say(said, urgent=True)
        return
    if answer == "expired" and payload.get("approvers_needed") == 2:
        answer = "expired-two"
    by = names.get(payload.get("answered_by"), payload.get("answered_by"))
    text = NOT_REFUNDED.get(answer, NOT_REFUNDED["no"])
    run.say(text.format(order=order, by=f" by {by}" if by else ""), urgent=True)


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
    return add_timer(inbox, "digest", first_digest_at, {"task": "daily digest"}, every=DIGEST_EVERY)
