from django.dispatch import Signal

# Sent once per stored event (never for a duplicate). Arguments: event, now. Inside the
# storing transaction when the caller holds one (answer_approval, the scheduler: store_event
# runs in theirs), so apps that record an outcome alongside an event (approvals) commit or
# roll back with it; a bare `ingest` commits its one statement first, then sends it.
# Sent on every delivery's hot path: the receivers are cached (Event is the only sender),
# and with none connected no Event is built for it.
event_stored = Signal(use_caching=True)

# Sent after event_stored, with the same arguments, for an event of a reserved source (a
# timer's tick, an approval's answer or expiry): the apps that own those sources record
# their outcome here (approvals, metrics). Apart from event_stored so that a delivery, whose
# source is never reserved, calls none of them.
reserved_event_stored = Signal()

# Sent inside claim_batch's transaction, under the inbox's lock, when events run out of
# attempts and are parked as dead: once per claim, with every event parked by it. Arguments:
# inbox_id, generation (the claim's), events (the rows as they were before parking: pending,
# each with its last error), now. What a receiver writes (the owner's alert) commits with the
# parking or not at all.
# An operator's mark_dead does not send it: that is a decision, not a failure.
events_dead = Signal()

# Sent inside the acquiring transaction when an acquire takes over a lease whose holder let
# it lapse (not one released or never held). Arguments: lease (before the takeover), now.
lease_taken_over = Signal()
