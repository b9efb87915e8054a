from django.dispatch import Signal

# Sent inside the firing transaction, once per timer fired. Arguments: timer, now, late_by
# (seconds from the timer's due time to `now`: how late the scheduler fired it).
timer_fired = Signal()
