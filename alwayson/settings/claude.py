"""The Claude agent (alwayson/claude/).

Read only where a Claude agent runs: an inbox whose agent is alwayson.claude.agent, or every
inbox when ALWAYSON_AGENT names it. `runworker` checks the key at start-up in that case, so
the refund desk (the default) needs none of these. Each inbox may override the model, the
prompt, the tools, the policy, the budget and the approval window in the admin (AgentConfig),
and the Messages API settings (ModelSettings, on the same page).
"""

from . import env

ANTHROPIC_API_KEY = env.string("ANTHROPIC_API_KEY")
# Another endpoint that speaks the Messages API (a proxy; the tests' loopback server).
ANTHROPIC_BASE_URL = env.string("ANTHROPIC_BASE_URL")
ALWAYSON_CLAUDE_MODEL = env.string("ALWAYSON_CLAUDE_MODEL", "claude-sonnet-5-5")
# Modules whose @tool functions the agent may offer (imported when a Claude agent starts).
ALWAYSON_CLAUDE_TOOLS = env.string_list("ALWAYSON_CLAUDE_TOOLS", [])
# The default permission policy, JSON; an inbox's own policy replaces it tool by tool. Its
# syntax is checked by the Claude app's ready() (alwayson/claude/apps.py).
ALWAYSON_CLAUDE_POLICY = env.json_value("ALWAYSON_CLAUDE_POLICY", {})
# USD per million tokens by model and kind, JSON: {"claude-sonnet-4-5": {"input": 3,
# "output": 15, "cache_read": 0.3, "cache_write": 3.75}}; a key may end in * (a prefix).
# None by default: prices change, the team copies Anthropic's. Read by replay's report;
# checked by the Claude app's ready() (alwayson/claude/prices.py).
ALWAYSON_CLAUDE_PRICES = env.json_value("ALWAYSON_CLAUDE_PRICES", {})
# Tokens per UTC day per inbox; unset means no budget.
ALWAYSON_CLAUDE_DAILY_TOKEN_BUDGET = env.optional_positive_int("ALWAYSON_CLAUDE_DAILY_TOKEN_BUDGET")
ALWAYSON_CLAUDE_APPROVAL_WINDOW = env.seconds(
    "ALWAYSON_CLAUDE_APPROVAL_WINDOW", 4 * 3600, env.MAX_WINDOW
)
ALWAYSON_CLAUDE_MAX_TOKENS = env.positive_int("ALWAYSON_CLAUDE_MAX_TOKENS", 4096)
# Model calls one run may make before it fails as runaway (an agent bug).
ALWAYSON_CLAUDE_MAX_CALLS = env.positive_int("ALWAYSON_CLAUDE_MAX_CALLS", 20)
# Seconds one Messages API request may take before it counts as a transient failure.
ALWAYSON_CLAUDE_TIMEOUT = env.seconds("ALWAYSON_CLAUDE_TIMEOUT", 120, env.MAX_WAIT)
# The transcript bound: the last N runs are kept, tool results only of the last M of them,
# and older runs go first while the transcript is longer than the character limit.
ALWAYSON_CLAUDE_KEEP_RUNS = env.positive_int("ALWAYSON_CLAUDE_KEEP_RUNS", 20)
ALWAYSON_CLAUDE_KEEP_TOOL_RESULTS = env.positive_int("ALWAYSON_CLAUDE_KEEP_TOOL_RESULTS", 3)
ALWAYSON_CLAUDE_MAX_TRANSCRIPT_CHARS = env.positive_int(
    "ALWAYSON_CLAUDE_MAX_TRANSCRIPT_CHARS", 200_000
)
# Memory (the Messages API's memory tool, alwayson/claude/memory.py): whether the agent is
# offered it; the most characters one file and one inbox's files may hold; and how much of
# the memory each run's opening turn shows (past it, the files are listed, to be viewed).
ALWAYSON_CLAUDE_MEMORY = env.strict_bool("ALWAYSON_CLAUDE_MEMORY", False)
ALWAYSON_CLAUDE_MEMORY_FILE_CHARS = env.positive_int("ALWAYSON_CLAUDE_MEMORY_FILE_CHARS", 20_000)
ALWAYSON_CLAUDE_MEMORY_INBOX_CHARS = env.positive_int("ALWAYSON_CLAUDE_MEMORY_INBOX_CHARS", 100_000)
ALWAYSON_CLAUDE_MEMORY_PROMPT_CHARS = env.positive_int(
    "ALWAYSON_CLAUDE_MEMORY_PROMPT_CHARS", 20_000
)
# MCP servers reachable over Streamable HTTP, JSON: {"tracker": {"url": "https://…/mcp",
# "timeout": 30, "approve_new": false}}. An inbox's AgentConfig picks among them (all by
# default); their tools' definitions are offered once a person approved them in the admin
# (alwayson/claude/mcp.py), or at once for a new tool of a server with "approve_new".
ALWAYSON_MCP_SERVERS = env.json_value("ALWAYSON_MCP_SERVERS", {})
# Characters of one MCP tool result the model gets; the rest is cut, and it is told so.
ALWAYSON_MCP_MAX_RESULT_CHARS = env.positive_int("ALWAYSON_MCP_MAX_RESULT_CHARS", 20_000)
