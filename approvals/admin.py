"""Approvals and their audit in the console: view-only.

An approval is asked by a run (with its expiry timer) and answered on the approval page,
where the answer and the expiry compete for one inbox event key. Editing the row here would
bypass that race, so the console only shows it. The audit (every answer: who, when, from
which page, the action as it was shown, what it did, and the arguments as edited, a reason or
a reply with it) is listed with filters and exported as CSV, the filtered list or a
selection.

Both follow the inbox's roles (inbox.admin.InboxRoleMixin): operators with the model
permissions see every inbox's; a staff member of an inbox sees that inbox's only.
"""

import csv
import json
from datetime import UTC

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseBadRequest, StreamingHttpResponse
from django.urls import path

from inbox.admin import InboxRoleMixin, MachineryAdmin, excerpt

from .models import Approval, AuditEntry


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


class AuditInline(admin.TabularInline):
    model = AuditEntry
    fields = (
        "at",
        "username",
        "answer",
        "via",
        "result",
        "action_shown",
        "edited_arguments",
        "reason",
        "reply",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("id",)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return True  # shown on an approval's page, which checked who may see it


@admin.register(Approval)
class ApprovalAdmin(InboxRoleMixin, MachineryAdmin):
    list_display = (
        "request_id",
        "inbox",
        "action",
        "requested_at",
        "expires_at",
        "state",
        "approvers_needed",
        "answered_by",
        "answered_at",
    )
    # Only the inboxes that have approvals (and that this user may see), never all of them.
    list_filter = (StateFilter, ("inbox", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("inbox", "answered_by")
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
        "approvers_needed",
        "group",
        "details",
        "first_approved_by",
        "first_approved_at",
        "edited_arguments",
        "edited_by",
        "answer",
        "answered_by",
        "answered_at",
        "reason",
        "reply",
    )
    readonly_fields = fields
    inlines = (AuditInline,)
    managers_may_change = False

    @admin.display(description="answer", ordering="answer")
    def state(self, obj):
        return obj.get_answer_display() if obj.answer else "pending"


# The export's columns: (header, value of an entry).
AUDIT_COLUMNS = (
    ("at (UTC)", lambda e: e.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")),
    ("inbox", lambda e: e.inbox.slug),
    ("request", lambda e: e.approval.request_id),
    ("user", lambda e: e.username),
    ("answer", lambda e: e.answer),
    ("result", lambda e: e.get_result_display()),
    ("from", lambda e: e.get_via_display()),
    ("action as shown", lambda e: e.action_shown),
    ("approvers needed", lambda e: e.approval.approvers_needed),
    ("arguments asked", lambda e: _json(e.asked_arguments)),
    ("arguments as edited", lambda e: _json(e.edited_arguments)),
    ("reason", lambda e: e.reason),
    ("reply", lambda e: e.reply),
)


def _json(value) -> str:
    return "" if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


# A spreadsheet runs a cell starting with one of these as a formula; the action text comes
# from the agent, and through it from whoever wrote to the agent.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value) -> str:
    text = str(value)
    return f"'{text}" if text.startswith(FORMULA_START) else text


class _Echo:
    def write(self, value):
        return value


def audit_csv(queryset, filename="approval-audit.csv") -> StreamingHttpResponse:
    writer = csv.writer(_Echo())
    entries = queryset.select_related("inbox", "approval").order_by("at", "id")

    def rows():
        yield writer.writerow([header for header, _ in AUDIT_COLUMNS])
        for entry in entries.iterator(chunk_size=2000):
            yield writer.writerow([csv_cell(value(entry)) for _, value in AUDIT_COLUMNS])

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@admin.register(AuditEntry)
class AuditEntryAdmin(InboxRoleMixin, MachineryAdmin):
    """Every answer to every approval, and every expiry. Exported as CSV with the list's
    filters ("Export CSV"), or a selection (the action)."""

    change_list_template = "admin/approvals/auditentry/change_list.html"
    list_display = (
        "at",
        "inbox",
        "request",
        "username",
        "answer",
        "result",
        "via",
        "action_excerpt",
    )
    list_filter = (
        ("inbox", admin.RelatedOnlyFieldListFilter),
        "answer",
        "result",
        "via",
    )
    list_select_related = ("inbox", "approval")
    search_fields = ("=username", "approval__request_id", "=inbox__slug")
    search_help_text = "the exact user or inbox slug, or the request id (contains)"
    date_hierarchy = "at"
    ordering = ("-id",)
    fields = (
        "inbox",
        "approval",
        "user",
        "username",
        "answer",
        "via",
        "result",
        "action_shown",
        "edited_arguments",
        "reason",
        "reply",
        "at",
    )
    readonly_fields = fields
    actions = ("export_selected",)
    managers_may_change = False

    @admin.display(description="request", ordering="approval__request_id")
    def request(self, obj):
        return obj.approval.request_id

    @admin.display(description="action as shown")
    def action_excerpt(self, obj):
        return excerpt(obj.action_shown)

    @admin.action(description="Export selected entries as CSV", permissions=["view"])
    def export_selected(self, request, queryset):
        return audit_csv(queryset)

    def get_urls(self):
        export = self.admin_site.admin_view(self.export_view)
        return [
            path("export.csv", export, name="approvals_auditentry_export"),
            *super().get_urls(),
        ]

    def export_view(self, request):
        """The list as filtered and searched on the page, every page of it, as CSV."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponseBadRequest("unknown filter", content_type="text/plain")
        return audit_csv(changelist.get_queryset(request))
