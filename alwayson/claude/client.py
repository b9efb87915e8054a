"""The Messages API as the Claude agent uses it: one call, cached under its request, with its
failures sorted into "try again later" and "the agent's bug".

Only a Messages API message is an answer: a 200 whose body is anything else (a proxy's
`{"detail": ...}`) is a transient failure, never stored, so the event is retried rather than
used up on "(no reply)". Every failure's text is scrubbed of the API key before it is raised
(and so before it is stored on the events or logged): a proxy set through ANTHROPIC_BASE_URL
may echo the key it was sent in its error body.

Every answer is stored in `ModelCall` the moment it arrives, outside the fence, so a retried
run does not pay for it again. The SDK's own retries are off: a sleeping retry would hold the
inbox's lease; the inbox's backoff retries instead, no sooner than the API's `retry-after`.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import time
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction

from alwayson.claude.models import ModelCall
from alwayson.egress.client import run_headers
from alwayson.egress.scrub import scrub
from alwayson.egress.server import MODEL_SERVICE, SOCKET_HOST
from inbox import clock, tracing
from inbox.clock import day_start

if TYPE_CHECKING:
    import anthropic

# The SDK is imported in the functions that call the API, not here: its import is slow, and
# every process loads this module, where only a worker running a Claude agent calls the API.

log = logging.getLogger("alwayson.claude")

# Request fields the SDK (1.0 on) no longer takes as arguments but the API still accepts for
# the models that have them: sent as extra body fields, its documented way.
EXTRA_BODY_FIELDS = ("temperature",)
# The memory tool's type (alwayson/claude/memory.py) and the beta the API serves it behind.
MEMORY_TOOL_TYPE = "memory_20250818"
MEMORY_BETA = "context-management-2025-06-27"

# Statuses that say "not now" rather than "never": timeouts, lock conflicts, rate limits,
# overloads and server errors (the SDK's own retry list), a refused key (fixed by an operator,
# not by the event) and payment trouble.
TRANSIENT_STATUSES = {401, 402, 403, 408, 409, 429}


def scrubbed(text: str) -> str:
    """`text` without the API key, in any form the egress gateway's scrub finds it."""
    return scrub(text, settings.ANTHROPIC_API_KEY)


class ModelUnavailable(Exception):
    """The API could not answer now. `retry_after`: seconds it asked us to wait, if it said."""

    def __init__(self, reason: str, retry_after: float | None = None):
        reason = scrubbed(reason)
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class AgentBug(Exception):
    """The API refused the request itself (a 400): retrying the same request cannot help, so
    the events fail and go dead after their attempts, like any poison event."""

    def __init__(self, reason: str):
        super().__init__(scrubbed(reason))


class BudgetSpent(Exception):
    def __init__(self, used: int, budget: int, reset: datetime):
        super().__init__(f"daily token budget spent: {used} of {budget} tokens used today")
        self.used, self.budget, self.reset = used, budget, reset


@lru_cache(maxsize=8)
def _client(api_key: str, base_url: str, timeout: int) -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(
        api_key=api_key, base_url=base_url or None, timeout=timeout, max_retries=0
    )


@lru_cache(maxsize=8)
def _sealed_client(socket_path: str, timeout: int) -> anthropic.Anthropic:
    """The Messages API through the egress gateway, for a sealed worker, which holds no key:
    the gateway adds it (alwayson/egress/server.py). The SDK insists on a key, so it gets a
    placeholder, taken off each request before the request leaves."""
    import anthropic
    import httpx2

    def without_key(request):
        request.headers.pop("authorization", None)
        request.headers.pop("x-api-key", None)

    # httpx2, not httpx: the SDK accepts only a client of the HTTP library it is built on.
    http = httpx2.Client(
        transport=httpx2.HTTPTransport(uds=socket_path),
        timeout=timeout,
        trust_env=False,
        event_hooks={"request": [without_key]},
    )
    return anthropic.Anthropic(
        api_key="held-by-the-egress-gateway",
        base_url=f"http://{SOCKET_HOST}/{MODEL_SERVICE}",
        http_client=http,
        timeout=timeout,
        max_retries=0,
    )


def client() -> anthropic.Anthropic:
    if settings.ALWAYSON_EGRESS_SOCKET:
        return _sealed_client(settings.ALWAYSON_EGRESS_SOCKET, settings.ALWAYSON_CLAUDE_TIMEOUT)
    if not settings.ANTHROPIC_API_KEY:
        raise ModelUnavailable("ANTHROPIC_API_KEY is not set; restart the worker to see why")
    return _client(
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL, settings.ALWAYSON_CLAUDE_TIMEOUT
    )


