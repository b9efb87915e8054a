import operator
from functools import reduce

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models import Sum
from django.db.models.functions import Coalesce

from alwayson.runtime.tools import check_tool_names, offered_tools

# tool_choice's words; any other value names the one tool the model must call.
TOOL_CHOICE_WORDS = ("auto", "any", "none")
# The Messages API's least thinking budget.
THINKING_MIN_BUDGET = 1024

# Every token counts toward the usage and the budget: input, output, cache reads and writes.
TOKEN_FIELDS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_tokens",
    "cache_write": "cache_write_tokens",
}
TOTAL_TOKENS = reduce(operator.add, (models.F(field) for field in TOKEN_FIELDS.values()))


def token_sums() -> dict:
    """Sum expressions of each kind of token and of their total, for aggregate or annotate."""
    return {name: Sum(field) for name, field in TOKEN_FIELDS.items()} | {"total": Sum(TOTAL_TOKENS)}


class ModelSettings(models.Model):
    """What an inbox's Claude agent sends the Messages API besides the model and the prompt:
    max_tokens, temperature, extended thinking, tool_choice. Beside the inbox's AgentConfig
    (edited on its page in the admin); none, or a blank field, is the default. `clean()`
    refuses what the API would refuse, checked against the tools the configuration offers."""

    config = models.OneToOneField(
        "alwayson.AgentConfig",
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="model_settings",
    )
    max_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Most tokens the model may write per call, thinking included. "
        "Blank: ALWAYSON_CLAUDE_MAX_TOKENS.",
    )
    temperature = models.FloatField(
        null=True,
        blank=True,
        help_text="0 to 1: lower is more predictable. Not with extended thinking. "
        "Blank: the API's default.",
    )
    thinking_budget = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Extended thinking: tokens the model may think with per call, at least 1024 "
        "and less than max_tokens. Blank: no extended thinking.",
    )
    tool_choice = models.CharField(
        max_length=64,
        blank=True,
        help_text="auto (the model decides), any (it must call a tool), a tool's name (it must "
        "call that one), or none (it may call no tool, not even send_message: nothing goes "
        "out). any and a tool's name hold for the first call of each run, so the model can "
        "still end its turn. With extended thinking: auto or none. Blank: auto.",
    )

    class Meta:
        verbose_name = "model settings"
        verbose_name_plural = "model settings"

    def __str__(self):
        return f"model settings of inbox {self.config_id}"

    # What a configuration revision keeps of them (alwayson.runtime.models.revision_parts).
    REVISED_FIELDS = ("max_tokens", "temperature", "thinking_budget", "tool_choice")

    @classmethod
    def revision_part(cls, config) -> dict:
        """The settings of `config` as its revisions keep them (the defaults when none)."""
        sent = cls.of(config)
        return {name: getattr(sent, name) for name in cls.REVISED_FIELDS}

    @classmethod
    def of(cls, config) -> "ModelSettings":
        """The settings of an AgentConfig (read with select_related("model_settings")), or
        the defaults when it has none."""
        try:
            return config.model_settings
        except cls.DoesNotExist:
            return cls()

    def clean(self):
        # The configuration as it will be saved: the admin's inline gives the one edited on
        # the same page, whose tools may not be saved yet.
        try:
            tools = self.config.tools
            check_tool_names(tools)
        except ObjectDoesNotExist:
            offered = None  # no configuration: the field's own check says so
        except ValueError:
            offered = None  # the configuration's own check names the bad tool
        else:
            offered = offered_tools(tools)
        errors = self.refused(offered)
        if errors:
            raise ValidationError(errors)

    def refused(self, offered) -> dict[str, str]:
        """What the Messages API would refuse in these settings, by field; `offered`: the
        names of the tools the inbox offers (None: tool_choice's name is not checked)."""
        errors = {}
        max_tokens = self.max_tokens or settings.ALWAYSON_CLAUDE_MAX_TOKENS
        if self.max_tokens is not None and self.max_tokens < 1:
            errors["max_tokens"] = f"must be at least 1, not {self.max_tokens}"
        temperature, budget, choice = self.temperature, self.thinking_budget, self.tool_choice
        if temperature is not None and not 0 <= temperature <= 1:
            errors["temperature"] = f"must be between 0 and 1, not {temperature}"
        if budget is not None:
            if budget < THINKING_MIN_BUDGET:
                errors["thinking_budget"] = (
                    f"must be at least {THINKING_MIN_BUDGET} tokens (the API's least), not {budget}"
                )
            elif budget >= max_tokens and "max_tokens" not in errors:
                whose = "" if self.max_tokens else ", ALWAYSON_CLAUDE_MAX_TOKENS"
                errors["thinking_budget"] = (
                    f"must be less than max_tokens ({max_tokens}{whose}), not {budget}: the "
                    "thinking is written within the call's max_tokens"
                )
            if temperature is not None:
                errors["temperature"] = (
                    "must be blank with extended thinking: the API refuses a temperature "
                    "with thinking_budget set"
                )
        if (
            choice
            and choice not in TOOL_CHOICE_WORDS
            and offered is not None
            and choice not in offered
        ):
            errors["tool_choice"] = (
                f"must be auto, any, none or the name of a tool the inbox offers "
                f"({', '.join(offered)}), not {choice!r}"
            )
        elif budget is not None and choice not in ("", "auto", "none"):
            errors["tool_choice"] = (
                f"must be auto or none with extended thinking, not {choice!r}: the API "
                "refuses to force a tool call while the model thinks"
            )
        return errors


