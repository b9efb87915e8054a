"""The example payments ledger and the loop processes in the operator's console, view-only.

A Refund row is the proof that a refund happened once; adding, editing or deleting one by
hand would make the ledger disagree with the payments it records. A Process row is what a
loop process says about itself (alwayson/health.py).
"""

from django.contrib import admin

from inbox import clock

from .models import Process, Refund


@admin.register(Refund)
class RefundAdmin(admin.ModelAdmin):
    list_display = ("order", "idempotency_key", "created")
    search_fields = ("=order", "idempotency_key")
    search_help_text = "the exact order, or the idempotency key (contains)"
    date_hierarchy = "created"
    ordering = ("-id",)
    show_full_result_count = False
    fields = ("order", "idempotency_key", "created")
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


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
class ProcessAdmin(admin.ModelAdmin):
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

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
