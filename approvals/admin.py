"""Approvals in the operator's console: view-only.

An approval is asked by a run (with its expiry timer) and answered on the approval page,
where the answer and the expiry compete for one inbox event key. Editing the row here would
bypass that race, so the console only shows it.
"""

from django.contrib import admin

from inbox.admin import MachineryAdmin

from .models import Approval


class StateFilter(admin.SimpleListFilter):
    title = "answer"
    parameter_name = "answer"

    def lookups(self, request, model_admin):
        return (("pending", "waiting for an answer"), *Approval.Answer.choices)

    def queryset(self, request, queryset):
        value = self.value()
        if value == "pending":
            return queryset.filter(answer="")
        if value in Approval.Answer.values:
            return queryset.filter(answer=value)
        return queryset


@admin.register(Approval)
class ApprovalAdmin(MachineryAdmin):
    list_display = (
        "request_id",
        "inbox",
        "action",
        "requested_at",
        "expires_at",
        "state",
        "answered_at",
    )
    list_filter = (StateFilter, "inbox")
    list_select_related = ("inbox",)
    search_fields = ("request_id", "=inbox__slug")
    search_help_text = "request id (contains) or the exact inbox slug"
    date_hierarchy = "requested_at"
    ordering = ("-id",)  # the primary key: no sort of the whole table for page one
    fields = (
        "inbox",
        "request_id",
        "action",
        "requested_at",
        "expires_at",
        "answer",
        "answered_at",
    )
    readonly_fields = fields

    @admin.display(description="answer", ordering="answer")
    def state(self, obj):
        return obj.get_answer_display() if obj.answer else "pending"
