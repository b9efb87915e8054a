"""Step 2 of the tutorial (docs/tutorial/first-agent.md): an agent that remembers."""


# --8<-- [start:agent]
def agent(run):
    for event in run.events:
        if event.source == "chat":
            on_chat(run, event)


def on_chat(run, event):
    text = event.payload["text"]
    if text.lower().startswith("call me "):
        run.state["name"] = text[len("call me ") :].strip()
    run.state["messages"] = run.state.get("messages", 0) + 1
    name = run.state.get("name", event.payload["from"])
    run.say(f"Hello {name}, that is message {run.state['messages']}.")


# --8<-- [end:agent]
