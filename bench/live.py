"""Live pages' speed (alwayson/web/live.py), side by side in one run:

(a) an agent's reply, from the commit of its outbox row to the page's DOM showing it, in
    Chromium: pushed (the production web command, gunicorn with uvicorn's workers, ASGI) and
    polled once a second (the same gunicorn serving WSGI, where pages fall back to polling:
    the old shape), p50 and p99 over N replies. Goal: pushed p50 <= 150 ms, p99 <= 500 ms.
(b) 500 idle pages' streams held by one web process: its CPU (% of one core) and the
    database's transactions per second over 30 s. Goal: <= 10 %, 0 per second.

Standalone: `.venv/bin/python bench/live.py [--quick] [--json live.json]`, on PostgreSQL
(BENCH_DATABASE_URL's server; it makes and drops its own `<name>_live` database).
"""

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

CHROMIUM = os.environ.get("ALWAYSON_TEST_CHROMIUM", "/usr/bin/chromium")
PUSHED = ("--worker-class", "alwayson.gunicorn_conf.Worker", "alwayson.asgi")
POLLED = ("alwayson.wsgi",)
SETTINGS = "bench.live_settings"
CONVERSATION = 50  # messages already shown: the measured page
SETTLE = 11  # seconds


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
    import django

    django.setup()


class Web:
    """One gunicorn web process (one worker) on `url`'s database."""

    def __init__(self, app_args, url):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            **common.BENCH_ENV,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": SETTINGS,
            "ALWAYSON_WEB_BIND": f"127.0.0.1:{self.port}",
            "WEB_CONCURRENCY": "1",
        }
        gunicorn = os.path.join(os.path.dirname(sys.executable), "gunicorn")
        self.process = subprocess.Popen(
            [gunicorn, "--config", "python:alwayson.gunicorn_conf", *app_args],
            cwd=common.ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait()

    def _wait(self):
        import urllib.request

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the web process exited")
            try:
                with urllib.request.urlopen(f"{self.base}/accounts/login/", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the web process did not answer")

    def pids(self):
        """gunicorn's master and its worker."""
        pids = [self.process.pid]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == self.process.pid:
                    pids.append(int(stat.parent.name))
            except (OSError, IndexError, ValueError):
                continue
        return pids

    def cpu_seconds(self):
        ticks = 0
        for pid in self.pids():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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


# --- (a) reply latency -------------------------------------------------------------------------

WATCH = """() => {
  window.seenAt = {};
  const look = () => {
    for (const body of document.querySelectorAll("#conversation .entry.agent .body")) {
      const match = /^reply-PREFIX-(\\d+)$/.exec(body.textContent.trim());
      if (match && !(match[1] in window.seenAt)) window.seenAt[match[1]] = Date.now();
    }
  };
  new MutationObserver(look).observe(document.body, {subtree: true, childList: true});
}"""


def reply_latencies(web, inbox, cookie, replies, prefix):
    """Milliseconds from each reply's commit to its text in the page, in order."""
    from django.db import connection, transaction
    from playwright.sync_api import sync_playwright

    from inbox import clock
    from outbox.models import OutboxMessage

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # the ORM beside Playwright's loop
    latencies = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        context = browser.new_context()
        context.add_cookies([{"name": cookie[0], "value": cookie[1], "url": web.base}])
        page = context.new_page()
        page.goto(f"{web.base}/inbox/{inbox.slug}/")
        page.wait_for_selector("#conversation[data-live-cursor]")
        page.evaluate(WATCH.replace("PREFIX", prefix))
        time.sleep(1.5)  # the stream open, or the polls going
        for n in range(replies):
            time.sleep(random.uniform(0.2, 1.2))  # any phase of the poll's second
            with transaction.atomic():
                OutboxMessage.objects.create(
                    inbox=inbox, body=f"reply-{prefix}-{n}", created=clock.database_now()
                )
            committed = time.time() * 1000
            page.wait_for_function(f"() => window.seenAt[{n}] !== undefined", timeout=10_000)
            latencies.append(page.evaluate(f"window.seenAt[{n}]") - committed)
        browser.close()
    connection.close()
    return latencies


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


# --- (b) idle streams ----------------------------------------------------------------------------


async def hold_streams(web, path, cookie, count, seconds, sample, watch):
    """Open `count` streams, let them settle, and return sample() around `seconds` of idling,
    calling watch() four times a second meanwhile."""
    host = urlsplit(web.base)
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host.netloc}\r\nAccept: text/event-stream\r\n"
        f"Cookie: {cookie[0]}={cookie[1]}\r\n\r\n"
    ).encode()
    opened = []

    async def one():
        reader, writer = await asyncio.open_connection(host.hostname, host.port)
        writer.write(request)
        head = await reader.readuntil(b"retry: ")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(head[:200])
        opened.append(writer)
        while await reader.read(4096):  # heartbeats, until closed
            pass

    tasks = []
    for start in range(0, count, 50):
        batch = [asyncio.create_task(one()) for _ in range(min(50, count - start))]
        tasks += batch
        while len(opened) < len(tasks):
            await asyncio.sleep(0.05)
            failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
            if failed:
                raise failed[0].exception()
    # Their opening queries done, and counted: a backend reports its transactions at most
    # 10 s after it goes idle.
    await asyncio.sleep(SETTLE)
    before = sample()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        watch()
        await asyncio.sleep(0.25)
    after = sample()
    alive = sum(not task.done() for task in tasks)
    for writer in opened:
        writer.close()
    for task in tasks:
        task.cancel()
    return before, after, alive


