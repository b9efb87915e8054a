"""The composition root's console: the example payments ledger, each inbox's agent
configuration and outbound services, what the Claude agent paid for and ran, the egress
gateway's audit, and the loop processes (alwayson/health.py).

The ledger, the egress audit, the model calls and the processes are view-only: a Refund row
is the proof that a refund happened once, an egress row is what an agent asked to call, and a
Process row is what a loop process says about itself.
"""

from collections import Counter
from datetime import timedelta

from django.conf import settings
from django.contrib import admin
from django.db.models import Count, OuterRef, Subquery, Sum
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from inbox import clock
from inbox.admin import InboxAdmin, MachineryAdmin, pretty_json
from inbox.clock import day_start
from inbox.models import Inbox

from .models import (
    TOTAL_TOKENS,
    AgentConfig,
    DeadAlert,
    EgressCall,
    MetricTotal,
    ModelCall,
    PasswordResetRequest,
    Process,
    Refund,
    ToolResult,
)


class ViewOnlyAdmin(admin.ModelAdmin):
    """Rows only the code writes: listed and shown, never added or edited by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class LedgerAdmin(ViewOnlyAdmin):
    """A record that is proof of something that happened: not deleted by hand either."""

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Refund)
class RefundAdmin(LedgerAdmin):
    list_display = ("order", "idempotency_key", "created")
    search_fields = ("=order", "idempotency_key")
    search_help_text = "the exact order, or the idempotency key (contains)"
    date_hierarchy = "created"
    ordering = ("-id",)
    show_full_result_count = False
    fields = ("order", "idempotency_key", "created")
    readonly_fields = fields


@admin.register(EgressCall)
class EgressCallAdmin(ViewOnlyAdmin):
    """The egress gateway's audit: what agents asked to call, and what was refused. Written
    by the gateway only; it never holds a credential, a query string or a body."""

    list_display = ("at", "inbox", "service", "method", "path", "outcome", "status", "error")
    list_filter = ("outcome", "service")
    list_select_related = ("inbox",)
    search_fields = ("=service", "path")
    ordering = ("-id",)
    show_full_result_count = False
    readonly_fields = list_display


@admin.register(PasswordResetRequest)
class PasswordResetRequestAdmin(ViewOnlyAdmin):
    """The password reset throttle's record (alwayson/views.py): who asked, when; view-only."""

    list_display = ("email", "created")
    search_fields = ("=email",)
    ordering = ("-id",)
    show_full_result_count = False
    fields = ("email", "created")
    readonly_fields = fields


def egress_summary(inbox, now) -> list[tuple[str, int, int, int]]:
    """(service, sent, refused, failed) in the last day, for each service this inbox may
    call or did call."""
    counts = {
        name: Counter()
        for name, service in settings.ALWAYSON_EGRESS_SERVICES.items()
        if service.allows_inbox(inbox.slug)
    }
    rows = (
        EgressCall.objects.filter(inbox=inbox, at__gte=now - timedelta(days=1))
        .values_list("service", "outcome")
        .annotate(n=Count("id"))
        .order_by()
    )
    for service, outcome, n in rows:
        counts.setdefault(service, Counter())[outcome] += n
    return [(name, c["sent"], c["refused"], c["failed"]) for name, c in sorted(counts.items())]


admin.site.unregister(Inbox)


@admin.register(Inbox)
class InboxWithEgressAdmin(InboxAdmin):
    readonly_fields = (*InboxAdmin.readonly_fields, "outbound_services")

    @admin.display(description="outbound services (last day)")
    def outbound_services(self, obj):
        if obj is None or obj.pk is None:
            return "-"
        services = settings.ALWAYSON_EGRESS_SERVICES
        rows = egress_summary(obj, clock.database_now())
        if not rows:
            return "none: this inbox's agent can make no outbound call"
        return format_html_join(
            "\n",
            "<div><code>{}</code>: {} sent, {} refused, {} failed</div>",
            (
                (services[name].describe() if name in services else name, sent, refused, failed)
                for name, sent, refused, failed in rows
            ),
        )


@admin.register(AgentConfig)
class AgentConfigAdmin(admin.ModelAdmin):
    """Which agent each inbox runs and how: edited here, checked by AgentConfig.clean() (an
    agent that cannot be loaded, an unknown tool, a malformed policy are refused with the
    reason). The worker reads it at the start of every run."""

    list_display = ("inbox", "agent_shown", "model_shown", "daily_token_budget", "tokens_today")
    list_select_related = ("inbox",)
    search_fields = ("=inbox__slug", "agent", "model")
    search_help_text = "the exact inbox slug, the agent or the model (contains)"
    autocomplete_fields = ("inbox",)
    ordering = ("inbox__slug",)
    readonly_fields = ("updated", "tokens_today")
    fields = (
        "inbox",
        "agent",
        "model",
        "system_prompt",
        "tools",
        "policy",
        "daily_token_budget",
        "approval_window",
        "tokens_today",
        "updated",
    )

    def get_readonly_fields(self, request, obj=None):
        return (*self.readonly_fields, "inbox") if obj else self.readonly_fields

    def get_queryset(self, request):
        # Today's tokens in the same query as the rows, not one query per row.
        spent = (
            ModelCall.objects.filter(
                inbox_id=OuterRef("inbox_id"), created__gte=day_start(clock.database_now())
            )
            .values("inbox_id")
            .annotate(total=Sum(TOTAL_TOKENS))
            .values("total")
        )
        return super().get_queryset(request).annotate(spent_today=Subquery(spent))

    @admin.display(description="agent")
    def agent_shown(self, obj):
        return obj.agent or f"{settings.ALWAYSON_AGENT} (default)"

    @admin.display(description="model")
    def model_shown(self, obj):
        return obj.model or f"{settings.ALWAYSON_CLAUDE_MODEL} (default)"

    @admin.display(description="tokens today (UTC)")
    def tokens_today(self, obj):
        return getattr(obj, "spent_today", None) or 0


