"""Timers in the operator's console: view-only.

A timer is registered through add_timer, which checks the schedule (cron syntax, time zone,
every-or-cron, fixed event keys only for one-offs) and computes its first due time; the
scheduler then owns `due` and `done`. A form save would skip those checks and could write a
stale `due` over the scheduler's, so the console shows timers and leaves them alone.
"""

from django.contrib import admin

from inbox.admin import MachineryAdmin, pretty_json

from .models import Timer


@admin.register(Timer)
class TimerAdmin(MachineryAdmin):
    list_display = ("key", "inbox", "due", "schedule", "policy", "event_key", "done")
    list_filter = ("done", "policy", "inbox")
    list_select_related = ("inbox",)
    search_fields = ("key", "=inbox__slug")
    search_help_text = "key (contains) or the exact inbox slug"
    date_hierarchy = "due"
    fields = (
        "inbox",
        "key",
        "due",
        "every",
        "cron",
        "timezone",
        "policy",
        "catch_up_max",
        "event_source",
        "event_id",
        "done",
        "payload_pretty",
    )
    readonly_fields = fields

    @admin.display(description="schedule")
    def schedule(self, obj):
        if obj.every:
            return f"every {obj.every} s"
        if obj.cron:
            return f"cron {obj.cron} ({obj.timezone})"
        return "once"

    @admin.display(description="event key")
    def event_key(self, obj):
        return f"{obj.event_source}:{obj.event_id}" if obj.event_source else ""

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return pretty_json(obj.payload)