def request_key(request: dict) -> str:
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def tokens_today(inbox_id, now) -> int:
    calls = ModelCall.objects.filter(inbox_id=inbox_id, created__gte=day_start(now))
    return calls.tokens()["total"]


def check_budget(inbox_id, budget: int | None):
    """BudgetSpent once the inbox's tokens since midnight UTC reach its daily budget."""
    if not budget:
        return
    now = clock.database_now()
    used = tokens_today(inbox_id, now)
    if used >= budget:
        raise BudgetSpent(used, budget, day_start(now) + timedelta(days=1))


def call(run, request: dict, budget: int | None) -> dict:
    """The answer to `request` (the Messages API's JSON), from the cache or from the API.
    BudgetSpent before a call the budget does not allow (a cached answer is always given),
    ModelUnavailable for a transient failure, AgentBug for a request the API refused,
    LeaseLost, nothing sent, once the run is lost."""
    key = request_key(request)
    cached = (
        ModelCall.objects.filter(inbox_id=run.inbox.pk, request_key=key)
        .values_list("response", flat=True)
        .first()
    )
    if cached is not None:
        log.debug("model call answered from the cache: inbox=%s key=%s", run.inbox.slug, key)
        return cached
    check_budget(run.inbox.pk, budget)
    # Last, after the reads above, which a database that stopped answering may have held up.
    run.check_lease()
    # Monotonic: a wall clock set back mid-call would give a negative duration.
    started = time.monotonic()
    answer = _traced_send(request, run)
    duration = time.monotonic() - started
    log.info(
        "model call inbox=%s gen=%s model=%s stop=%s tokens=%s duration=%.2fs",
        run.inbox.slug,
        run.generation,
        answer.get("model"),
        answer.get("stop_reason"),
        answer.get("usage"),
        duration,
    )
    _store(run, key, request, answer, duration_ms=round(duration * 1000))
    return answer


def _traced_send(request: dict, run) -> dict:
    """_send inside a `chat {model}` CLIENT span (OpenTelemetry's GenAI conventions).

    Only calls that reach the API get one: a cached answer costs nothing and sends nothing.
    Message content goes into the span only with ALWAYSON_TRACE_CONTENT (it is the users').
    """
    model = request.get("model")
    with tracing.span(
        f"chat {model}",
        kind=tracing.trace.SpanKind.CLIENT,
        gen_ai__operation__name="chat",
        gen_ai__provider__name="anthropic",
        gen_ai__request__model=model,
    ) as current:
        if current is not None and tracing.trace_content():
            current.set_attribute("gen_ai.input.messages", json.dumps(request.get("messages")))
            if request.get("system"):
                current.set_attribute("gen_ai.system_instructions", json.dumps(request["system"]))
        answer = _send(request, run)
        if current is not None:
            usage = answer.get("usage") or {}
            for name, value in (
                ("gen_ai.response.model", answer.get("model")),
                ("gen_ai.response.id", answer.get("id")),
                ("gen_ai.usage.input_tokens", usage.get("input_tokens")),
                ("gen_ai.usage.output_tokens", usage.get("output_tokens")),
            ):
                if value is not None:
                    current.set_attribute(name, value)
            if answer.get("stop_reason"):
                current.set_attribute("gen_ai.response.finish_reasons", [answer["stop_reason"]])
            if tracing.trace_content():
                current.set_attribute("gen_ai.output.messages", json.dumps(answer.get("content")))
        return answer


def _send(request: dict, run) -> dict:
    import anthropic

    # A sealed worker's gateway serves a run only while it holds its lease.
    extra = {"extra_headers": run_headers(run)} if settings.ALWAYSON_EGRESS_SOCKET else {}
    params = dict(request)
    body = {name: params.pop(name) for name in EXTRA_BODY_FIELDS if name in params}
    if body:
        extra["extra_body"] = body
    # The memory tool (alwayson/claude/memory.py) is served behind a beta the request names.
    if any(tool.get("type") == MEMORY_TOOL_TYPE for tool in params.get("tools") or ()):
        extra["extra_headers"] = {**extra.get("extra_headers", {}), "anthropic-beta": MEMORY_BETA}
    # Raised `from None`: the SDK's exception carries the raw error body, which the worker
    # would print with the traceback, key and all; ours carries the same facts, scrubbed.
    try:
        message = client().messages.create(**params, **extra)
    except anthropic.APIStatusError as exc:
        raise _status_error(exc) from None
    except anthropic.APIConnectionError as exc:  # APITimeoutError included
        raise ModelUnavailable(f"the Messages API could not be reached: {exc}") from None
    except (anthropic.APIResponseValidationError, json.JSONDecodeError) as exc:
        raise ModelUnavailable(f"the Messages API sent a malformed answer: {exc}") from None
    if not isinstance(message, anthropic.types.Message):
        # The SDK hands back whatever JSON a 200 carried when it is not an object.
        raise ModelUnavailable(f"the Messages API answered 200 with {_excerpt(message)}")
    answer = message.model_dump(mode="json", exclude_none=True, warnings=False)
    problem = not_a_message(answer)
    if problem:
        raise ModelUnavailable(
            f"the Messages API answered 200 with something that is not a message ({problem}): "
            f"{_excerpt(answer)}"
        )
    return answer


