"""The kit's scripted MCP server with the harness: an agent author's test of an inbox whose
Claude agent uses a server's tool, asked and then approved."""

from alwayson.testing import ToolCallSeen, message, tool_use
from alwayson.testing.mcp import ToolFailed

CLAUDE = "alwayson.claude.agent"
SEARCH = "mcp__tracker__search"
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def test_a_server_tool_is_asked_then_run_on_the_server(
    harness, messages_api, scripted_mcp_server, settings
):
    scripted_mcp_server.tool("search", "Search issues.", SCHEMA, answer="2 issues")
    scripted_mcp_server.connect(settings, approve_new=True)
    support = harness.inbox("support", agent=CLAUDE, policy={})
    call = tool_use(SEARCH, {"q": "login"})
    messages_api.reply(message(call))
    support.chat("any login issues?")

    harness.run_until_idle()

    assert support.tool_calls() == [ToolCallSeen(SEARCH, {"q": "login"}, "asked", call["id"])]
    assert scripted_mcp_server.calls == []
    [approval] = support.waiting_for_approval()
    messages_api.reply(message(tool_use("send_message", {"text": "2 issues."})), message("."))
    harness.answer(approval, "yes")
    harness.run_until_idle()

    [(name, arguments, key)] = scripted_mcp_server.calls
    assert (name, arguments) == ("search", {"q": "login"}) and key
    assert support.said()[-1] == "2 issues."


def test_a_failing_server_tool_is_an_error_the_model_reads(
    harness, messages_api, scripted_mcp_server, settings
):
    def failing(arguments):
        raise ToolFailed("index offline")

    scripted_mcp_server.tool("search", "Search issues.", SCHEMA, answer=failing)
    scripted_mcp_server.connect(settings, approve_new=True)
    support = harness.inbox("support", agent=CLAUDE, policy={SEARCH: "allow"})
    messages_api.reply(message(tool_use(SEARCH, {"q": "login"})), message("It failed."))
    support.chat("any login issues?")

    harness.run_until_idle()

    [result] = [
        block
        for block in messages_api.messages_requests[1].body["messages"][-1]["content"]
        if block["type"] == "tool_result"
    ]
    assert result["is_error"] is True and "index offline" in result["content"]