@admin.register(ModelCall)
class ModelCallAdmin(MachineryAdmin):
    """Every answer of the Messages API: its usage, and the cache a retried run reads."""

    list_display = (
        "created",
        "inbox",
        "run",
        "model",
        "stop_reason",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "total",
    )
    list_filter = ("inbox", "model")
    list_select_related = ("inbox",)
    search_fields = ("=inbox__slug", "=request_key")
    search_help_text = "the exact inbox slug or request key"
    date_hierarchy = "created"
    ordering = ("-id",)
    fields = (
        "inbox",
        "generation",
        "model",
        "stop_reason",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "created",
        "request_key",
        "response_pretty",
    )
    readonly_fields = fields

    @admin.display(description="run (generation)", ordering="generation")
    def run(self, obj):
        url = reverse(f"{self.admin_site.name}:alwayson_modelcall_changelist")
        return format_html(
            '<a href="{}?inbox__id__exact={}&amp;generation={}">{}</a>',
            url,
            obj.inbox_id,
            obj.generation,
            obj.generation,
        )

    @admin.display(description="total tokens")
    def total(self, obj):
        return obj.total_tokens

    @admin.display(description="response")
    def response_pretty(self, obj):
        return pretty_json(obj.response)

    def lookup_allowed(self, lookup, value, request=None):
        # The "run" link filters one inbox's calls by generation.
        return lookup == "generation" or super().lookup_allowed(lookup, value, request)


@admin.register(ToolResult)
class ToolResultAdmin(MachineryAdmin):
    """Every application tool call the Claude agent ran, under its idempotency key."""

    list_display = ("created", "inbox", "tool", "approved", "generation", "idempotency_key")
    list_filter = ("tool", "approved", "inbox")
    list_select_related = ("inbox",)
    search_fields = ("=inbox__slug", "idempotency_key")
    search_help_text = "the exact inbox slug, or the idempotency key (contains)"
    date_hierarchy = "created"
    ordering = ("-id",)
    fields = (
        "inbox",
        "tool",
        "approved",
        "generation",
        "idempotency_key",
        "created",
        "arguments_pretty",
        "result_pretty",
    )
    readonly_fields = fields

    @admin.display(description="arguments")
    def arguments_pretty(self, obj):
        return pretty_json(obj.arguments)

    @admin.display(description="result")
    def result_pretty(self, obj):
        return pretty_json(obj.result)


class ProcessStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return Process.State.choices

    def queryset(self, request, queryset):
        if self.value() in Process.State.values:
            return queryset.filter(state=self.value())
        return queryset


@admin.register(Process)
class ProcessAdmin(LedgerAdmin):
    """The loop processes, live, lost and stopped, from their heartbeats: read-only, like
    django-q2's monitor or Sidekiq's process page. A row is the process's own record."""

    list_display = (
        "kind",
        "state_label",
        "worker_id",
        "host",
        "pid",
        "started",
        "last_beat",
        "runs",
        "version",
    )
    list_filter = (ProcessStateFilter, "kind", "host")
    search_fields = ("worker_id", "host")
    ordering = ("-last_beat",)
    show_full_result_count = False
    fields = (
        "kind",
        "worker_id",
        "host",
        "pid",
        "version",
        "started",
        "last_beat",
        "stopped",
        "runs",
    )
    readonly_fields = fields

    def get_queryset(self, request):
        # One clock reading per page, the database's, the one the processes beat with.
        return super().get_queryset(request).with_state(clock.database_now())

    @admin.display(description="state", ordering="state")
    def state_label(self, obj):
        return obj.state


@admin.register(DeadAlert)
class DeadAlertAdmin(LedgerAdmin):
    """Each inbox's dead-event alerts (alwayson/alerts.py): when its owner was last told,
    and what went dead since. Written only with the events' parking and by the dispatcher."""

    list_display = ("inbox", "last_alert_at", "alerts", "unreported", "last_error")
    list_select_related = ("inbox",)
    search_fields = ("inbox__slug",)
    ordering = ("-last_alert_at",)
    fields = ("inbox", "last_alert_at", "alerts", "unreported", "keys", "last_error")
    readonly_fields = fields


@admin.register(MetricTotal)
class MetricTotalAdmin(LedgerAdmin):
    """The running totals behind /metrics' counters and histograms: shown, never edited or
    deleted by hand (a histogram's bucket rows and its sum move together)."""

    list_display = ("name", "labels", "bucket", "value")
    list_filter = ("name",)
    ordering = ("name", "labels", "bucket")
