"""Agents the test kit's own tests run (tests/testing/), named by dotted path like an agent
author's."""

from datetime import timedelta

from inbox.services import ingest

FOLLOW_UP = timedelta(hours=1)
WINDOW = timedelta(hours=4)


def desk(run):
    """Replies to each chat message and counts them in the session; "later" sets a follow-up
    timer an hour on, "refund N" asks for approval (4 hours) and reports the answer."""
    for event in run.events:
        if event.source == "chat":
            text = event.payload["text"]
            run.state["seen"] = run.state.get("seen", 0) + 1
            if text.startswith("refund "):
                order = text.removeprefix("refund ")
                run.ask(f"refund-{order}", f"refund order {order}", WINDOW)
                run.say(f"Refund of order {order} waits for approval.", urgent=True)
            elif text == "later":
                run.schedule("follow-up", delay=FOLLOW_UP, payload={"about": text})
                run.say("I will follow up in an hour.")
            else:
                run.say(f"{event.payload['from']} said: {text}")
        elif event.source == "approval":
            answer = event.payload["answer"]
            if answer == "expired":
                run.say(f"Nobody answered {event.source_id}: nothing was refunded.")
            else:
                run.say(f"{event.source_id}: {answer} from {event.payload['answered_by']}")
        elif event.source == "timer":
            run.say(f"Following up ({event.source_id}, late by {event.payload['late_by']} s).")
        else:
            run.say(f"{event.source} {event.source_id}: {event.payload.get('type')}")


def broken(run):
    raise ValueError("the agent broke on purpose")


def restless(run):
    """Gives its batch back to be claimed at once, forever: a loop run_until_idle must stop."""
    run.defer("not yet", delay=timedelta(0))


def echo_and_feed_itself(run):
    """Says something, and stores another event in its own inbox outside the run, every run."""
    run.say("again")
    ingest(run.inbox, "self", f"again-{run.generation}", {})


# --- a tool for the Claude agent (ALWAYSON_CLAUDE_TOOLS = ["tests.support.kit_agents"]) ---------

from alwayson.claude import tool  # noqa: E402  (the agents above need no tools)


@tool(input_schema={"type": "object", "properties": {}})
def crash(call):
    """A tool with a bug: it raises, so the run fails before the model gets a result."""
    raise RuntimeError("the tool has a bug")
