"""The example payments ledger: a Refund row is the proof that a refund happened once."""

from django.contrib import admin

from inbox.admin import LedgerAdmin

from .models import Refund


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