def not_a_message(answer: dict) -> str | None:
    """What keeps `answer` from being a Messages API message, or None: the SDK does not
    validate a 200's body, which would otherwise be cached as "(no reply)"."""
    if answer.get("type") != "message":
        return f"type {answer.get('type')!r}, not 'message'"
    if answer.get("role") != "assistant":
        return f"role {answer.get('role')!r}, not 'assistant'"
    content = answer.get("content")
    if not isinstance(content, list):
        return "no content list"
    if not all(isinstance(block, dict) and isinstance(block.get("type"), str) for block in content):
        return "a content block without a type"
    return None


def _excerpt(value, limit=200) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _status_error(exc: anthropic.APIStatusError) -> Exception:
    status = exc.status_code
    what = f"{status} {exc.type or 'error'}: {exc.api_message or exc.message}"
    if status in TRANSIENT_STATUSES or status >= 500:
        return ModelUnavailable(
            f"the Messages API answered {what}", retry_after=retry_after(exc.response.headers)
        )
    return AgentBug(
        f"the Messages API refused the agent's request ({what}). This is a bug in the agent "
        f"or its configuration (model, tools, prompt), not a passing failure: the same "
        f"request will be refused again."
    )


def retry_after(headers) -> float | None:
    """Seconds from `retry-after-ms`, or `retry-after` (seconds or an HTTP date)."""
    for name, scale in (("retry-after-ms", 1000), ("retry-after", 1)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(float(raw) / scale, 0.0)
        except ValueError:
            pass
        parsed = email.utils.parsedate_to_datetime(raw) if name == "retry-after" else None
        if parsed is not None:
            return max((parsed - datetime.now(UTC)).total_seconds(), 0.0)
    return None


def _store(run, key: str, request: dict, answer: dict, duration_ms: int):
    usage = answer.get("usage") or {}
    try:
        with transaction.atomic():
            ModelCall.objects.create(
                inbox_id=run.inbox.pk,
                request_key=key,
                generation=run.generation,
                model=str(answer.get("model") or request["model"])[:100],
                stop_reason=str(answer.get("stop_reason") or "")[:50],
                response=answer,
                input_tokens=usage.get("input_tokens") or 0,
                output_tokens=usage.get("output_tokens") or 0,
                cache_read_tokens=usage.get("cache_read_input_tokens") or 0,
                cache_write_tokens=usage.get("cache_creation_input_tokens") or 0,
                duration_ms=duration_ms,
                created=clock.database_now(),
            )
    except IntegrityError:
        # A run fenced off a moment ago asked the same thing first: its answer stands.
        pass


def check_api_key():
    """At worker start-up: ImproperlyConfigured for a missing key or one the API refuses.

    An API that cannot be reached right now only warns: the runs will retry.
    """
    if settings.ALWAYSON_EGRESS_SOCKET:
        # A sealed worker holds no key to check; runegress checks it when it starts.
        log.info("the Messages API key is held by the egress gateway (ALWAYSON_EGRESS_SOCKET)")
        return
    if not settings.ANTHROPIC_API_KEY:
        raise ImproperlyConfigured(
            "ANTHROPIC_API_KEY is not set, and a Claude agent is configured (ALWAYSON_AGENT or "
            "an inbox's agent in the admin). Set it, or point those inboxes at another agent."
        )
    import anthropic

    try:
        client().models.list(limit=1)
    except anthropic.APIStatusError as exc:
        if exc.status_code in (401, 403):
            where = settings.ANTHROPIC_BASE_URL or "the Messages API"
            raise ImproperlyConfigured(
                scrubbed(
                    f"ANTHROPIC_API_KEY was refused by {where} ({exc.status_code} "
                    f"{exc.api_message or exc.message}). Check the key."
                )
            ) from None
        text = scrubbed(str(exc))
        log.warning("could not check ANTHROPIC_API_KEY (%s); runs will retry", text)
    except anthropic.APIConnectionError as exc:
        text = scrubbed(str(exc))
        log.warning("could not reach the Messages API to check the key (%s); runs will retry", text)
