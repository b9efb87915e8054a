from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from .loading import load_agent
from .policy import check_policy, check_policy_syntax
from .tools import check_mcp_servers, check_tool_names, mcp_server_of, mcp_servers_of, offered_tools


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