class ModelCallQuerySet(models.QuerySet):
    def tokens(self) -> dict:
        """Summed usage: input, output, cache_read, cache_write and total."""
        return self.aggregate(**{name: Coalesce(s, 0) for name, s in token_sums().items()})

    def of_run(self, inbox_id, generation) -> "ModelCallQuerySet":
        """The model calls one run paid for (its inbox and lease generation), oldest first.
        A run retried after a crash reuses the answers an earlier generation paid for: those
        stay with the earlier run."""
        return self.filter(inbox_id=inbox_id, generation=generation).order_by("id")

    def tokens_by_run(self) -> "ModelCallQuerySet":
        """One row per run (inbox_id, generation): its calls, summed tokens and api_ms."""
        return (
            self.order_by()
            .values("inbox_id", "generation")
            .annotate(calls=models.Count("id"), api_ms=Sum("duration_ms"), **token_sums())
            .order_by("inbox_id", "generation")
        )


class ModelCall(models.Model):
    """One answer of the Messages API, kept under the request it answered.

    Written the moment the answer arrives, outside the run's transaction: the fence does not
    roll it back, so a run retried after a crash finds it and does not pay again, and the
    day's usage counts every token that was paid for, even by a run whose finish was refused.
    """

    inbox = models.ForeignKey("inbox.Inbox", on_delete=models.CASCADE, related_name="model_calls")
    # sha256 of the request (model, system, tools, messages, max_tokens) as canonical JSON.
    request_key = models.CharField(max_length=64)
    # The lease generation of the run that paid for it: one run, one generation.
    generation = models.PositiveBigIntegerField()
    model = models.CharField(max_length=100)
    stop_reason = models.CharField(max_length=50, blank=True)
    response = models.JSONField()
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cache_read_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    # How long the API took to answer; null for rows from before it was kept.
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    created = models.DateTimeField()

    objects = ModelCallQuerySet.as_manager()

    class Meta:
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_modelcall"
        ordering = ["id"]
        constraints = [
            # The Claude agent's cache lookup, before every model call.
            models.UniqueConstraint(
                fields=["inbox", "request_key"], name="modelcall_unique_request"
            ),
        ]
        indexes = [
            # The budget check before every model call (one inbox's usage since midnight),
            # and the dashboard's usage per inbox.
            models.Index(fields=["inbox", "created"], name="modelcall_inbox_created_idx"),
            # One run's calls (of_run): its timeline (alwayson/web/runs.py), and the run
            # list's tokens, summed per row of the page and by its "cost more than" filter.
            models.Index(fields=["inbox", "generation"], name="modelcall_run_idx"),
        ]

    def __str__(self):
        return f"{self.model} for {self.inbox_id} gen {self.generation}"

    @property
    def total_tokens(self) -> int:
        return sum(getattr(self, field) for field in TOKEN_FIELDS.values())


