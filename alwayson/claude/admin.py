"""What the Claude agent paid for and ran, and each inbox's agent configuration."""

import difflib
import json

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db.models import OuterRef, Subquery, Sum
from django.forms.models import BaseInlineFormSet, InlineForeignKeyField
from django.urls import reverse
from django.utils.html import format_html

from alwayson.runtime.models import AgentConfig
from alwayson.runtime.policy import check_policy_syntax
from alwayson.runtime.tools import mcp_servers_of
from inbox import clock
from inbox.admin import MachineryAdmin, ViewOnlyAdmin, pretty_json, record_history
from inbox.clock import day_start
from inbox.models import Inbox

from . import mcp
from .conversations import reset_conversations
from .models import (
    TOTAL_TOKENS,
    McpToolDefinition,
    MemoryFile,
    MemoryVersion,
    ModelCall,
    ModelSettings,
    ToolResult,
)


class EditedConfig(InlineForeignKeyField):
    """The inline's link to its configuration: the one edited on the same page, even before
    it is saved (Django's gives none to a primary key on the add page), so that the settings
    are checked against the tools the person is saving. InlineForeignKeyField is Django's
    own, not documented: tests/claude/test_claude_config.py's admin cases that name a tool
    on the add page fail if it changes."""

    def clean(self, value):
        super().clean(value)  # refuses a key that is not the page's configuration
        return self.parent_instance


class ModelSettingsFormSet(BaseInlineFormSet):
    def add_fields(self, form, index):
        super().add_fields(form, index)
        form.fields[self.fk.name] = EditedConfig(self.instance, pk_field=True)


class ModelSettingsInline(admin.StackedInline):
    """The Messages API settings, on the configuration's page: checked by
    ModelSettings.clean() against the tools the page offers."""

    model = ModelSettings
    formset = ModelSettingsFormSet
    fields = ("max_tokens", "temperature", "thinking_budget", "tool_choice")
    extra = 1
    max_num = 1
    can_delete = False


# What a person edits on an agent configuration's page: the form's fields and the admin's. The
# inbox, then every field a revision keeps: whatever a person changes there changes what the
# agent does, so it makes a revision (a field added to one list and not the other drifted).
EDITED_FIELDS = ("inbox", *AgentConfig.REVISED_FIELDS)


class AgentConfigForm(forms.ModelForm):
    """AgentConfig.clean() checks a rule for an MCP tool for its syntax only (the runtime
    knows no server's schema); here, in the Claude app, against the definition approved."""

    class Meta:
        model = AgentConfig
        fields = EDITED_FIELDS
        # The name the docs use; the field's own would read "Mcp servers".
        labels = {"mcp_servers": "MCP servers"}

    def clean(self):
        cleaned = super().clean()
        try:
            policy = check_policy_syntax(cleaned.get("policy"))
            servers = mcp_servers_of(cleaned.get("mcp_servers"))
        except ValueError:
            return cleaned  # the model's clean() says what is wrong
        try:
            mcp.check_rules_against_definitions(policy, servers)
        except ValueError as exc:
            self.add_error("policy", str(exc))
        return cleaned


