"""A stored event: the row an insert answers, the Event it is without reading it back, and
the channel a stored event wakes workers on.

How events are stored is each database's (inbox/backends/).
"""

import functools
from datetime import datetime
from typing import NamedTuple

from django.db import DEFAULT_DB_ALIAS
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from .models import Event

# Idle workers LISTEN here; a stored event NOTIFYs with its inbox id (sent at commit).
WORK_CHANNEL = "alwayson_work"


class Stored(NamedTuple):
    """An event row the statement inserted."""

    id: int
    source: str
    source_id: str
    at: datetime


@functools.cache
def _event_attnames():
    return {field.attname for field in Event._meta.concrete_fields}


def as_event(inbox_id, row: Stored, payload) -> Event:
    """The Event a stored row is, without reading it back (for event_stored's receivers)."""
    values = {
        "id": row.id,
        "inbox_id": inbox_id,
        "source": row.source,
        "source_id": row.source_id,
        "payload": payload,
        "status": Event.Status.PENDING,
        "attempts": 0,
        "claim_gen": None,
        "error": "",
        "available_at": row.at,
        "created": row.at,
        "updated": row.at,
    }
    # Listeners to the init signals are looked for only when some signal has any at all:
    # has_listeners takes a lock, and this runs for every stored event.
    if (
        (pre_init.receivers and pre_init.has_listeners(Event))
        or (post_init.receivers and post_init.has_listeners(Event))
        or values.keys() != _event_attnames()
    ):
        event = Event(**values)
    else:
        # As unpickling makes one: the same instance, without Model.__init__'s pass over
        # every field and its two signals, which nobody listens to here (checked above).
        event = Event.__new__(Event)
        event.__dict__.update(values)
        event._state = ModelState()
    event._state.adding = False
    event._state.db = DEFAULT_DB_ALIAS
    return event
