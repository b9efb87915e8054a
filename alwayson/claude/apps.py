from django.apps import AppConfig

from alwayson.runtime.policy import check_policy_syntax
from alwayson.runtime.tools import check_mcp_server_settings
from inbox.validation import alwayson_setting, checked_setting

from .prices import check_prices


def checked_policy(name, policy):
    """Setting `name`'s permission policy."""
    return checked_setting(name, check_policy_syntax, policy)


class ClaudeConfig(AppConfig):
    name = "alwayson.claude"
    label = "alwayson_claude"
    verbose_name = "Claude agent"

    def ready(self):
        from alwayson.ops import retention
        from alwayson.ops.workerrole import DELETE, INSERT, SELECT, UPDATE, need
        from alwayson.runtime.models import revision_parts
        from approvals.services import edit_checks

        from . import retention as own_tables
        from .models import (
            McpToolDefinition,
            MemoryFile,
            MemoryVersion,
            ModelCall,
            ModelSettings,
            ToolResult,
        )
        from .runner import EDIT_CHECK, check_edit

        # Here, not in the settings, which import no app: every process stops at start-up on
        # a malformed default policy, not when a Claude agent first reads it.
        checked_policy("ALWAYSON_CLAUDE_POLICY", alwayson_setting("ALWAYSON_CLAUDE_POLICY"))
        checked_setting(
            "ALWAYSON_MCP_SERVERS",
            check_mcp_server_settings,
            alwayson_setting("ALWAYSON_MCP_SERVERS"),
        )
        checked_setting(
            "ALWAYSON_CLAUDE_PRICES", check_prices, alwayson_setting("ALWAYSON_CLAUDE_PRICES")
        )
        # What this app adds to the apps below (inbox/extensions.py).
        retention.table_rules.add(self.label, own_tables.rules)
        # A person's edit of an asked call is checked against this agent's policy, in
        # whichever process takes the answer (the approval page's, the API's).
        edit_checks.add(EDIT_CHECK, check_edit)
        # Its model settings are part of an inbox's configuration revisions.
        revision_parts.add("model_settings", ModelSettings.revision_part)
        need(ModelSettings, SELECT, why="the inbox's Messages API settings")
        # What its runs write outside the fence, and read again on a retry.
        need(ModelCall, SELECT, INSERT, why="model answers: cached, and the daily budget")
        need(ToolResult, SELECT, INSERT, UPDATE, why="the tool calls' journal and results")
        need(McpToolDefinition, SELECT, INSERT, why="MCP tools' definitions, as listed")
        need(ToolResult.events.through, SELECT, INSERT, DELETE, why="a call's events")
        # Its memory: read by a run, written by its fenced finish.
        need(MemoryFile, SELECT, INSERT, UPDATE, DELETE, why="the agent's memory files")
        need(MemoryVersion, SELECT, INSERT, why="each memory change, kept as a version")
