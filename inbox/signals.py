from django.dispatch import Signal

# Sent inside the storing transaction, once, when an event is stored (never for a duplicate).
# Arguments: event, now. Apps that record an outcome alongside an event (approvals) listen
# here so the record commits or rolls back with the event itself.
event_stored = Signal()

# Sent inside claim_batch's transaction, under the inbox's lock, when events run out of
# attempts and are parked as dead: once per claim, with every event parked by it. Arguments:
# inbox_id, events (the rows as they were before parking: pending, each with its last error),
# now. What a receiver writes (the owner's alert) commits with the parking or not at all.
# An operator's mark_dead does not send it: that is a decision, not a failure.
events_dead = Signal()

# Sent inside the acquiring transaction when an acquire takes over a lease whose holder let
# it lapse (not one released or never held). Arguments: lease (before the takeover), now.
lease_taken_over = Signal()
