"""Bodies bounded before they are read, against both servers of the web rows (bench/web.py):

- oversize, declared: a webhook POST declaring a Content-Length over the limit
  (ALWAYSON_WEBHOOK_MAX_BYTES, 1 MiB by default), 50 MiB or a 20-digit number, and sending
  no body: the time from the end of its headers to the 413 (goal: within 100 ms), or none
  within WAIT seconds;
- oversize, sent: the same 50 MiB declared and sent: when the answer came, how much of the
  body the server took before it;
- for each, the most bytes the server held on disk meanwhile: the files in its TMPDIR
  (bench/servers.py gives each server its own) and those its processes hold open there,
  deleted or not (a spooled body is an unlinked temporary file), sampled every few ms;
- half-closed: a complete signed delivery, then shutdown(SHUT_WR): answered or not, and
  whether the delivery was stored.
"""

import os
import socket
import threading
import time
import uuid
from pathlib import Path

from . import common

WAIT = 5.0  # seconds to wait for an answer
DECLARED = {"50 MiB": 50 * 1024 * 1024, "20 digits": 10**20 - 1}
GOAL_MS = 100


def disk_bytes(server, pids) -> int:
    """What `server` holds in its TMPDIR: the files there, and the files its processes
    (`pids`) have open under it (an unlinked spooled body stays on disk while open)."""
    seen = {}
    for path in Path(server.tmpdir).rglob("*"):
        try:
            info = path.stat()
        except OSError:
            continue
        if path.is_file():
            seen[(info.st_dev, info.st_ino)] = info.st_size
    prefix = str(server.tmpdir)
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if not target.startswith(prefix):
                    continue
                info = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            seen[(info.st_dev, info.st_ino)] = info.st_size
    return sum(seen.values())


class DiskWatch:
    """The most bytes `server` held on disk (disk_bytes) while the `with` block ran."""

    def __init__(self, server, every=0.005):
        self.server, self.every = server, every
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self):
        self.pids = self.server.pids()
        self.peak = disk_bytes(self.server, self.pids)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, disk_bytes(self.server, self.pids))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, disk_bytes(self.server, self.pids))


def _head(slug, length, delivery, signature="sha256=0") -> bytes:
    return (
        f"POST /hooks/github/{slug}/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nX-GitHub-Event: issues\r\nX-GitHub-Hook-ID: 1\r\n"
        f"X-GitHub-Delivery: {delivery}\r\nX-Hub-Signature-256: {signature}\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


def _status(answer: bytes):
    """The status of an HTTP response's first line, or None."""
    first = answer.split(b"\r\n", 1)[0].split()
    return int(first[1]) if len(first) >= 2 and first[1].isdigit() else None


def _read_answer(sock, deadline) -> bytes:
    """What the server sent until it closed, its headers ended, or the deadline passed."""
    answer = b""
    while time.monotonic() < deadline and b"\r\n\r\n" not in answer:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except OSError:
            break
        if not chunk:
            break
        answer += chunk
    return answer


def declared_only(server, slug, length) -> dict:
    """Headers declaring `length`, no body: the answer and how long after the headers."""
    with DiskWatch(server) as disk, socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head(slug, length, f"oversize-{uuid.uuid4()}"))
        sent = time.monotonic()
        answer = _read_answer(sock, sent + WAIT)
        took = time.monotonic() - sent
    status = _status(answer)
    return {"status": status, "ms": took * 1000 if status else None, "disk_bytes": disk.peak}


