from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from .loading import load_agent
from .policy import check_policy
from .tools import check_tool_names, offered_tools


class MidRun(models.TextChoices):
    """What becomes of a chat message sent while the inbox's agent is running."""

    QUEUE = "queue", "queue (the next run reads it)"
    JOIN = "join", "join (the running run reads it)"


class AgentConfig(models.Model):
    """Which agent an inbox runs, and that agent's configuration (for the Claude agent: model,
    system prompt, tool set, permission policy, budget; its Messages API settings are the
    Claude app's, alwayson.claude.models.ModelSettings). An inbox without one runs
    ALWAYSON_AGENT with the ALWAYSON_CLAUDE_* defaults. Edited in the admin; `clean()`
    refuses an agent that cannot be loaded, an unknown tool and a malformed policy."""

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
    mid_run = models.CharField(
        "a message sent mid-run",
        max_length=5,
        choices=MidRun.choices,
        default=MidRun.QUEUE,
        help_text="queue: a chat message sent while a run is working waits for the next run. "
        "join: the running run takes it under its lease and the model reads it before its next "
        "call (a rule-based agent through run.more()); it commits with that run's finish, or "
        "goes back to pending with the run's other events. It never answers an approval.",
    )
    updated = models.DateTimeField(auto_now=True)

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
        if errors:
            raise ValidationError(errors)
