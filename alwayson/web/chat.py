"""A person's chat message to their agent, as the conversation's form stores it.

An inbox event from source "chat", keyed by the id the form was rendered with (a double
submit is one event), with the payload `{"text": what they wrote, "from": their username}`:
what an agent reads in `event.payload` and what the conversation shows.
"""

from inbox.services import ingest

CHAT_SOURCE = "chat"


def post_chat(inbox, message_id, text: str, sender, now=None) -> bool:
    """Store the message (the user `sender` wrote `text`); False for one already stored."""
    payload = {"text": text, "from": sender.get_username()}
    return ingest(inbox, CHAT_SOURCE, str(message_id), payload, now=now)