@admin.register(AgentConfig)
class AgentConfigAdmin(admin.ModelAdmin):
    """Which agent each inbox runs and how: edited here, checked by AgentConfig.clean() and,
    inline, ModelSettings.clean() (an agent that cannot be loaded, an unknown tool, a
    malformed policy, model settings the API would refuse are refused with the reason). The
    worker reads it at the start of every run. The "reset the conversation" action clears an
    inbox's session state, under its lock."""

    form = AgentConfigForm
    list_display = (
        "inbox",
        "agent_shown",
        "model_shown",
        "mid_run",
        "daily_token_budget",
        "tokens_today",
    )
    list_select_related = ("inbox",)
    search_fields = ("=inbox__slug", "agent", "model")
    search_help_text = "the exact inbox slug, the agent or the model (contains)"
    autocomplete_fields = ("inbox",)
    ordering = ("inbox__slug",)
    readonly_fields = ("updated", "tokens_today", "revisions")
    actions = ["reset_conversation"]
    inlines = [ModelSettingsInline]
    fields = (*EDITED_FIELDS, "tokens_today", "updated", "revisions")

    def save_model(self, request, obj, form, change):
        # One revision for the page, model settings included, once the inline is saved too.
        obj.save(revise=False)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        # The revision a change makes names who made it (alwayson/runtime/models.py).
        form.instance.revise(by=request.user)

    @admin.display(description="revisions")
    def revisions(self, obj):
        if not obj.pk:
            return ""
        url = reverse("admin:alwayson_agentconfigrevision_changelist")
        return format_html(
            '<a href="{}?q={}">revision {} in force; every revision, with its diff</a>',
            url,
            obj.inbox.slug,
            obj.revision,
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

    @admin.action(
        description="Reset the conversation of the selected inboxes", permissions=["change"]
    )
    def reset_conversation(self, request, queryset):
        resets = reset_conversations(Inbox.objects.filter(agent_config__in=queryset))
        done = queryset.filter(inbox__slug__in=resets.reset).values_list("pk", flat=True)
        record_history(
            request, AgentConfig, list(done), "Conversation reset: the session state cleared."
        )
        parts = [f"Reset the conversation of {len(resets.reset)} inbox(es)"]
        parts[0] += f": {', '.join(resets.reset)}." if resets.reset else "."
        if resets.empty:
            parts.append(f"Nothing to reset in {', '.join(resets.empty)}.")
        if resets.busy:
            parts.append(
                f"Left alone while a run works on it or its events are due (try again in a "
                f"moment): {', '.join(resets.busy)}."
            )
        if resets.waiting:
            open_ones = "; ".join(
                f"{slug} ({', '.join(requests)})" for slug, requests in resets.waiting.items()
            )
            parts.append(
                f"Left alone while an approval is open (answer it or let it expire first): "
                f"{open_ones}."
            )
        level = messages.SUCCESS if resets.reset else messages.WARNING
        self.message_user(request, " ".join(parts), level)

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
        "duration_ms",
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
        "duration_ms",
        "created",
        "request_key",
        "response_pretty",
    )
    readonly_fields = fields

    @admin.display(description="run (generation)", ordering="generation")
    def run(self, obj):
        url = reverse(f"{self.admin_site.name}:{self.opts.app_label}_modelcall_changelist")
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
    """Every application tool call the Claude agent made, under its idempotency key: the
    policy's decision and why, the approval that answered an asked one (who approved is on
    it), the error a tool raised, when it finished."""

    list_display = (
        "created",
        "inbox",
        "tool",
        "decision",
        "approved",
        "generation",
        "finished",
        "failed",
        "idempotency_key",
    )
    list_filter = ("tool", "decision", "approved", "inbox")
    list_select_related = ("inbox",)
    search_fields = ("=inbox__slug", "idempotency_key")
    search_help_text = "the exact inbox slug, or the idempotency key (contains)"
    date_hierarchy = "created"
    ordering = ("-id",)
    fields = (
        "inbox",
        "tool",
        "decision",
        "decision_reason",
        "approval",
        "approved",
        "generation",
        "idempotency_key",
        "created",
        "finished",
        "error",
        "arguments_pretty",
        "result_pretty",
    )
    readonly_fields = fields

    @admin.display(description="error", boolean=True)
    def failed(self, obj):
        return bool(obj.error)

    @admin.display(description="arguments")
    def arguments_pretty(self, obj):
        return pretty_json(obj.arguments)

    @admin.display(description="result")
    def result_pretty(self, obj):
        return pretty_json(obj.result)


