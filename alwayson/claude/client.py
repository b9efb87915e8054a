"""The Messages API as the Claude agent uses it: one call, cached under its request, with its
failures sorted into "try again later" and "the agent's bug".

Every answer is stored in `ModelCall` the moment it arrives, outside the run's transaction, so
the fence never rolls it back: a run retried after a crash sends the same request, finds the
answer and does not pay for it again. The SDK's own retries are off: a sleeping retry would
hold the inbox's lease and hide the outage from the event; the inbox's backoff retries instead,
durably, no sooner than the API's `retry-after`.
"""

import email.utils
import hashlib
import json
import logging
import time
from datetime import UTC, datetime, timedelta
from functools import lru_cache

import anthropic
import httpx2
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction

from alwayson.claude.models import ModelCall
from alwayson.egress.client import run_headers
from alwayson.egress.server import MODEL_SERVICE, SOCKET_HOST
from inbox import clock
from inbox.clock import day_start

log = logging.getLogger("alwayson.claude")

# Statuses that say "not now" rather than "never": timeouts, lock conflicts, rate limits,
# overloads and server errors (the SDK's own retry list), a refused key (fixed by an operator,
# not by the event) and payment trouble.
TRANSIENT_STATUSES = {401, 402, 403, 408, 409, 429}


class ModelUnavailable(Exception):
    """The API could not answer now. `retry_after`: seconds it asked us to wait, if it said."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class AgentBug(Exception):
    """The API refused the request itself (a 400): retrying the same request cannot help, so
    the events fail and go dead after their attempts, like any poison event."""


class BudgetSpent(Exception):
    def __init__(self, used: int, budget: int, reset: datetime):
        super().__init__(f"daily token budget spent: {used} of {budget} tokens used today")
        self.used, self.budget, self.reset = used, budget, reset


@lru_cache(maxsize=8)
def _client(api_key: str, base_url: str, timeout: int) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key=api_key, base_url=base_url or None, timeout=timeout, max_retries=0
    )


@lru_cache(maxsize=8)
def _sealed_client(socket_path: str, timeout: int) -> anthropic.Anthropic:
    """The Messages API through the egress gateway, for a sealed worker, which holds no key:
    the gateway adds it (alwayson/egress/server.py). The SDK insists on a key, so it gets a
    placeholder, taken off each request before the request leaves."""

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

    Raises BudgetSpent before a call the budget does not allow (a cached answer costs
    nothing and is always given), ModelUnavailable for a transient failure, AgentBug for a
    request the API refused.
    """
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
    started = time.monotonic()
    answer = _send(request, run)
    log.info(
        "model call inbox=%s gen=%s model=%s stop=%s tokens=%s duration=%.2fs",
        run.inbox.slug,
        run.generation,
        answer.get("model"),
        answer.get("stop_reason"),
        answer.get("usage"),
        time.monotonic() - started,
    )
    _store(run, key, request, answer)
    return answer


def _send(request: dict, run) -> dict:
    # A sealed worker's gateway serves a run only while it holds its lease.
    extra = {"extra_headers": run_headers(run)} if settings.ALWAYSON_EGRESS_SOCKET else {}
    try:
        message = client().messages.create(**request, **extra)
    except anthropic.APIStatusError as exc:
        raise _status_error(exc) from exc
    except anthropic.APIConnectionError as exc:  # APITimeoutError included
        raise ModelUnavailable(f"the Messages API could not be reached: {exc}") from exc
    except (anthropic.APIResponseValidationError, json.JSONDecodeError) as exc:
        raise ModelUnavailable(f"the Messages API sent a malformed answer: {exc}") from exc
    return message.model_dump(mode="json", exclude_none=True)


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


def _store(run, key: str, request: dict, answer: dict):
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
    try:
        client().models.list(limit=1)
    except anthropic.APIStatusError as exc:
        if exc.status_code in (401, 403):
            where = settings.ANTHROPIC_BASE_URL or "the Messages API"
            raise ImproperlyConfigured(
                f"ANTHROPIC_API_KEY was refused by {where} ({exc.status_code} "
                f"{exc.api_message or exc.message}). Check the key."
            ) from None
        log.warning("could not check ANTHROPIC_API_KEY (%s); runs will retry", exc)
    except anthropic.APIConnectionError as exc:
        log.warning("could not reach the Messages API to check the key (%s); runs will retry", exc)
