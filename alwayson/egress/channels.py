"""The chat channels' senders: Slack (chat.postMessage) and Telegram (sendMessage), called
through the egress gateway, so the bot token stays in the environment, is added at call time,
and is scrubbed from anything the API answers. Registered into the outbox's senders by this
app's ready()."""

import re

from django.conf import settings
from django.utils.html import escape

from outbox.channels import SendFailed

from .exceptions import EgressFailed, EgressRefused
from .gateway import Egress
from .services import Service

URL = re.compile(r"https?://[^\s<>]+[^\s<>.,;:!?)\]'\"]")


def slack_text(body: str) -> str:
    """Slack mrkdwn: &, < and > escaped, links as <url> so Slack shows them as links."""
    escaped = body.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return URL.sub(lambda m: f"<{m.group(0)}>", escaped)


def telegram_html(body: str) -> str:
    """Telegram's HTML parse mode: the text escaped, links as <a href>."""
    parts, last = [], 0
    for match in URL.finditer(body):
        parts.append(escape(body[last : match.start()]))
        url = escape(match.group(0))
        parts.append(f'<a href="{url}">{url}</a>')
        last = match.end()
    parts.append(escape(body[last:]))
    return "".join(parts)


def chat_service(kind):
    if kind == "slack":
        return Service(
            name="slack",
            base_url=settings.ALWAYSON_SLACK_API_URL,
            methods=frozenset({"POST"}),
            paths=("/chat.postMessage",),
            secret_env="ALWAYSON_SLACK_BOT_TOKEN",
            timeout=settings.ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT,
        )
    return Service(
        name="telegram",
        base_url=settings.ALWAYSON_TELEGRAM_API_URL.rstrip("/") + "/bot{secret}",
        methods=frozenset({"POST"}),
        paths=("/sendMessage",),
        secret_env="ALWAYSON_TELEGRAM_BOT_TOKEN",
        timeout=settings.ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT,
    )


def _post_chat(delivery, channel, path, payload):
    service = chat_service(channel.kind)
    try:
        answer = Egress(delivery.inbox, {service.name: service}).post(
            service.name, path, json=payload
        )
    except (EgressFailed, EgressRefused) as exc:
        raise SendFailed(str(exc)) from None
    try:
        result = answer.json()
    except ValueError:
        result = {}
    # Both APIs answer {"ok": false, ...} for a refused message, Slack even with a 200.
    if not answer.ok or not isinstance(result, dict) or not result.get("ok"):
        reason = (
            result.get("error") or result.get("description") if isinstance(result, dict) else ""
        )
        raise SendFailed(f"{service.name} {path}: HTTP {answer.status} {reason or ''}".strip())


def send_slack(delivery, channel):
    _post_chat(
        delivery,
        channel,
        "/chat.postMessage",
        {
            "channel": channel.target,
            "text": slack_text(delivery.body),
            "unfurl_links": False,
            # Slack has no idempotency header; the send's key travels as message metadata,
            # so a reader of the channel's history can tell a repeat.
            "metadata": {
                "event_type": "alwayson_send",
                "event_payload": {
                    "inbox": delivery.inbox.slug,
                    "idempotency_key": delivery.idempotency_key,
                },
            },
        },
    )


def send_telegram(delivery, channel):
    _post_chat(
        delivery,
        channel,
        "/sendMessage",
        {
            "chat_id": channel.target,
            "text": telegram_html(delivery.body),
            "parse_mode": "HTML",
            "link_preview_options": {"is_disabled": True},
        },
    )
