class UnknownInbox(LookupError):
    """Raised for an inbox slug or id that names no inbox; nothing was stored."""

    def __init__(self, ref):
        super().__init__(f"unknown inbox: {ref!r}")
        self.ref = ref


class InboxBusy(Exception):
    """The inbox could not be reached in time; nothing was stored.

    Its lock stayed taken past ALWAYSON_INGEST_LOCK_WAIT (a worker frozen inside a
    transaction holds it until the database ends its idle session, longer than a webhook
    sender waits), or the statement was stopped before it was done (a statement timeout, a
    cancel), or its commit waited past the bound (on a lock another commit holds while it
    waits for a synchronous standby). Each is rolled back whole: the caller answers "try
    again" (a webhook 503 with Retry-After) and the sender's retry stores the event.
    """

    def __init__(self, inbox_id, waited, reason=None):
        reason = reason or f"its lock was not free within {waited:g}s"
        super().__init__(f"inbox {inbox_id} is busy: {reason}")
        self.inbox_id = inbox_id
        self.waited = waited
        self.reason = reason
