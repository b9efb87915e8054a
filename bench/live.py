"""Live pages (alwayson/web/live.py) as users meet them, on the production web (the command
alwayson/ops/processes.py names, 2 workers: bench/servers.py), each web process's statements
counted (bench/counting.py) and its CPU read from /proc (master and workers, utime + stime):

(a) pages: 50 conversation pages of one inbox (one owner, 50 messages shown) open in
    Chromium, one browser context each (Chromium holds at most 6 connections per host and
    context, and an open stream keeps one); N replies, spaced apart. A reply is a run of the
    agent as the worker makes it: the lease taken (`acquire`: one change the pages show,
    "working"), then the fenced finish with a `Say` effect, releasing the lease (a second
    change: the reply). For each reply, the time from its finish's commit to each page's DOM
    showing it (p50, p99 over replies x pages); web CPU per change and statements per change
    and per page per change, over the window of all replies (2 changes each). Reference:
    the same pages under gunicorn's sync workers serving `alwayson.wsgi`, where they poll
    once a second (the old way).
(b) streams: 500 streams held by SSE clients (raw sockets in one asyncio loop, chunked HTTP
    decoded, the reply found in the pushed data) on the same inbox, same owner; M replies at
    50 streams, then at 500: per change, web CPU in all and statements; statements per page
    per change as the growth from 50 to 500 streams over the 450 streams added (0 when a
    change costs the same however many pages are open); the time from the commit to each of
    the 500 streams receiving the reply (p50, p99).
(c) idle: the 500 streams held for 30 s, nothing changing: web CPU (% of one core) and the
    statements run (0).

Quick mode (CI): 5 replies to the pages, 3 per streams stage, 100 streams (the rows say so;
the goals are for 500) and 10 s of idling.

Standalone: `.venv/bin/python bench/live.py [--quick] [--json live.json]`, on PostgreSQL
(BENCH_DATABASE_URL's server; it makes and drops its own `<name>_live` database).
"""

import argparse
import asyncio
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, counting, servers  # noqa: E402

CHROMIUM = os.environ.get("ALWAYSON_TEST_CHROMIUM", "/usr/bin/chromium")
# Without the renderer each window starts for its address bar's drop-downs, which would take
# the web's CPU while the pages open (tests/browser/test_browser.py, CHROMIUM_UI_OFF).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup",
]
SETTINGS = "bench.live_settings"
CONVERSATION = 50  # messages already shown: the measured page
HOLDER = "bench-live"
SETTLE = 3.0  # seconds after pages or streams open: their opening reads are done
SEEN_TIMEOUT = 120  # seconds a reply may take to reach every page before it counts as missed


# --- the product, served -----------------------------------------------------------------------


def migrate(url):
    env = {
        **os.environ,
        **common.BENCH_ENV,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"],
        cwd=common.ROOT,
        env=env,
        check=True,
    )


def setup_django(url):
    os.environ.update(common.BENCH_ENV)
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ.pop(counting.DIRECTORY, None)  # this process's statements are not the web's
    import django

    django.setup()


class Counted:
    """A web server started with its statements counted in a directory of its own."""

    def __init__(self, make, url):
        self.directory = tempfile.mkdtemp(prefix="alwayson-bench-statements-")
        self.server = make(url, settings=SETTINGS, env={counting.DIRECTORY: self.directory})

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop()

    def sample(self):
        """(monotonic time, the server's CPU seconds, its statements so far, and those by
        process)."""
        statements = counting.by_process(self.directory)
        return time.monotonic(), self.server.cpu_seconds(), sum(statements.values()), statements