class ToolResultQuerySet(models.QuerySet):
    def made_for(self, inbox_id, tool: str, event_ids) -> "ToolResultQuerySet":
        """One inbox's calls of `tool` made for any of these events, oldest first: those a run
        of these events repeats when it is retried after a crash or claimed again after a
        deferral, whatever its batch."""
        calls = self.filter(inbox_id=inbox_id, tool=tool, events__in=event_ids)
        return calls.distinct().order_by("id")

    def of_run(self, inbox_id, generation) -> "ToolResultQuerySet":
        """The tool calls one run (its inbox and lease generation) journaled, oldest first. A
        call a retried run replays stays with the run that first journaled it."""
        return self.filter(inbox_id=inbox_id, generation=generation).order_by("id")

    def start(self, *, inbox_id, idempotency_key, event_ids, **fields) -> "ToolResult":
        """The row of a call about to run, committed before the tool runs; the row already
        stored under the key if a run fenced off a moment ago made the same call first."""
        links = ToolResult.events.through.objects
        try:
            with transaction.atomic():
                call = self.create(inbox_id=inbox_id, idempotency_key=idempotency_key, **fields)
                links.bulk_create(
                    links.model(toolresult_id=call.pk, event_id=pk) for pk in event_ids
                )
        except IntegrityError:
            return self.get(inbox_id=inbox_id, idempotency_key=idempotency_key)
        return call


