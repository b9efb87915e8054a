"""The pages' tables in the admin: the password reset throttle's record.

The live pages' own tables (LiveChange, LiveWatch: alwayson/web/live.py) are not listed:
they are the pages' cursor and their LISTEN bookkeeping, written by triggers and hubs,
pruned by `prune`, and say nothing an operator acts on.
"""

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
