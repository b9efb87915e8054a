"""Step 4 of the tutorial (docs/tutorial/first-agent.md): an agent that asks first."""

# --8<-- [start:agent]
import re
from datetime import timedelta

FOLLOW_UP = timedelta(days=1)
APPROVAL_WINDOW = timedelta(hours=4)
REFUND = re.compile(r"^refund (\w+)$", re.IGNORECASE)


def agent(run):
    for event in run.events:
        if event.source == "chat":
            on_chat(run, event)
        elif event.source == "timer":
            on_timer(run, event)
        elif event.source == "approval":
            on_approval(run, event)


# --8<-- [end:agent]


# --8<-- [start:on_chat]
def on_chat(run, event):
    text = event.payload["text"]
    refund = REFUND.match(text)
    if refund:
        order = refund.group(1)
        # An answered request id cannot be asked again, and an order may come up twice:
        # the asking message's id makes each request's id new.
        run.ask(f"refund-{order}-{event.pk}", f"refund order {order}", APPROVAL_WINDOW)
        run.say(f"Refund order {order}? I have asked for approval.", urgent=True)
        return
    # --8<-- [end:on_chat]
    if text.lower().startswith("call me "):
        run.state["name"] = text[len("call me ") :].strip()
    run.state["messages"] = run.state.get("messages", 0) + 1
    name = run.state.get("name", event.payload["from"])
    run.say(f"Hello {name}, that is message {run.state['messages']}.")
    run.schedule("follow-up", delay=FOLLOW_UP)


def on_timer(run, event):
    name = run.state.get("name", "there")
    run.say(f"Hello {name}, is there anything else I can do?")


# --8<-- [start:on_approval]
def on_approval(run, event):
    order = event.source_id.split("-")[1]  # refund-<order>-<message>
    answer = event.payload["answer"]
    if answer == "yes":
        # The refund itself goes here, with idempotency_key=run.key("refund", event).
        run.say(f"Refunded order {order}, approved by {event.payload['answered_by']}.")
    elif answer == "no":
        run.say(f"The refund of order {order} was denied.")
    else:  # "expired": nobody answered in time
        run.say(f"Nobody approved the refund of order {order} in time: nothing was refunded.")


# --8<-- [end:on_approval]
