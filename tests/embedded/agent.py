"""The stranger's agent: a refund desk that asks before it refunds."""

import re
from datetime import timedelta

REFUND = re.compile(r"^refund (\w+)$", re.IGNORECASE)


def agent(run):
    for event in run.events:
        if event.source == "chat" and (refund := REFUND.match(event.payload["text"])):
            order = refund.group(1)
            run.ask(f"refund-{order}", f"refund order {order}", timedelta(hours=4))
            run.say(f"Refund order {order}? I have asked for approval.")
        elif event.source == "chat":
            run.say(f"Hello {event.payload['from']}.")
        elif event.source == "approval":
            order = event.source_id.removeprefix("refund-")
            answer, by = event.payload["answer"], event.payload["answered_by"]
            run.state.setdefault("answers", []).append(answer)
            if answer == "expired":
                run.say(f"Order {order}: nobody answered in time.")
            else:
                run.say(f"Order {order}: {answer}, by {by}.")
