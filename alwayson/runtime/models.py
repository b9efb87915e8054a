from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from approvals.models import Approval
from inbox import clock
from inbox.exceptions import InboxBusy
from inbox.models import Session
from inbox.services import bounded_write, lock_inbox

from .loading import load_agent
from .policy import check_policy
from .tools import check_tool_names, offered_tools

# tool_choice's words; any other value names the one tool the model must call.
TOOL_CHOICE_WORDS = ("auto", "any", "none")
# The Messages API's least thinking budget.
THINKING_MIN_BUDGET = 1024
# A reset leaves alone an inbox whose events are due this soon. On PostgreSQL a worker's take
# is one statement whose snapshot predates its lock of the lease row: were the events due,
# one that began before the reset committed could lock the row after it and run on the
# session as it was, and its finish would write the old transcript back. Due later than
# this, no take can pick the inbox before its snapshot includes the reset.
RESET_MARGIN = timedelta(seconds=5)


@dataclass
class ConversationResets:
    """What `reset_conversations` did, by inbox slug."""

    reset: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)  # nothing to reset
    busy: list[str] = field(default_factory=list)  # a run holds it, or events are due
    waiting: dict[str, list[str]] = field(default_factory=dict)  # slug -> open approvals


class AgentConfigQuerySet(models.QuerySet):
    def reset_conversations(self, now=None) -> ConversationResets:
        """Clear the session state of these inboxes' agents (the Claude agent's transcript,
        the calls it waits on, its counters): their next run starts a new conversation.

        Each inbox under its lock, and only while no run can be working from the state: one
        whose lease a run holds, or whose events are due (see RESET_MARGIN), is left busy, as
        is one whose lock stays taken past ALWAYSON_INGEST_LOCK_WAIT. A run that held the lease
        and lost it is fenced off: its finish cannot write the old state back. An inbox with
        an approval still open is left waiting: its answer would reach an agent that no
        longer knows what it asked.
        """
        resets = ConversationResets()
        for inbox_id, slug in self.order_by("inbox_id").values_list("inbox_id", "inbox__slug"):
            try:
                with bounded_write(inbox_id, settings.ALWAYSON_INGEST_LOCK_WAIT):
                    outcome = _reset_one(inbox_id, now)
            except InboxBusy:
                outcome = "busy"
            if isinstance(outcome, list):
                resets.waiting[slug] = outcome
            else:
                getattr(resets, outcome).append(slug)
        return resets


def _reset_one(inbox_id, now):
    """One inbox's reset, inside its bounded write: "reset", "empty", "busy" or the request
    ids of its open approvals."""
    lease = lock_inbox(inbox_id)
    now = clock.resolve(now)
    if not lease.is_free(now) or (
        lease.work_at is not None and lease.work_at <= now + RESET_MARGIN
    ):
        return "busy"
    waiting = list(
        Approval.objects.filter(inbox_id=inbox_id, answer="")
        .order_by("requested_at")
        .values_list("request_id", flat=True)
    )
    if waiting:
        return waiting
    if not Session.objects.filter(inbox_id=inbox_id).exclude(state={}).exists():
        return "empty"
    Session.objects.filter(inbox_id=inbox_id).update(state={}, updated=now)
    return "reset"


class AgentConfig(models.Model):
    """Which agent an inbox runs, and that agent's configuration (for the Claude agent: model,
    system prompt, model settings, tool set, permission policy, budget). An inbox without one
    runs ALWAYSON_AGENT with the ALWAYSON_CLAUDE_* defaults. Edited in the admin; `clean()`
    refuses an agent that cannot be loaded, an unknown tool, a malformed policy and model
    settings the Messages API would refuse."""

    inbox = models.OneToOneField(
        "inbox.Inbox", on_delete=models.CASCADE, primary_key=True, related_name="agent_config"
    )
    agent = models.CharField(
        max_length=200,
        blank=True,
        help_text="Dotted path of the agent callable, e.g. alwayson.claude.agent or "
        "alwayson.demo.refund_desk.agent. Blank: ALWAYSON_AGENT.",
    )
    model = models.CharField(
        max_length=100, blank=True, help_text="Claude model. Blank: ALWAYSON_CLAUDE_MODEL."
    )
    system_prompt = models.TextField(
        blank=True,
        help_text="This inbox's instructions, sent after the built-in guidance (how runs, "
        "send_message, untrusted data and approvals work), which always comes first.",
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
    tools = models.JSONField(
        null=True,
        blank=True,
        help_text='Application tools offered, a JSON list such as ["refund"]; [] for none. '
        "Blank: every tool of the ALWAYSON_CLAUDE_TOOLS modules. send_message and schedule "
        "are always offered.",
    )
    policy = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per-tool permission policy, e.g. {"refund": [{"when": {"amount": {"lt": 50}}, '
        '"then": "allow"}, {"then": "ask"}], "delete_account": "deny"}. Tools not named '
        "follow ALWAYSON_CLAUDE_POLICY, then: built-ins allow, application tools ask.",
    )
    daily_token_budget = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Tokens per UTC day (input, output, cache reads and writes). "
        "Blank: ALWAYSON_CLAUDE_DAILY_TOKEN_BUDGET.",
    )
    approval_window = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(60)],
        help_text="Seconds a person has to answer a tool call that asks. "
        "Blank: ALWAYSON_CLAUDE_APPROVAL_WINDOW.",
    )
    updated = models.DateTimeField(auto_now=True)

    objects = AgentConfigQuerySet.as_manager()

    class Meta:
        verbose_name = "agent configuration"

    def __str__(self):
        return f"agent of {self.inbox}"

    def clean(self):
        errors = {}
        if self.agent:
            try:
                load_agent(self.agent, field="agent")
            except ValueError as exc:
                errors["agent"] = str(exc)
        try:
            check_tool_names(self.tools)
        except ValueError as exc:
            errors["tools"] = str(exc)
        if "tools" not in errors:
            offered = offered_tools(self.tools)
            try:
                check_policy(self.policy, {n: t.input_schema for n, t in offered.items()})
            except ValueError as exc:
                errors["policy"] = str(exc)
            errors.update(self.model_settings_errors(offered))
        if errors:
            raise ValidationError(errors)

    def model_settings_errors(self, offered) -> dict[str, str]:
        """What the Messages API would refuse in max_tokens, temperature, thinking_budget and
        tool_choice, by field; `offered`: the names of the tools the inbox offers."""
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
        if choice and choice not in TOOL_CHOICE_WORDS and choice not in offered:
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
