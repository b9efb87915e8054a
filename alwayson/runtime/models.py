import difflib
import json

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models, transaction

from inbox import clock
from inbox.extensions import Extension

from .loading import load_agent
from .policy import check_policy, check_policy_syntax
from .tools import check_mcp_servers, check_tool_names, mcp_server_of, mcp_servers_of, offered_tools

# What a configuration revision keeps beyond AgentConfig's own fields, by name: a function of
# the AgentConfig that gives its app's part as JSON (added from the apps' ready()).
revision_parts = Extension("what a configuration revision keeps")


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
    mcp_servers = models.JSONField(
        null=True,
        blank=True,
        help_text="MCP servers whose tools are offered, a JSON list of ALWAYSON_MCP_SERVERS names "
        'such as ["tracker"]; [] for none. Blank: every server of ALWAYSON_MCP_SERVERS. Their '
        "tools are named mcp__<server>__<tool>, ask unless the policy says otherwise, and are "
        "offered only in a definition a person approved.",
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
    # The number of the AgentConfigRevision in force: every save that changes a revised field
    # makes the next one, and each run's record keeps the number it read (versions.py).
    revision = models.PositiveIntegerField(default=0, editable=False)

    # What a revision keeps: the fields that change what the agent does.
    REVISED_FIELDS = (
        "agent",
        "model",
        "system_prompt",
        "tools",
        "mcp_servers",
        "policy",
        "daily_token_budget",
        "approval_window",
        "mid_run",
    )

    class Meta:
        verbose_name = "agent configuration"

    def __str__(self):
        return f"agent of {self.inbox}"

    def save(self, *args, revised_by=None, now=None, revise=True, **kwargs):
        """Saved with a new revision when what a revision keeps changed since the one in
        force: by `revised_by` (a person, or None for code), at `now`. With revise=False the
        caller calls revise() once it has saved the rest (the admin, after its inline)."""
        with transaction.atomic():
            super().save(*args, **kwargs)
            if revise:
                self.revise(by=revised_by, now=now)

    def revise(self, *, by=None, now=None) -> bool:
        """A new revision, in force, if what a revision keeps (`snapshot`) changed since the
        one in force; whether it made one. Called by save(), and by whoever saves a part of
        the configuration another app keeps (`revision_parts`) after saving it."""
        with transaction.atomic():
            snapshot = self.snapshot()
            in_force = AgentConfigRevision.objects.filter(
                inbox_id=self.inbox_id, number=self.revision
            ).first()
            if in_force is not None and in_force.config == snapshot:
                return False
            self.revision = AgentConfigRevision.next_number(self.inbox_id)
            AgentConfig.objects.filter(inbox_id=self.inbox_id).update(revision=self.revision)
            AgentConfigRevision.objects.create(
                inbox_id=self.inbox_id,
                number=self.revision,
                config=snapshot,
                author=by,
                created=clock.resolve(now),
            )
            return True

    def snapshot(self) -> dict:
        """What a revision keeps (JSON): the revised fields, and the parts the apps above
        keep of the configuration (the Claude agent's model settings), by name."""
        kept = {name: getattr(self, name) for name in self.REVISED_FIELDS}
        for name, part in sorted(revision_parts.items()):
            kept[name] = part(self)
        return kept

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
        try:
            check_mcp_servers(self.mcp_servers)
        except ValueError as exc:
            errors["mcp_servers"] = str(exc)
        if "tools" not in errors and "mcp_servers" not in errors:
            offered = {n: t.input_schema for n, t in offered_tools(self.tools).items()}
            servers = mcp_servers_of(self.mcp_servers)
            try:
                check_policy_syntax(self.policy)
                # An MCP tool's schema is its server's, unknown here: the rules naming a tool
                # of one of the inbox's servers are checked for their syntax only.
                check_policy(
                    {n: e for n, e in self.policy.items() if mcp_server_of(n) not in servers},
                    offered,
                )
            except ValueError as exc:
                errors["policy"] = str(exc)
        if errors:
            raise ValidationError(errors)


class AgentConfigRevision(models.Model):
    """One state of an inbox's AgentConfig, numbered from 1: kept by every save that changes
    it (who and when), or proposed (not in force) to be replayed before it is saved
    (`manage.py replay --config-revision`)."""

    inbox = models.ForeignKey(
        "inbox.Inbox", on_delete=models.CASCADE, related_name="agent_config_revisions"
    )
    number = models.PositiveIntegerField()
    # AgentConfig.snapshot(): the revised fields as they were.
    config = models.JSONField()
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField()
    # Written by propose(), never by a save: a candidate to replay, not what runs.
    proposed = models.BooleanField(default=False)

    class Meta:
        ordering = ["inbox", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["inbox", "number"], name="agentconfigrevision_number")
        ]

    def __str__(self):
        return f"revision {self.number} of inbox {self.inbox_id}"

    @classmethod
    def next_number(cls, inbox_id) -> int:
        latest = cls.objects.filter(inbox_id=inbox_id).aggregate(n=models.Max("number"))["n"]
        return (latest or 0) + 1

    @classmethod
    def propose(cls, inbox, *, by=None, now=None, **changes) -> "AgentConfigRevision":
        """A revision not in force: the inbox's configuration with `changes`, checked as the
        admin checks a save (ValidationError naming the field), kept for a replay."""
        kept = [*AgentConfig.REVISED_FIELDS, *sorted(revision_parts)]
        unknown = sorted(set(changes) - set(kept))
        if unknown:
            raise ValueError(
                f"propose: unknown field(s) {', '.join(unknown)}; a revision keeps "
                f"{', '.join(kept)}"
            )
        config = AgentConfig.objects.filter(inbox=inbox).first() or AgentConfig(inbox=inbox)
        for name, value in changes.items():
            if name in AgentConfig.REVISED_FIELDS:
                setattr(config, name, value)
        config.clean_fields(exclude=["inbox"])
        config.clean()
        snapshot = config.snapshot()
        for name in revision_parts:
            if name in changes:
                if not isinstance(changes[name], dict):
                    raise ValueError(f"propose: {name} must be a dict of its fields")
                snapshot[name] = {**snapshot[name], **changes[name]}
        with transaction.atomic():
            return cls.objects.create(
                inbox=inbox,
                number=cls.next_number(inbox.pk),
                config=snapshot,
                author=by,
                created=clock.resolve(now),
                proposed=True,
            )

    def applied_to(self, config: AgentConfig) -> AgentConfig:
        """`config` (unsaved) with this revision's fields."""
        for name in AgentConfig.REVISED_FIELDS:
            if name in self.config:
                setattr(config, name, self.config[name])
        return config

    def previous(self) -> "AgentConfigRevision | None":
        earlier = AgentConfigRevision.objects.filter(inbox_id=self.inbox_id, number__lt=self.number)
        return earlier.order_by("-number").first()

    def diff(self) -> str:
        """What changed since the revision before it, as a unified diff of the fields."""
        before = self.previous()
        return unified_diff(before.config if before else {}, self.config)


def unified_diff(before: dict, after: dict) -> str:
    def lines(config):
        return json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False).splitlines()

    return "\n".join(
        difflib.unified_diff(lines(before), lines(after), "before", "after", lineterm="")
    )


class SavedState(models.Model):
    """The session state a run saved, kept beside the Session row (which keeps only the
    latest): committed by the same finish, only by a run that changed the state, so a run that
    leaves it alone writes nothing more. The state a run started from is the one the last run
    before it saved (`before`): what `manage.py replay` gives a candidate agent."""

    inbox = models.ForeignKey("inbox.Inbox", on_delete=models.CASCADE, related_name="+")
    generation = models.PositiveBigIntegerField()
    state = models.JSONField(default=dict)
    created = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["inbox", "generation"], name="savedstate_run_idx")]

    def __str__(self):
        return f"state saved by run {self.inbox_id}/{self.generation}"

    @classmethod
    def before(cls, inbox_id, generation) -> dict:
        """The state the run of `generation` started from: the last one saved by an earlier
        run ({} when none did)."""
        earlier = cls.objects.filter(inbox_id=inbox_id, generation__lt=generation)
        state = earlier.order_by("-generation", "-id").values_list("state", flat=True).first()
        return state if state is not None else {}
