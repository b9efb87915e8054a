class UnknownInbox(LookupError):
    """Raised for an inbox slug or id that names no inbox; nothing was stored."""

    def __init__(self, ref):
        super().__init__(f"unknown inbox: {ref!r}")
        self.ref = ref