def cost(before, after, changes) -> dict:
    elapsed = after[0] - before[0]
    cpu, statements = after[1] - before[1], after[2] - before[2]
    # Each web process with open pages reads a change once: which processes the pages landed
    # on (one at 50 streams, both at 500, or both each time) is the kernel's choice.
    readers = sum(count > before[3].get(pid, 0) for pid, count in after[3].items())
    return {
        "seconds": elapsed,
        "changes": changes,
        "cpu_ms_per_change": 1000 * cpu / changes,
        "statements": statements,
        "statements_per_change": statements / changes,
        "processes_reading": readers,
        "statements_per_change_per_process": statements / changes / max(readers, 1),
    }


def make_page():
    """An inbox with a 50-message conversation, and a logged-in session of its owner."""
    from django.conf import settings
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.sessions.backends.db import SessionStore

    from inbox import clock
    from inbox.models import Inbox
    from inbox.services import ingest
    from outbox.models import OutboxMessage

    owner = get_user_model().objects.create_user(username="bench-live", password="unused-pw-1")
    inbox = Inbox.objects.create(owner=owner, slug="live", name="Live bench")
    now = clock.database_now()
    for n in range(CONVERSATION // 2):
        ingest(inbox, "chat", f"ask-{n}", {"text": f"question {n}", "from": "bench-live"})
        OutboxMessage.objects.create(inbox=inbox, body=f"answer {n}", created=now)
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session.create()
    return inbox, settings.SESSION_COOKIE_NAME, session.session_key


# --- a reply: the lease taken, then the fenced finish ------------------------------------------


def reply_body(prefix, n) -> str:
    return f"bench-reply-{prefix}-{n}-end"


def take_lease(inbox) -> int:
    """The first change of a run: the lease taken (the pages say the agent is working)."""
    from inbox.services import acquire

    generation = acquire(inbox.pk, HOLDER)
    if generation is None:
        raise RuntimeError("the live inbox's lease is held by someone else")
    return generation


def finish_with_reply(inbox, generation, body) -> None:
    """The second: the run's fenced finish, its `Say` effect and the lease released in one
    transaction (what a worker commits)."""
    from inbox.services import Held, finish
    from outbox.services import Say

    effects = [Say(inbox.pk, body, generation=generation)]
    if not finish(Held(inbox.pk, HOLDER, generation, []), effects, release=True):
        raise RuntimeError("the fenced finish was refused")


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


# --- (a) pages in Chromium ---------------------------------------------------------------------

# At document start: every DOM change counted, and the first time each reply's text is in
# the page (whatever the markup shows it in).
WATCH = """
window.seenAt = {};
window.updates = 0;
new MutationObserver(() => {
  window.updates += 1;
  const text = document.body ? document.body.textContent : "";
  for (const match of text.matchAll(/bench-reply-PREFIX-(\\d+)-end/g)) {
    if (!(match[1] in window.seenAt)) window.seenAt[match[1]] = Date.now();
  }
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


def pages_row(counted, inbox, cookie, pages, replies, prefix) -> dict:
    """`replies` replies to `pages` open pages: when each page showed each, and the cost."""
    from django.db import connection
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # the ORM beside Playwright's loop
    base = counted.server.base
    latencies, missed, unsettled = [], 0, 0
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        opened = []
        for _ in range(pages):
            context = browser.new_context()
            context.add_cookies([{"name": cookie[0], "value": cookie[1], "url": base}])
            context.add_init_script(WATCH.replace("PREFIX", prefix))
            page = context.new_page()
            page.goto(f"{base}/inbox/{inbox.slug}/")
            page.wait_for_selector("#conversation[data-live-cursor]")
            opened.append(page)
        time.sleep(SETTLE)
        before = counted.sample()
        for n in range(replies):
            time.sleep(random.uniform(0.2, 1.2))  # any phase of the poll's second
            updates = [page.evaluate("window.updates") for page in opened]
            generation = take_lease(inbox)
            for page, seen in zip(opened, updates, strict=True):
                try:
                    page.wait_for_function(
                        "seen => window.updates > seen", arg=seen, timeout=30_000, polling=20
                    )
                except Exception:  # noqa: BLE001 (a page that did not show it: counted)
                    unsettled += 1
            finish_with_reply(inbox, generation, reply_body(prefix, n))
            committed = time.time() * 1000
            deadline = time.monotonic() + SEEN_TIMEOUT
            for page in opened:
                left = max(1, deadline - time.monotonic()) * 1000
                try:
                    page.wait_for_function(
                        "n => window.seenAt[n] !== undefined", arg=n, timeout=left, polling=20
                    )
                except Exception:  # noqa: BLE001
                    missed += 1
                    continue
                latencies.append(page.evaluate("n => window.seenAt[n]", n) - committed)
        after = counted.sample()
        browser.close()
    connection.close()
    found = cost(before, after, 2 * replies)
    return {
        "pages": pages,
        "replies": replies,
        "p50_ms": statistics.median(latencies) if latencies else math.inf,
        "p99_ms": percentile(latencies, 0.99) if latencies else math.inf,
        "n": len(latencies),
        "missed": missed,
        "unsettled": unsettled,
        **found,
        "statements_per_page_per_change": found["statements_per_change"] / pages,
        "load": common.load(),
    }


# --- (b) and (c): streams held by SSE clients ----------------------------------------------------


class Dechunk:
    """HTTP/1.1 chunked transfer decoding, fed as bytes arrive."""

    def __init__(self):
        self.buffer = b""
        self.left = 0  # bytes of the current chunk still to come

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out = []
        while self.buffer:
            if not self.left:
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    break
                line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
                if not line:
                    continue  # the CRLF after a chunk's data
                self.left = int(line.split(b";")[0], 16)
                if not self.left:
                    break  # the last chunk
            piece, self.buffer = self.buffer[: self.left], self.buffer[self.left :]
            out.append(piece)
            self.left -= len(piece)
        return b"".join(out)


class Stream:
    """One client's stream: pushes received (SSE events with an id), and when it first
    received each reply."""

    TAIL = 64  # bytes kept from the last read: a marker may straddle two reads

    def __init__(self, pattern, chunked):
        self.pattern = pattern
        self.decoder = Dechunk() if chunked else None
        self.tail = b""
        self.pushes = 0
        self.seen = {}
        self.open = True

    def decode(self, data: bytes) -> bytes:
        return self.decoder.feed(data) if self.decoder else data

    def feed(self, data: bytes, now: float):
        self.take(self.decode(data), now)

    def take(self, data: bytes, now: float):
        text = self.tail + data
        self.pushes += text.count(b"\nid: ") - self.tail.count(b"\nid: ")
        for match in self.pattern.finditer(text):
            self.seen.setdefault(int(match.group(1)), now)
        self.tail = text[-self.TAIL :]


class Streams:
    """SSE clients on raw sockets, in one asyncio loop on a thread of its own (the bench's
    commits run on the main thread): opened in batches of 50, each counted open once the
    stream sent its first block (`retry:`), after its subscription."""

    def __init__(self, base, path, cookie, prefix):
        self.host, port = base.removeprefix("http://").split(":")
        self.port = int(port)
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Accept: text/event-stream\r\nCache-Control: no-cache\r\n"
            f"Cookie: {cookie[0]}={cookie[1]}\r\n\r\n"
        ).encode()
        self.pattern = re.compile(rb"bench-reply-" + prefix.encode() + rb"-(\d+)-end")
        self.streams: list[Stream] = []
        self.tasks = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def open(self, count, timeout=300):
        asyncio.run_coroutine_threadsafe(self._open(count), self.loop).result(timeout)

    async def _open(self, count):
        for start in range(0, count, 50):
            await asyncio.gather(*(self._connect() for _ in range(min(50, count - start))))

    async def _connect(self):
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(self.request)
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"a stream was refused: {head[:300]!r}")
        stream = Stream(self.pattern, b"transfer-encoding: chunked" in head.lower())
        first = b""
        while b"retry:" not in first:
            data = await reader.read(65536)
            if not data:
                raise RuntimeError("a stream closed before its first block")
            first += stream.decode(data)
        stream.take(first, time.monotonic())
        self.streams.append(stream)
        self.tasks.append(asyncio.get_running_loop().create_task(self._read(stream, reader)))
        self.tasks[-1].writer = writer

    async def _read(self, stream, reader):
        try:
            while data := await reader.read(262144):
                stream.feed(data, time.monotonic())
        finally:
            stream.open = False

    def pushes(self) -> list[int]:
        return [stream.pushes for stream in self.streams]

    def alive(self) -> int:
        return sum(stream.open for stream in self.streams)

    def close(self):
        async def close():
            for task in self.tasks:
                task.writer.close()
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _wait(condition, timeout) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def streams_stage(counted, streams, inbox, replies, first) -> dict:
    """`replies` replies (numbered from `first`) to every open stream: the time from each
    finish's commit to each stream's receiving it, and the cost per change."""
    latencies, missed, unsettled = [], 0, 0
    before = counted.sample()
    for n in range(first, first + replies):
        time.sleep(random.uniform(0.2, 0.5))
        pushed = streams.pushes()
        generation = take_lease(inbox)
        settled = _wait(
            lambda pushed=pushed: all(
                now > then for now, then in zip(streams.pushes(), pushed, strict=True)
            ),
            30,
        )
        unsettled += not settled
        finish_with_reply(inbox, generation, reply_body("s", n))
        committed = time.monotonic()
        _wait(lambda n=n: all(n in stream.seen for stream in streams.streams), SEEN_TIMEOUT)
        for stream in streams.streams:
            if n in stream.seen:
                latencies.append(1000 * (stream.seen[n] - committed))
            else:
                missed += 1
    after = counted.sample()
    return {
        "streams": len(streams.streams),
        "replies": replies,
        "latencies": latencies,
        "missed": missed,
        "unsettled": unsettled,
        **cost(before, after, 2 * replies),
    }


def streams_rows(counted, inbox, cookie, count, replies, idle_seconds) -> list[dict]:
    """(b) at count // 10 streams, then at `count`; (c) the `count` streams idle."""
    from alwayson.web import live

    small = max(10, count // 10)
    path = f"/inbox/{inbox.slug}/stream/?since={live.inbox_cursor(inbox.pk)}"
    streams = Streams(counted.server.base, path, cookie, "s")
    try:
        streams.open(small)
        time.sleep(SETTLE)
        few = streams_stage(counted, streams, inbox, replies, 0)
        streams.open(count - small)
        time.sleep(SETTLE)
        many = streams_stage(counted, streams, inbox, replies, replies)
        time.sleep(SETTLE)
        before = counted.sample()
        time.sleep(idle_seconds)
        after = counted.sample()
        alive = streams.alive()
    finally:
        streams.close()
    latencies = many.pop("latencies")
    few.pop("latencies")
    # Per reading process: a second process that took pages only at 500 streams adds its own
    # read, not one per page.
    growth = (
        many["statements_per_change_per_process"] - few["statements_per_change_per_process"]
    ) / (count - small)
    scale = "" if count >= 500 else f" (quick mode: {count}, not 500)"
    streams_row = {
        "measure": f"{count} open streams{scale}: a reply pushed to every one",
        "key": "live.streams",
        **many,
        "p50_ms": statistics.median(latencies) if latencies else math.inf,
        "p99_ms": percentile(latencies, 0.99) if latencies else math.inf,
        "n": len(latencies),
        "statements_per_page_per_change": growth,
        "fewer": few,
        "load": common.load(),
    }
    elapsed = after[0] - before[0]
    idle_row = {
        "measure": f"{count} idle streams{scale}, {idle_seconds:g} s",
        "key": "live.idle",
        "streams": count,
        "seconds": idle_seconds,
        "cpu_percent": 100 * (after[1] - before[1]) / elapsed,
        "statements": after[2] - before[2],
        "streams_open_at_end": alive,
        "load": common.load(),
    }
    return [streams_row, idle_row]


# --- the run -----------------------------------------------------------------------------------


def print_rows(rows, out=None) -> None:
    out = out or sys.stdout
    lines = []
    for entry in rows:
        key = entry["key"]
        if key in ("live.pages", "live.polled"):
            figures = (
                f"p50 {entry['p50_ms']:.0f} ms, p99 {entry['p99_ms']:.0f} ms (n={entry['n']},"
                f" missed {entry['missed']})"
            )
        elif key == "live.streams":
            figures = (
                f"p50 {entry['p50_ms']:.0f} ms, p99 {entry['p99_ms']:.0f} ms (n={entry['n']},"
                f" missed {entry['missed']}); statements per page per change"
                f" {entry['statements_per_page_per_change']:.3f} (per change and reading"
                f" process {entry['fewer']['statements_per_change_per_process']:.1f} at"
                f" {entry['fewer']['streams']} streams,"
                f" {entry['statements_per_change_per_process']:.1f} at {entry['streams']});"
                f" web CPU per change {entry['fewer']['cpu_ms_per_change']:.0f} ms at"
                f" {entry['fewer']['streams']} streams"
            )
        else:
            figures = (
                f"{entry['cpu_percent']:.2f} % of a core, {entry['statements']} statements,"
                f" {entry['streams_open_at_end']} streams open at the end"
            )
        if "cpu_ms_per_change" in entry:
            figures += (
                f"; web CPU {entry['cpu_ms_per_change']:.0f} ms per change,"
                f" {entry['statements_per_change']:.1f} statements per change"
            )
        lines.append([entry["measure"], figures, entry.get("goal", "")])
    common.print_grid(["live row", "figures", "goal"], lines, out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer replies, 100 streams, 10 s")
    parser.add_argument("--pages", type=int, default=50, help="open pages in Chromium (50)")
    parser.add_argument("--replies", type=int, default=None, help="replies to the pages (20)")
    parser.add_argument("--streams", type=int, default=None, help="open streams (500)")
    parser.add_argument("--seconds", type=float, default=None, help="idling measured (30)")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args(argv)
    replies = args.replies or (5 if args.quick else 20)
    stream_replies = 3 if args.quick else 5
    count = args.streams or (100 if args.quick else 500)
    seconds = args.seconds or (10 if args.quick else 30)

    url = common.sibling_url(common.bench_url(), "live")
    common.create_database(url)
    rows = []
    try:
        migrate(url)
        setup_django(url)
        inbox, cookie_name, session_key = make_page()
        cookie = (cookie_name, session_key)
        for key, make, prefix in (
            ("live.pages", servers.production, "p"),
            ("live.polled", servers.reference, "q"),
        ):
            with Counted(make, url) as counted:
                found = pages_row(counted, inbox, cookie, args.pages, replies, prefix)
            how = "production web, pushed" if key == "live.pages" else "gunicorn sync, polled"
            rows.append(
                {
                    "measure": f"{args.pages} open pages (Chromium), {how}: reply visible",
                    "key": key,
                    **found,
                    "goal": "p50 <= 150 ms, p99 <= 500 ms" if key == "live.pages" else "(old)",
                }
            )
        with Counted(servers.production, url) as counted:
            rows += streams_rows(counted, inbox, cookie, count, stream_replies, seconds)
        rows[-2]["goal"] = "<= 50 ms CPU per change, 0 statements per page, p99 <= 1 s"
        rows[-1]["goal"] = "0 statements, <= 2 % of a core"
    finally:
        from django.db import connections

        connections.close_all()
        common.drop_database(url)

    print(f"live pages, load {common.load():.2f} (2 cores here: above 2, others were running)")
    print_rows(rows)
    if args.json:
        common.write_json(args.json, rows, {**common.machine(), "load": common.load()})
    return rows


if __name__ == "__main__":
    main()
