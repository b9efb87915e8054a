from django.dispatch import Signal

# Sent once a send went out: at least once, inside the transaction that marks its rows sent;
# at most once, after the send. Arguments: messages (the send's rows), at (their sent_at).
messages_sent = Signal()
