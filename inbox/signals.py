from django.dispatch import Signal

# Sent inside the storing transaction, once, when an event is stored (never for a duplicate).
# Arguments: event, now. Apps that record an outcome alongside an event (approvals) listen
# here so the record commits or rolls back with the event itself.
event_stored = Signal()