class ToolResult(models.Model):
    """One application tool call of the Claude agent, kept under its idempotency key, and
    its journal (the policy's decision, the approval, the error). Written just before the
    tool runs, outside the run's transaction like ModelCall, so a retried run repeats the
    call instead of making it twice (docs/how-to/claude-agent.md#idempotency-keys); a call
    not run gets a row too, so a retry replays the refusal rather than deciding again.
    """

    inbox = models.ForeignKey("inbox.Inbox", on_delete=models.CASCADE, related_name="tool_results")
    idempotency_key = models.CharField(max_length=200)
    tool = models.CharField(max_length=64)
    arguments = models.JSONField(default=dict)
    # The tool_result block given to the model; None while the tool runs, or if its run died.
    result = models.JSONField(null=True, blank=True)
    # The events the call was made for: the run's batch, or the approval answer that resumed
    # it; narrowed to a later run's events when that run repeats the call.
    events = models.ManyToManyField("inbox.Event", related_name="+", blank=True)
    approved = models.BooleanField(default=False)
    # The permission policy's decision on the call (allow, ask or deny) and why: the rule
    # that matched, as alwayson/runtime/policy.py explains it.
    decision = models.CharField(max_length=5, blank=True)
    decision_reason = models.TextField(blank=True)
    # The approval a person answered for an asked call; who approved is on it.
    approval = models.ForeignKey(
        "approvals.Approval", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # What the tool raised, when it did not return (the model was told it failed).
    error = models.TextField(blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    generation = models.PositiveBigIntegerField()
    created = models.DateTimeField()

    objects = ToolResultQuerySet.as_manager()

    class Meta:
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_toolresult"
        ordering = ["id"]
        constraints = [
            # The Claude agent's lookup before running a tool.
            models.UniqueConstraint(
                fields=["inbox", "idempotency_key"], name="toolresult_unique_key"
            ),
        ]
        indexes = [
            # One run's calls (of_run): its timeline (alwayson/web/runs.py).
            models.Index(fields=["inbox", "generation"], name="toolresult_run_idx"),
        ]

    def __str__(self):
        return f"{self.tool} ({self.idempotency_key})"

    def keep_events(self, event_ids):
        """Narrow the call to these of its events: a later run repeats it for them only."""
        links = ToolResult.events.through.objects.filter(toolresult_id=self.pk)
        links.exclude(event_id__in=event_ids).delete()

    def give_result(self, result: dict, *, now, error: str = ""):
        """The tool returned (or raised `error`, the model told it failed) at `now`."""
        self.result, self.error, self.finished = result, error, now
        ToolResult.objects.filter(pk=self.pk).update(result=result, error=error, finished=now)

    def crashed(self, error: str, *, now):
        """The tool raised what it should not have (not a ToolError): the run fails with it and
        the call runs again on the retry, under the same key. Kept so the journal shows why."""
        self.error, self.finished = error, now
        ToolResult.objects.filter(pk=self.pk).update(error=error, finished=now)


class MemoryFile(models.Model):
    """One file of an inbox's memory (/memories/...), as the Claude agent's memory tool and
    the inbox's memory page show it now. Written only by a run's fenced finish (MemoryWrites,
    alwayson/claude/memory.py) or by a manager's edit; every change also leaves a
    MemoryVersion."""

    inbox = models.ForeignKey("inbox.Inbox", on_delete=models.CASCADE, related_name="+")
    # Normalised: "/memories/" then names without "." or ".." (alwayson/claude/memory.py).
    path = models.CharField(max_length=255)
    content = models.TextField(blank=True)
    # Written by a run that read content from outside the owner (a webhook, an untrusted
    # file): shown to the model as data, never as instructions, until a person rewrites it.
    untrusted = models.BooleanField(default=False)
    updated = models.DateTimeField()

    class Meta:
        ordering = ["inbox", "path"]
        constraints = [
            models.UniqueConstraint(fields=["inbox", "path"], name="memoryfile_unique_path"),
        ]

    def __str__(self):
        return f"{self.path} of inbox {self.inbox_id}"


class MemoryVersion(models.Model):
    """One change of a memory file, never changed: what the file held after it (empty and
    `deleted` for a deletion), made by which run (its generation) or which person, and when.
    A rename leaves one on each path."""

    class Action(models.TextChoices):
        CREATE = "create", "created"
        STR_REPLACE = "str_replace", "replaced text"
        INSERT = "insert", "inserted lines"
        DELETE = "delete", "deleted"
        RENAME = "rename", "renamed"
        EDIT = "edit", "edited by a person"

    # No index of its own: memoryversion_path_idx starts with inbox_id.
    inbox = models.ForeignKey(
        "inbox.Inbox", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    path = models.CharField(max_length=255)
    action = models.CharField(max_length=12, choices=Action.choices)
    content = models.TextField(blank=True)
    deleted = models.BooleanField(default=False)
    # For a rename: the other path (where it came from, or went).
    other_path = models.CharField(max_length=255, blank=True)
    untrusted = models.BooleanField(default=False)
    # The run that wrote it (with the inbox, the run page's address); null for a person's.
    generation = models.PositiveBigIntegerField(null=True, blank=True)
    # The person who wrote it; null for a run's. Kept (SET_NULL) when the account goes.
    person = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [
            # A file's history on the memory page.
            models.Index(fields=["inbox", "path", "id"], name="memoryversion_path_idx"),
            # Retention: the oldest versions first.
            models.Index(fields=["created"], name="memoryversion_created_idx"),
        ]

    def __str__(self):
        return f"{self.action} {self.path} of inbox {self.inbox_id}"


class McpToolDefinition(models.Model):
    """One definition (description and input schema) an MCP server listed for one of its
    tools, and whether a person approved it. A tool is offered only while its server lists
    an approved definition: one rewritten since is a new row, withheld until approved.
    Written outside the fence: what a server offered is a fact, whichever run saw it."""

    server = models.CharField(max_length=24)
    name = models.CharField(max_length=200)
    # sha256 of the canonical JSON of name, description and input schema.
    fingerprint = models.CharField(max_length=64)
    description = models.TextField(blank=True)
    input_schema = models.JSONField()
    first_seen = models.DateTimeField()
    approved_at = models.DateTimeField(null=True, blank=True)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        verbose_name = "MCP tool definition"
        constraints = [
            models.UniqueConstraint(
                fields=["server", "name", "fingerprint"], name="mcp_tool_definition_once"
            )
        ]
        permissions = [("approve_mcptooldefinition", "Can approve an MCP tool's definition")]

    def __str__(self):
        return f"{self.server}: {self.name} ({self.fingerprint[:8]})"

    @property
    def approved(self) -> bool:
        return self.approved_at is not None

    def previous_approved(self) -> "McpToolDefinition | None":
        """The definition of the same tool approved last before this one, to diff against."""
        return (
            McpToolDefinition.objects.filter(
                server=self.server, name=self.name, approved_at__isnull=False
            )
            .exclude(pk=self.pk)
            .order_by("-approved_at", "-pk")
            .first()
        )

    def approve(self, user, now):
        McpToolDefinition.objects.filter(pk=self.pk, approved_at__isnull=True).update(
            approved_at=now, approved_by=user
        )
        self.refresh_from_db()
