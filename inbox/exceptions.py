class UnknownInbox(LookupError):
    """Raised for an inbox slug or id that names no inbox; nothing was stored."""

    def __init__(self, ref):
        super().__init__(f"unknown inbox: {ref!r}")
        self.ref = ref


class InboxBusy(Exception):
    """The inbox could not be reached in time (its lock, a statement or the commit past
    the bound: docs/explanation/design.md, "A frozen lock holder is bounded twice"). Rolled
    back whole, nothing stored: the caller answers "try again" and the retry stores it.
    """

    def __init__(self, inbox_id, waited, reason=None):
        reason = reason or f"its lock was not free within {waited:g}s"
        super().__init__(f"inbox {inbox_id} is busy: {reason}")
        self.inbox_id = inbox_id
        self.waited = waited
        self.reason = reason