def declared_and_sent(server, slug, length) -> dict:
    """`length` declared and sent (until the server answers or closes): the answer, how long
    after the headers, how much of the body went out first."""
    chunk = b"x" * (1024 * 1024)
    answer, body_sent = b"", 0
    with DiskWatch(server) as disk, socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head(slug, length, f"oversize-{uuid.uuid4()}"))
        started = time.monotonic()
        sock.setblocking(False)
        deadline = started + WAIT * 4
        while time.monotonic() < deadline:
            try:
                piece = sock.recv(65536)
                if not piece:
                    break
                answer += piece
                if b"\r\n\r\n" in answer:
                    break
            except BlockingIOError:
                pass
            except OSError:
                break
            if body_sent < length:
                try:
                    body_sent += sock.send(chunk[: min(len(chunk), length - body_sent)])
                except BlockingIOError:
                    time.sleep(0.001)
                except OSError:
                    break  # the server closed: whatever it answered is read below
            else:
                time.sleep(0.001)
        if b"\r\n\r\n" not in answer:
            answer += _read_answer(sock, time.monotonic() + WAIT)
        took = time.monotonic() - started
    status = _status(answer)
    return {
        "status": status,
        "ms": took * 1000 if status else None,
        "body_sent_mib": body_sent / 1024 / 1024,
        "disk_bytes": disk.peak,
    }


def half_closed(server, slug) -> dict:
    """A complete signed delivery, then shutdown(SHUT_WR): the answer, and whether stored."""
    from inbox.models import Event

    from .web import BODY, signature

    delivery = f"half-{uuid.uuid4()}"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head(slug, len(BODY), delivery, signature(BODY)) + BODY)
        sock.shutdown(socket.SHUT_WR)
        sent = time.monotonic()
        answer = _read_answer(sock, sent + WAIT)
        took = time.monotonic() - sent
    time.sleep(0.2)  # a view still running after an unanswered request gets its moment
    stored = Event.objects.filter(source_id__endswith=delivery).exists()
    status = _status(answer)
    return {"status": status, "ms": took * 1000 if status else None, "stored": stored}


def measure(servers: dict, slug) -> list[dict]:
    """The rows, each with the production web's figures and the reference's."""
    rows = []
    for label, length in DECLARED.items():
        found = {name: declared_only(server, slug, length) for name, server in servers.items()}
        rows.append(_row(f"oversize: {label} declared, no body sent", "limits.declared", found))
        rows[-1]["key"] += "." + label.replace(" ", "-").lower()
    length = DECLARED["50 MiB"]
    found = {name: declared_and_sent(server, slug, length) for name, server in servers.items()}
    rows.append(_row("oversize: 50 MiB declared and sent", "limits.sent", found))
    found = {name: half_closed(server, slug) for name, server in servers.items()}
    rows.append(_row("half-closed complete delivery (SHUT_WR)", "limits.half-closed", found))
    return rows


def _row(measure, key, found) -> dict:
    ours = found["production"]
    if key == "limits.half-closed":
        met = ours["status"] == 202 and ours["stored"]
        goal = "answered 202 and stored"
    else:
        met = ours["status"] == 413 and ours["ms"] <= GOAL_MS and ours["disk_bytes"] == 0
        goal = f"413 within {GOAL_MS} ms, nothing on disk"
    return {
        "measure": measure,
        "key": key,
        "production": ours,
        "reference": found["reference"],
        "goal": goal,
        "met": "yes" if met else "no",
        "load": common.load(),
    }


def shown(result) -> str:
    """One server's figures, as the table shows them."""
    if result["status"] is None:
        text = f"no answer in {WAIT:g} s"
    else:
        text = f"{result['status']} in {result['ms']:.0f} ms"
    if "body_sent_mib" in result:
        text += f", {result['body_sent_mib']:.0f} MiB of the body sent"
    if "disk_bytes" in result:
        text += f", {result['disk_bytes'] / 1024 / 1024:.1f} MiB on disk at most"
    if "stored" in result:
        text += ", stored" if result["stored"] else ", not stored"
    return text


def print_rows(rows, out=None) -> None:
    lines = [
        [entry["measure"], shown(entry["production"]), shown(entry["reference"]), entry["goal"],
         entry["met"]]
        for entry in rows
        if str(entry.get("key", "")).startswith("limits.")
    ]  # fmt: skip
    if lines:
        common.print_grid(["measure", "production web", "gunicorn sync", "goal", "met"], lines, out)
