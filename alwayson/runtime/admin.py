"""Each inbox's configuration revisions: who changed what, when, shown as a diff."""

from django.contrib import admin
from django.utils.html import format_html

from inbox.admin import MachineryAdmin, pretty_json

from .models import AgentConfigRevision


@admin.register(AgentConfigRevision)
class AgentConfigRevisionAdmin(MachineryAdmin):
    """View only: a revision is history (or a proposal to replay), never edited."""

    list_display = ("inbox", "number", "author", "created", "proposed")
    list_select_related = ("inbox", "author")
    list_filter = ("proposed",)
    search_fields = ("=inbox__slug",)
    search_help_text = "the exact inbox slug"
    ordering = ("inbox__slug", "-number")
    fields = ("inbox", "number", "author", "created", "proposed", "changes", "config_shown")
    readonly_fields = fields

    @admin.display(description="changes since the revision before")
    def changes(self, obj):
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.diff() or "none")

    @admin.display(description="configuration")
    def config_shown(self, obj):
        return pretty_json(obj.config)
