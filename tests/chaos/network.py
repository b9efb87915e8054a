"""Loopback ends of the chaos run's network: the receivers the outbox sends to, and the sender
that posts signed Standard Webhooks to runall's web server. Threads in the chaos process.

Each receiver records every delivery it accepts: when, on which channel, under which key (the
webhook's Idempotency-Key, the email's Message-ID) and the message bodies it carried; each
body is one run record (tests.chaos.agent), so a delivery is matched to outbox rows by
text, whatever the channel's format.
"""

import base64
import email
import email.policy
import hashlib
import hmac
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.chaos.cluster import free_port

log = logging.getLogger("alwayson.chaos")

# A Standard Webhooks secret for the run: whsec_ + base64 of 32 bytes.
STANDARD_SECRET = "whsec_" + base64.b64encode(b"alwayson-chaos-run-signing-key-32").decode()


class Receipts:
    """Deliveries, in arrival order, kept in memory and appended to a JSON-lines file."""

    def __init__(self, path: Path):
        self.path = path
        self.items: list[dict] = []
        self._lock = threading.Lock()

    def add(self, channel: str, key: str, inbox: str, bodies: list[str]):
        record = {
            "t": time.time(),
            "channel": channel,
            "key": key,
            "inbox": inbox,
            "bodies": bodies,
        }
        with self._lock:
            self.items.append(record)
            with self.path.open("a") as out:
                out.write(json.dumps(record) + "\n")

    def last_at(self) -> float:
        with self._lock:
            return self.items[-1]["t"] if self.items else 0.0

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.items)


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that accepts every POST with 200 and records it."""

    def __init__(self, receipts: Receipts):
        self.receipts = receipts
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.record(self.headers, body)
                answer = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def record(self, headers, body: bytes):
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        messages = data.get("messages") if isinstance(data, dict) else None
        if isinstance(messages, list):
            bodies = [str(m.get("body", "")) for m in messages if isinstance(m, dict)]
        else:
            bodies = split_bodies(str(data.get("text", "")) if isinstance(data, dict) else "")
        inbox = str(data.get("inbox", "")) if isinstance(data, dict) else ""
        self.receipts.add("webhook", headers.get("Idempotency-Key", ""), inbox, bodies)

    def start(self):
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def split_bodies(text: str) -> list[str]:
    """A merged send is its messages joined by blank lines (outbox.services.MergedSend.body);
    email turns its line ends into CRLF on the way."""
    text = text.replace("\r\n", "\n")
    return [part.strip() for part in text.split("\n\n") if part.strip()]


class SmtpReceiver:
    """An SMTP server (aiosmtpd) on 127.0.0.1 that accepts every message and records it."""

    def __init__(self, receipts: Receipts):
        try:
            from aiosmtpd.controller import Controller
        except ImportError:
            raise RuntimeError(
                "the chaos run needs aiosmtpd for its SMTP server: pip install -e '.[test]'"
            ) from None
        self.receipts = receipts
        self.controller = Controller(self, hostname="127.0.0.1", port=free_port())

    @property
    def port(self) -> int:
        return self.controller.port

    async def handle_DATA(self, server, session, envelope):
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        subject = str(message.get("Subject", ""))
        inbox = subject[1 : subject.find("]")] if subject.startswith("[") else ""
        # The plain-text part is the message (an HTML alternative, if any, renders it).
        text = message.get_body(preferencelist=("plain",))
        self.receipts.add(
            "email",
            str(message.get("Message-ID", "")),
            inbox,
            split_bodies(text.get_content() if text is not None else ""),
        )
        return "250 Message accepted for delivery"

    def start(self):
        self.controller.start()

    def stop(self):
        self.controller.stop()


def sign_standard(msg_id: str, timestamp: int, body: bytes) -> str:
    from inbox.webhooks import standard_key

    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(standard_key(STANDARD_SECRET), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class WebhookSender:
    """One sender of the plan's HTTP deliveries (`h1`, `h2`): each is POSTed to runall's web
    server as a signed Standard Webhook at its planned moment and retried until the server
    acknowledges it (202 stored, 200 duplicate), as webhook senders do."""

    def __init__(self, name, plan, base_url, acks, t0, stop: threading.Event):
        self.name = name
        self.sends = plan.sends_of(name)
        self.base_url = base_url
        self.acks = acks
        self.t0 = t0
        self.stop = stop
        self.refusals: dict[str, int] = {}
        self.thread = threading.Thread(target=self.run, name=f"sender-{name}", daemon=True)

    def run(self):
        for n, (at, delivery) in enumerate(self.sends):
            if self.stop.wait(max(0.0, self.t0 + at - time.time())):
                return
            stored = self.deliver(delivery)
            if stored is None:
                return
            self.acks.write(
                {
                    "n": n,
                    "sender": self.name,
                    "inbox": delivery.inbox,
                    "source": delivery.source,
                    "source_id": delivery.source_id,
                    "stored": stored,
                    "t": time.time(),
                }
            )

    def deliver(self, delivery) -> bool | None:
        body = json.dumps({"type": "chaos.message", **delivery.flags}).encode()
        url = f"{self.base_url}/hooks/standard/{delivery.inbox}/"
        backoff = 0.2
        while not self.stop.is_set():
            timestamp = int(time.time())
            request = urllib.request.Request(
                url,
                data=body,
                method="POST",
                headers={
                    "Content-Type": "application/json",
                    "webhook-id": delivery.source_id,
                    "webhook-timestamp": str(timestamp),
                    "webhook-signature": sign_standard(delivery.source_id, timestamp, body),
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    status = response.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except (urllib.error.URLError, OSError):
                status = "unreachable"
            if status in (200, 202):
                return status == 202
            self.refusals[str(status)] = self.refusals.get(str(status), 0) + 1
            self.stop.wait(backoff)
            backoff = min(backoff * 2, 2.0)
        return None

    def start(self):
        self.thread.start()

    def done(self) -> bool:
        return not self.thread.is_alive()
