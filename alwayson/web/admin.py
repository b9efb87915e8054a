from django.contrib import admin

from inbox.admin import ViewOnlyAdmin

from .models import PasswordResetRequest


@admin.register(PasswordResetRequest)
class PasswordResetRequestAdmin(ViewOnlyAdmin):
    """The password reset throttle's record (alwayson/web/views.py): who asked, when; view-only."""

    list_display = ("email", "created")
    search_fields = ("=email",)
    ordering = ("-id",)
    show_full_result_count = False
    fields = ("email", "created")
    readonly_fields = fields