@admin.register(MemoryFile)
class MemoryFileAdmin(MachineryAdmin):
    """The Claude agent's memory files, as they are now; corrected on the inbox's memory page,
    where each change is kept as a version naming who made it."""

    list_display = ("path", "inbox", "characters", "untrusted", "updated", "page")
    list_filter = ("untrusted", "inbox")
    list_select_related = ("inbox",)
    search_fields = ("=inbox__slug", "path")
    search_help_text = "the exact inbox slug, or the path (contains)"
    ordering = ("inbox", "path")
    fields = ("inbox", "path", "untrusted", "updated", "content", "page")
    readonly_fields = fields

    @admin.display(description="characters")
    def characters(self, obj):
        return len(obj.content)

    @admin.display(description="memory page")
    def page(self, obj):
        name = obj.path.removeprefix("/memories/")
        url = reverse("memory-file", kwargs={"slug": obj.inbox.slug, "name": name})
        return format_html('<a href="{}">open</a>', url)


@admin.register(MemoryVersion)
class MemoryVersionAdmin(MachineryAdmin):
    """Every change of a memory file: by which run (its generation) or which person, when."""

    list_display = ("created", "inbox", "path", "action", "generation", "person", "untrusted")
    list_filter = ("action", "untrusted", "inbox")
    list_select_related = ("inbox", "person")
    search_fields = ("=inbox__slug", "path")
    search_help_text = "the exact inbox slug, or the path (contains)"
    date_hierarchy = "created"
    ordering = ("-id",)
    fields = (
        "inbox",
        "path",
        "action",
        "other_path",
        "deleted",
        "untrusted",
        "generation",
        "person",
        "created",
        "content",
    )
    readonly_fields = fields


def _definition_text(definition) -> list[str]:
    if definition is None:
        return []
    shown = {"description": definition.description, "input_schema": definition.input_schema}
    return json.dumps(shown, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


@admin.register(McpToolDefinition)
class McpToolDefinitionAdmin(ViewOnlyAdmin):
    """The definitions MCP servers listed for their tools. A tool reaches the model only in a
    definition approved here (alwayson/claude/mcp.py): a new one, or one whose description or
    schema changed, waits, shown as a diff of the definition approved before it."""

    list_display = ("name", "server", "approved", "first_seen", "approved_at", "approved_by")
    list_filter = ("server", ("approved_at", admin.EmptyFieldListFilter))
    list_select_related = ("approved_by",)
    search_fields = ("name", "=server")
    ordering = ("-first_seen", "-pk")
    actions = ["approve_definitions"]
    fields = (
        "server",
        "name",
        "fingerprint",
        "first_seen",
        "approved_at",
        "approved_by",
        "diff",
        "description",
        "schema_pretty",
    )
    readonly_fields = fields

    @admin.display(boolean=True)
    def approved(self, obj):
        return obj.approved

    @admin.display(description="input schema")
    def schema_pretty(self, obj):
        return pretty_json(obj.input_schema)

    @admin.display(description="changes from the definition approved before")
    def diff(self, obj):
        before = obj.previous_approved()
        lines = difflib.unified_diff(
            _definition_text(before),
            _definition_text(obj),
            "approved before" if before else "(none approved before)",
            "this definition",
            lineterm="",
        )
        return format_html("<pre>{}</pre>", "\n".join(lines) or "(the same)")

    def has_approve_permission(self, request):
        return request.user.has_perm("alwayson_claude.approve_mcptooldefinition")

    @admin.action(description="Approve the selected definitions", permissions=["approve"])
    def approve_definitions(self, request, queryset):
        now = clock.database_now()
        count = 0
        for definition in queryset.filter(approved_at__isnull=True):
            definition.approve(request.user, now)
            # Who approved which definition stays in the admin's history of the row.
            self.log_change(request, definition, f"Approved definition {definition.fingerprint}")
            count += 1
        self.message_user(request, f"{count} definition(s) approved.", messages.SUCCESS)
