from django.contrib import admin

from inbox.admin import ViewOnlyAdmin

from .models import LiveChange, LiveWatch, PasswordResetRequest


@admin.register(PasswordResetRequest)
class PasswordResetRequestAdmin(ViewOnlyAdmin):
    """The password reset throttle's record (alwayson/web/views.py): who asked, when; view-only."""

    list_display = ("email", "created")
    search_fields = ("=email",)
    ordering = ("-id",)
    show_full_result_count = False
    fields = ("email", "created")
    readonly_fields = fields


@admin.register(LiveChange)
class LiveChangeAdmin(ViewOnlyAdmin):
    """The live pages' change log (alwayson/web/live.py): written by triggers; view-only."""

    list_display = ("id", "inbox", "kind")
    list_select_related = ("inbox",)
    list_filter = ("kind",)
    ordering = ("-id",)
    show_full_result_count = False
    fields = ("inbox", "kind")
    readonly_fields = fields


@admin.register(LiveWatch)
class LiveWatchAdmin(ViewOnlyAdmin):
    """Which inboxes the web processes' open pages watch (0: every inbox), by LISTEN backend:
    written by their hubs (alwayson/web/live.py); view-only."""

    list_display = ("inbox_id", "listener")
    ordering = ("inbox_id",)
    fields = ("inbox_id", "listener")
    readonly_fields = fields
