from django.dispatch import Signal

# Sent inside the transaction that creates an approval request (a run's finish, or
# request_approval), once per request. Arguments: approval, now. Whatever tells the
# approvers listens here, so the announcement commits or rolls back with the request.
approval_requested = Signal()
