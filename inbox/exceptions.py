class UnknownInbox(LookupError):
    """Raised for an inbox slug or id that names no inbox; nothing was stored."""

    def __init__(self, ref):
        super().__init__(f"unknown inbox: {ref!r}")
        self.ref = ref


class InboxBusy(Exception):
    """The inbox's lock stayed taken past ALWAYSON_INGEST_LOCK_WAIT; nothing was stored.

    A worker frozen inside a transaction holds that lock until the database ends its idle
    session, longer than a webhook sender waits: the caller answers "try again" (a webhook
    503 with Retry-After) and the sender's retry stores the event.
    """

    def __init__(self, inbox_id, waited):
        super().__init__(f"inbox {inbox_id} is busy: its lock was not free within {waited:g}s")
        self.inbox_id = inbox_id
        self.waited = waited
