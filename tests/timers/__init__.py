"""The timers app: one-off, recurring and cron timers, runscheduler."""
