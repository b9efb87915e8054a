"""A scripted MCP server: the `mcp` SDK's own server side, over Streamable HTTP on 127.0.0.1,
for testing an agent that uses MCP tools (alwayson/claude/mcp.py).

    with ScriptedMcpServer("tracker") as server:  # started; settings name it (connect())
        server.tool("search", "Search issues.", {"type": "object", ...},
                    answer=lambda arguments: f"2 issues match {arguments['q']}")
        server.connect(settings, approve_new=True)
        ...
        assert server.calls == [("search", {"q": "login"}, "<the call's idempotency key>")]

A tool's `answer` takes the arguments and returns text; raising `ToolFailed` gives an error
result (is_error), and `HANG` as the answer keeps the call waiting until `stop()` (the
client's time-out). `refusing_calls = True` answers every call with an HTTP 503, as a server
restarting does; `stop()` then `start()` restarts it on the same port. Changing a tool (call
`tool()` again) changes the definition the next listing gives. `requests` has every HTTP
request's method, path and headers: what reached the server through the egress gateway.
"""

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server

IDEMPOTENCY_META = "io.alwayson/idempotency-key"
HANG = object()
WAIT = 10


class ToolFailed(Exception):
    """Raised by a scripted tool's answer: the call's result is an error with this text."""


@dataclass
class ScriptedTool:
    description: str
    input_schema: dict
    answer: Callable | str | object


class ScriptedMcpServer:
    def __init__(self, name="tracker"):
        self.name = name
        self.tools: dict[str, ScriptedTool] = {}
        self.calls = []  # (tool, arguments, idempotency key) in the order they arrived
        self.listings = 0
        # Every HTTP request's method, path and headers (lowercase names), as it arrived.
        self.requests = []
        self.refusing_calls = False
        self._released = threading.Event()
        self._server = None
        self._thread = None
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def tool(self, name, description, input_schema, answer="(done)"):
        self.tools[name] = ScriptedTool(description, input_schema, answer)

    def connect(self, settings, **options):
        """Name this server in ALWAYSON_MCP_SERVERS (a pytest-django `settings`, or any
        object whose attributes are the settings)."""
        servers = dict(getattr(settings, "ALWAYSON_MCP_SERVERS", {}) or {})
        servers[self.name] = {"url": self.url, **options}
        settings.ALWAYSON_MCP_SERVERS = servers

    # --- the protocol -----------------------------------------------------------------------

    async def _list_tools(self, ctx, params):
        self.listings += 1
        return types.ListToolsResult(
            tools=[
                types.Tool(name=name, description=t.description, input_schema=t.input_schema)
                for name, t in self.tools.items()
            ]
        )

    async def _call_tool(self, ctx, params):
        meta = params.meta or {}
        key = meta.get(IDEMPOTENCY_META) if isinstance(meta, dict) else None
        arguments = dict(params.arguments or {})
        self.calls.append((params.name, arguments, key))
        scripted = self.tools.get(params.name)
        if scripted is None:
            return _result(f"no tool {params.name}", error=True)
        if scripted.answer is HANG:
            await asyncio.to_thread(self._released.wait, WAIT)
            return _result("(too late)")
        if isinstance(scripted.answer, str):
            return _result(scripted.answer)
        try:
            return _result(scripted.answer(arguments))
        except ToolFailed as failed:
            return _result(str(failed), error=True)

    def _app(self):
        server = Server(self.name, on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        inner = server.streamable_http_app(stateless_http=True, json_response=True)

        async def app(scope, receive, send):
            if scope["type"] == "http":
                headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
                self.requests.append((scope["method"], scope["path"], headers))
            if scope["type"] != "http" or not self.refusing_calls:
                return await inner(scope, receive, send)
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            if b'"tools/call"' in body:
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b"restarting"})
                return None
            replayed = False

            async def replay():
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            return await inner(scope, replay, send)

        return app

    # --- the process ------------------------------------------------------------------------

    def start(self):
        self._released.clear()
        listening = socket.socket()
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(("127.0.0.1", self.port))
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [listening]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + WAIT
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the scripted MCP server did not start on {self.url}")
            self._thread.join(0.01)
        return self

    def stop(self):
        if self._server is None:
            return
        self._released.set()
        self._server.should_exit = True
        self._thread.join(WAIT)
        self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _result(text, error=False):
    return types.CallToolResult(content=[types.TextContent(text=str(text))], is_error=error)
