"""A scripted model for the Claude agent: a loopback server on 127.0.0.1 that speaks the
Messages API.

The `anthropic` SDK reaches it through `ANTHROPIC_BASE_URL`. Each POST /v1/messages takes
the next scripted reply (`message(...)` with text and `tool_use(...)` blocks, or an error:
`rate_limited`, `overloaded`, `bad_request`, `malformed`, `slow`); every request is
recorded (path, headers, JSON body), so a test reads what reached "the model". GET
/v1/models answers the worker's start-up key check: 200 for the expected key, 401
otherwise. A request past the end of the script gets a 500 that names it, and is kept in
`unexpected`: the `scripted_model` fixture fails the test that made one.

    with ScriptedModel() as model:  # started, and the settings point the agent at it
        model.reply(message("Let me look.", tool_use("lookup_order", {"order": "7"})),
                    message("Order 7 was delivered."))
        ...
        assert model.messages_requests[1].body["messages"][-1]["content"][0]["type"] == (
            "tool_result")

alwayson's own tests use the same server (tests/conftest.py's `messages_api`).
"""

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API_KEY = "sk-ant-test-loopback"
_ids = itertools.count(1)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering (timeouts)


def usage(input_tokens=100, output_tokens=20, cache_read=0, cache_write=0):
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": cache_write,
    }


def message(*content, stop_reason=None, tokens=None, model="claude-sonnet-5-5"):
    """A 200 answer with these content blocks; stop_reason follows from them. `model` is the
    model the answer says ran it (the settings' default model unless a test names another)."""
    blocks = [{"type": "text", "text": c} if isinstance(c, str) else c for c in content]
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    body = {
        "id": f"msg_loopback_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": tokens or usage(),
    }
    return Reply(200, json.dumps(body).encode(), {"content-type": "application/json"})


def tool_use(name, tool_input, id=None):
    return {
        "type": "tool_use",
        "id": id or f"toolu_loopback_{next(_ids)}",
        "name": name,
        "input": tool_input,
    }


def memory(command, **arguments):
    """A call of the memory tool (ALWAYSON_CLAUDE_MEMORY): `memory("create",
    path="/memories/notes.md", file_text="...")`, `memory("str_replace", path=..., old_str=...,
    new_str=...)`, `memory("view", path="/memories")`, and insert, delete, rename."""
    return tool_use("memory", {"command": command, **arguments})


def error(status, kind, text, headers=None):
    body = {"type": "error", "error": {"type": kind, "message": text}}
    return Reply(
        status, json.dumps(body).encode(), {"content-type": "application/json", **(headers or {})}
    )


def rate_limited(retry_after):
    return error(
        429,
        "rate_limit_error",
        "Number of requests has exceeded your rate limit",
        {"retry-after": str(retry_after)},
    )


def overloaded():
    return error(529, "overloaded_error", "Overloaded")


def bad_request(text="messages: roles must alternate between user and assistant"):
    return error(400, "invalid_request_error", text)


def malformed():
    return Reply(
        200,
        b'{"id": "msg_broken", "type": "message", "content": [',
        {"content-type": "application/json"},
    )


def answered_200(body):
    """A 200 whose JSON body is `body`, message or not (a proxy's own answer)."""
    return Reply(200, json.dumps(body).encode(), {"content-type": "application/json"})


def slow(seconds):
    return Reply(200, b"{}", {"content-type": "application/json"}, delay=seconds)


def presented_key(headers):
    """The SDK 2.x sends the key as a bearer token; the HTTP API also takes x-api-key."""
    bearer = headers.get("authorization", "")
    return (
        bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else headers.get("x-api-key")
    )


@dataclass
class Request:
    path: str
    headers: dict
    body: dict | None


class ScriptedModel:
    """Start with `start()`, script with `reply(...)`, read `requests`; `stop()` at the end.
    As a context manager it also points the Claude agent at itself (`ANTHROPIC_API_KEY`,
    `ANTHROPIC_BASE_URL`) until it stops."""

    def __init__(self):
        self.script: list = []
        self.requests: list[Request] = []
        self.unexpected: list[Request] = []
        self.api_key = API_KEY
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"

    def start(self):
        # stop()'s shutdown waits out one poll: the default half second, in every test.
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self):
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    @property
    def settings(self) -> dict:
        """What points the Claude agent at this server (the `scripted_model` fixture sets
        them through pytest-django's `settings`)."""
        return {"ANTHROPIC_API_KEY": self.api_key, "ANTHROPIC_BASE_URL": self.url}

    def __enter__(self):
        """Started, with the settings pointing at it until the block ends (for suites
        without pytest-django's `settings` fixture)."""
        from django.test import override_settings

        self.start()
        self._override = override_settings(**self.settings)
        self._override.enable()
        forget_clients()
        return self

    def __exit__(self, *exc):
        self._override.disable()
        forget_clients()
        self.stop()

    def reply(self, *replies):
        """Append to the script: each request takes the next reply, in order. A reply may be
        a callable: given the `Request`, it returns the Reply, so a script can answer from
        what the prompt holds (and fail the test, raising, when it does not hold it)."""
        with self._lock:
            self.script.extend(replies)

    @property
    def waiting(self) -> int:
        """Scripted replies no request has taken yet."""
        with self._lock:
            return len(self.script)

    @property
    def messages_requests(self) -> list[Request]:
        """The Messages API requests received, oldest first (not the key checks)."""
        return [r for r in self.requests if r.path.startswith("/v1/messages")]

    def _next(self, request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if presented_key(request.headers) != self.api_key:
                return error(401, "authentication_error", "invalid x-api-key")
            if request.path.startswith("/v1/models"):
                return Reply(
                    200,
                    json.dumps(
                        {"data": [], "has_more": False, "first_id": None, "last_id": None}
                    ).encode(),
                    {"content-type": "application/json"},
                )
            if not self.script:
                self.unexpected.append(request)
                return error(500, "api_error", "loopback: no scripted reply for this request")
            reply = self.script.pop(0)
        if callable(reply):
            try:
                return reply(request)
            except Exception as exc:
                self.unexpected.append(request)
                return error(500, "api_error", f"loopback: the scripted reply raised {exc!r}")
        return reply

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = api._next(Request(self.path, headers, body))
                if reply.delay:
                    api._release.wait(reply.delay)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = _answer

        return Handler


def forget_clients():
    """The Claude agent keeps one SDK client per key and address: a new server, or the
    settings put back, must not reach an old one."""
    from alwayson.claude.client import _client

    _client.cache_clear()
