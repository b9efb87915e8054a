"""Step 3 of the tutorial (docs/tutorial/first-agent.md): an agent that follows up."""

# --8<-- [start:agent]
from datetime import timedelta

FOLLOW_UP = timedelta(days=1)


def agent(run):
    for event in run.events:
        if event.source == "chat":
            on_chat(run, event)
        elif event.source == "timer":
            on_timer(run, event)


def on_chat(run, event):
    text = event.payload["text"]
    if text.lower().startswith("call me "):
        run.state["name"] = text[len("call me ") :].strip()
    run.state["messages"] = run.state.get("messages", 0) + 1
    name = run.state.get("name", event.payload["from"])
    run.say(f"Hello {name}, that is message {run.state['messages']}.")
    # One key: a new message moves the follow-up to a day after it.
    run.schedule("follow-up", delay=FOLLOW_UP)


def on_timer(run, event):
    name = run.state.get("name", "there")
    run.say(f"Hello {name}, is there anything else I can do?")


# --8<-- [end:agent]
