"""Step 1 of the tutorial (docs/tutorial/first-agent.md): an agent that answers."""


# --8<-- [start:agent]
def agent(run):
    for event in run.events:  # what this run claimed of the inbox, oldest first
        if event.source == "chat":
            run.say(f"Hello {event.payload['from']}, you said: {event.payload['text']}")


# --8<-- [end:agent]
