from django.dispatch import Signal

# Sent inside the storing transaction, once, when an event is stored (never for a duplicate).
# Arguments: event, now. Apps that record an outcome alongside an event (approvals) listen
# here so the record commits or rolls back with the event itself.
event_stored = Signal()

# Sent inside the acquiring transaction when an acquire takes over a lease whose holder let
# it lapse (not one released or never held). Arguments: lease (before the takeover), now.
lease_taken_over = Signal()
