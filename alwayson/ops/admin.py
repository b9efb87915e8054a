"""The loop processes from their heartbeats, the dead-event alerts and the metric totals:
rows the processes write about themselves, view-only."""

from django.contrib import admin

from inbox import clock
from inbox.admin import LedgerAdmin

from .models import DeadAlert, MetricTotal, Process


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

    # No pid or host column: the worker id is host:pid unless --worker-id named it, the
    # filters list the hosts, and the row's page has both. Eight columns fitted beside the
    # two sidebars at 1280px by a pixel or two, or not at all, as Django's styles changed.
    list_display = (
        "kind",
        "state_label",
        "worker_id",
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
    """Each inbox's dead-event alerts (alwayson/ops/alerts.py): when its operators were last told,
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
