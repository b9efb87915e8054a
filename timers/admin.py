"""Timers in the operator's console: created and edited through the same Schedule that
add_timer and the agent's run.schedule() use.

A plain form save would skip the schedule's checks (cron syntax, time zone, every-or-cron)
and could write a stale `due` over the scheduler's. Here the form builds a Schedule (its
errors become form errors) and the save applies it under the inbox's lease lock, like every
other write to an inbox. The Schedule refuses reserved keys (an approval's expiry timer's),
so the form does too. Approval expiry timers belong to their approval: view-only, and deleted
only with their inbox (an approval without its expiry would never resume the session).
"""

from django import forms
from django.contrib import admin
from django.db import transaction

from inbox import clock
from inbox.admin import deleting_inbox, pretty_json
from inbox.models import Lease

from .models import Timer
from .services import Schedule


class TimerForm(forms.ModelForm):
    due = forms.DateTimeField(
        required=False,
        help_text="UTC, e.g. 2026-12-01 09:00:00. Optional for cron: the next occurrence.",
    )

    class Meta:
        model = Timer
        fields = (
            "inbox",
            "key",
            "due",
            "every",
            "cron",
            "timezone",
            "policy",
            "catch_up_max",
            "payload",
        )

    def clean(self):
        data = super().clean()
        inbox = data.get("inbox") or getattr(self.instance, "inbox", None)
        key = data.get("key") or self.instance.key
        if inbox is None or not key or self.errors:
            return data
        try:
            self.schedule = Schedule(
                inbox.pk,
                key,
                due=data.get("due"),
                every=data.get("every"),
                cron=data.get("cron") or None,
                timezone=data.get("timezone") or "UTC",
                policy=data.get("policy") or Timer.Policy.COALESCE,
                catch_up_max=data.get("catch_up_max"),
                payload=data.get("payload") or {},
            )
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(Timer)
class TimerAdmin(admin.ModelAdmin):
    form = TimerForm
    show_full_result_count = False
    list_display = ("key", "inbox", "due", "schedule", "policy", "event_key", "done")
    list_filter = ("done", "policy", "inbox")
    list_select_related = ("inbox",)
    search_fields = ("key", "=inbox__slug")
    search_help_text = "key (contains) or the exact inbox slug"
    date_hierarchy = "due"
    autocomplete_fields = ("inbox",)
    readonly_fields = ("event_source", "event_id", "done", "payload_pretty")

    def get_readonly_fields(self, request, obj=None):
        # The (inbox, key) pair is the timer's identity, and its occurrences' event keys.
        return (*self.readonly_fields, "inbox", "key") if obj else self.readonly_fields

    def has_change_permission(self, request, obj=None):
        if obj is not None and obj.event_source:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.reserved and not deleting_inbox(request):
            return False
        return super().has_delete_permission(request, obj)

    def save_model(self, request, obj, form, change):
        with transaction.atomic():
            Lease.objects.select_for_update().get(inbox_id=form.schedule.inbox_id)
            saved = form.schedule(clock.database_now())
        obj.pk, obj.due, obj.done = saved.pk, saved.due, saved.done

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
