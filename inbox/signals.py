from django.dispatch import Signal

# Sent once per stored event (never for a duplicate). Arguments: event, now. Inside the
# storing transaction when the caller holds one (answer_approval, the scheduler: store_event
# runs in theirs), so apps that record an outcome alongside an event (approvals) commit or
# roll back with it; a bare `ingest` commits its one statement first, then sends it.
event_stored = Signal()