def idle_cost(web, url, inbox, cookie, count, seconds):
    """(CPU % of one core, the database's transactions per second, the statements the web's
    own connections started per second, streams still open at the end) of `count` idle
    streams."""
    import psycopg

    from alwayson.web import live

    since = live.inbox_cursor(inbox.pk)
    path = f"/inbox/{inbox.slug}/stream/?since={since}"
    name = common.database_name(url)
    stats = psycopg.connect(url, autocommit=True)
    started = {}  # a web backend's pid: the start of each statement seen
    activity = (
        "SELECT pid, query_start FROM pg_stat_activity WHERE datname = %s"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )

    def sample():
        watch()
        if not first:  # the window opens: what the streams' opening ran is not counted
            first.update({pid: set(starts) for pid, starts in started.items()})
        row = stats.execute(
            "SELECT pg_stat_force_next_flush(), xact_commit + xact_rollback"
            " FROM pg_stat_database WHERE datname = %s",
            [name],
        ).fetchone()
        return time.monotonic(), web.cpu_seconds(), row[1]

    def watch():
        for pid, query_start in stats.execute(activity, [name]).fetchall():
            started.setdefault(pid, set()).add(query_start)

    first = {}
    before, after, alive = asyncio.run(
        hold_streams(web, path, cookie, count, seconds, sample, watch)
    )
    stats.close()
    elapsed = after[0] - before[0]
    cpu = 100 * (after[1] - before[1]) / elapsed
    # The sampling's own transactions (one per sample, one per watch) are not the web's.
    watches = round(seconds / 0.25) + 2
    transactions = max(0, after[2] - before[2] - 1 - watches) / elapsed
    statements = sum(len(starts - first.get(pid, set())) for pid, starts in started.items())
    return cpu, transactions, statements / elapsed, alive


# --- the run -----------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer replies, 10 s of idling")
    parser.add_argument("--replies", type=int, default=None, help="replies per mode (60)")
    parser.add_argument("--idle", type=int, default=500, help="idle streams (500)")
    parser.add_argument("--seconds", type=float, default=None, help="idling measured (30)")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args(argv)
    replies = args.replies or (15 if args.quick else 60)
    seconds = args.seconds or (10 if args.quick else 30)

    url = common.sibling_url(common.bench_url(), "live")
    common.create_database(url)
    try:
        migrate(url)
        setup_django(url)
        inbox, cookie_name, session_key = make_page()
        cookie = (cookie_name, session_key)
        rows = []
        latencies = {}
        for mode, app in (("pushed", PUSHED), ("polled", POLLED)):
            web = Web(app, url)
            try:
                latencies[mode] = reply_latencies(web, inbox, cookie, replies, mode)
            finally:
                web.stop()
        for mode in ("pushed", "polled"):
            values = latencies[mode]
            rows.append(
                {
                    "measure": f"reply visible after commit, {mode}",
                    "p50_ms": statistics.median(values),
                    "p99_ms": percentile(values, 0.99),
                    "n": len(values),
                    "goal": "p50 <= 150 ms, p99 <= 500 ms" if mode == "pushed" else "(the old way)",
                }
            )
        web = Web(PUSHED, url)
        try:
            cpu, per_second, statements, alive = idle_cost(
                web, url, inbox, cookie, args.idle, seconds
            )
        finally:
            web.stop()
        rows.append(
            {
                "measure": f"{args.idle} idle streams, one web process, {seconds:g} s",
                "cpu_percent": cpu,
                "db_transactions_per_s": per_second,
                "web_statements_per_s": statements,
                "streams_open_at_end": alive,
                "goal": "<= 10 % of one core, 0 per second",
            }
        )
    finally:
        from django.db import connections

        connections.close_all()
        common.drop_database(url)

    print(f"live pages, load {common.load():.2f} (2 cores here: above 2, others were running)")
    for entry in rows[:2]:
        met = entry["p50_ms"] <= 150 and entry["p99_ms"] <= 500
        print(
            f"{entry['measure']:<42} p50 {entry['p50_ms']:7.0f} ms  p99 {entry['p99_ms']:7.0f} ms"
            f"  (n={entry['n']})  goal {entry['goal']}"
            + (f"  met: {'yes' if met else 'no'}" if "pushed" in entry["measure"] else "")
        )
    idle = rows[2]
    met = idle["cpu_percent"] <= 10 and idle["web_statements_per_s"] == 0
    print(
        f"{idle['measure']:<42} CPU {idle['cpu_percent']:.1f} % of a core,"
        f" {idle['web_statements_per_s']:.2f} statements/s from the web's connections"
        f" ({idle['db_transactions_per_s']:.2f} transactions/s in the whole database, autovacuum"
        f" included), {idle['streams_open_at_end']} streams still open"
        f"  goal {idle['goal']}  met: {'yes' if met else 'no'}"
    )
    if args.json:
        common.write_json(args.json, rows, {**common.machine(), "load": common.load()})
    return rows


if __name__ == "__main__":
    main()
