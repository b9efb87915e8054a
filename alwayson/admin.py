"""The example payments ledger in the operator's console: view-only, never deleted.

A row is the proof that a refund happened once; adding, editing or deleting one by hand
would make the ledger disagree with the payments it records.
"""

from django.contrib import admin

from .models import PasswordResetRequest, Refund


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


@admin.register(PasswordResetRequest)
class PasswordResetRequestAdmin(admin.ModelAdmin):
    """The password reset throttle's record (alwayson/views.py): who asked, when; view-only."""

    list_display = ("email", "created")
    search_fields = ("=email",)
    ordering = ("-id",)
    show_full_result_count = False
    fields = ("email", "created")
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
