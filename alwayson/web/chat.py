"""A person's chat message to their agent, as the conversation's form stores it.

An inbox event from source "chat", keyed by the id the form was rendered with (a double
submit is one event), with the payload `{"text": what they wrote, "from": their username}`:
what an agent reads in `event.payload` and what the conversation shows.
"""

from inbox import tracing
from inbox.services import ingest

CHAT_SOURCE = "chat"


def post_chat(inbox, message_id, text: str, sender, now=None) -> bool:
    """Store the message (the user `sender` wrote `text`); False for one already stored.

    Inside a PRODUCER span (messaging conventions: a message sent to the inbox) when tracing
    is on: the ingest stores its context with the event, and the run that answers continues
    its trace, as it does a webhook's (docs/how-to/tracing.md)."""
    payload = {"text": text, "from": sender.get_username()}
    with tracing.span(
        f"send {CHAT_SOURCE}",
        kind=tracing.trace.SpanKind.PRODUCER,
        messaging__operation__name="send",
        messaging__operation__type="send",
        messaging__destination__name=CHAT_SOURCE,
        alwayson__inbox=getattr(inbox, "slug", None),
    ) as current:
        stored = ingest(inbox, CHAT_SOURCE, str(message_id), payload, now=now)
        if current is not None:
            current.set_attribute("alwayson.duplicate", not stored)
        return stored
