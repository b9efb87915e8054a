"""The people's posts through gunicorn: the chat form and an approval's answer, each against a
reference view doing the same HTTP work (session login, CSRF, the form read, a 302) and one
INSERT.

    python bench/views.py [--requests 300] [--repeats 5]

It makes a database of its own (BENCH_DATABASE_URL's sibling `_views`; dropped at the end),
serves the product plus the reference from one gunicorn worker (the product's config,
persistent connections), and posts from one keep-alive connection, one request at a time,
interleaving the systems. It prints, per post, the median wall time and the worker's CPU per
request, and the queries per request (counted in this process through Django's test
client); ratio = reference / alwayson (1.0: as fast as the reference).

Also the URLconf of that gunicorn (ROOT_URLCONF is set to this module in the worker).
"""

import argparse
import http.client
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

PORT = 8937
REFERENCE_INSERT = """
    INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts, claim_gen,
                             error, available_at, created, updated)
    VALUES (%s, 'reference', %s, %s::jsonb, 'pending', 0, NULL, '', now(), now(), now())
"""


# --- the served side: the reference view and the URLconf -----------------------------------


def reference_post(request, slug):
    """Same HTTP work as the product's posts (login_required, CSRF by the middleware, the
    posted form read, a redirect), then one INSERT and nothing else."""
    import json

    from django.db import connection
    from django.shortcuts import redirect

    if not request.user.is_authenticated:
        return redirect("login")
    fields = {key: request.POST.get(key, "") for key in request.POST}
    with connection.cursor() as cursor:
        cursor.execute(
            REFERENCE_INSERT, [int(request.POST["inbox"]), str(uuid.uuid4()), json.dumps(fields)]
        )
    return redirect(request.path)


def __getattr__(name):
    # The URLconf, built when Django first asks (it needs Django set up; the script does not).
    if name == "urlpatterns":
        from django.urls import path

        from alwayson.urls import urlpatterns as product

        return [path("bench/reference/<slug:slug>/", reference_post), *product]
    raise AttributeError(name)


def application(environ, start_response):
    """gunicorn's entry: bench.settings with this module's URLconf."""
    global _handler
    if _handler is None:
        from django.conf import settings
        from django.core.wsgi import get_wsgi_application

        settings.ROOT_URLCONF = "bench.views"
        _handler = get_wsgi_application()
    return _handler(environ, start_response)


_handler = None


# --- the driving side ------------------------------------------------------------------------


def _setup(count):
    """An approver of one inbox, logged in (session cookie + CSRF cookie), and `count`
    waiting approvals per run to answer."""
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.sessions.backends.db import SessionStore
    from django.middleware.csrf import _get_new_csrf_string

    from inbox.models import Inbox, Membership, Role

    users = get_user_model()
    owner = users.objects.create_user("owner", password="bench-owner-pw")
    approver = users.objects.create_user("dana", password="bench-dana-pw")
    inbox = Inbox.objects.create(owner=owner, slug="support", name="Support")
    Membership.objects.create(inbox=inbox, user=approver, role=Role.APPROVER)
    session = SessionStore()
    session[SESSION_KEY] = str(approver.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = approver.get_session_auth_hash()
    session.save()
    csrf = _get_new_csrf_string()
    return inbox, approver, session.session_key, csrf


def _approvals(inbox, tag, count):
    from approvals.services import request_approval

    return [
        request_approval(inbox, f"{tag}-{n}", "refund order 1234", timedelta(hours=1))
        for n in range(count)
    ]


def _requests(kind, inbox, tag, count):
    """(path, form) for `count` posts of one kind."""
    if kind == "chat":
        return [
            (f"/inbox/{inbox.slug}/", {"message_id": str(uuid.uuid4()), "text": "hello"})
            for _ in range(count)
        ]
    if kind == "answer":
        return [(a.get_absolute_url(), {"answer": "yes"}) for a in _approvals(inbox, tag, count)]
    fields = {"chat-ref": ["message_id", "text"], "answer-ref": ["answer"]}[kind]
    return [
        (f"/bench/reference/{inbox.slug}/", {"inbox": inbox.pk, **{f: "yes" for f in fields}})
        for _ in range(count)
    ]


def _cpu_seconds(pid) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _post_all(requests, cookies, csrf, worker):
    """Post each form on one keep-alive connection: (µs wall, µs worker CPU) per request."""
    conn = http.client.HTTPConnection("127.0.0.1", PORT)
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookies}
    cpu, start = _cpu_seconds(worker), time.perf_counter()
    for path, form in requests:
        conn.request("POST", path, urlencode({**form, "csrfmiddlewaretoken": csrf}), headers)
        response = conn.getresponse()
        response.read()
        if response.status != 302:
            raise RuntimeError(f"{path}: {response.status}, not the redirect")
    wall = time.perf_counter() - start
    conn.close()
    n = len(requests)
    return wall / n * 1e6, (_cpu_seconds(worker) - cpu) / n * 1e6


def _count_queries(inbox, approver, csrf):
    """Queries per post, through Django's test client in this process."""
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    settings.ROOT_URLCONF = "bench.views"
    client = Client()
    client.force_login(approver)
    counts = {}
    # An inbox's first event takes ingest's slower path (no marker yet); the rest do not.
    client.post(*_requests("chat", inbox, "warm", 1)[0])
    for kind in ("chat", "chat-ref", "answer", "answer-ref"):
        path, form = _requests(kind, inbox, f"count-{kind}", 1)[0]
        with CaptureQueriesContext(connection) as queries:
            response = client.post(path, form)
        if response.status_code != 302:
            raise RuntimeError(f"{kind}: {response.status_code}, not the redirect")
        counts[kind] = len(queries.captured_queries)
    return counts


def _worker_pid(master, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.1)
    raise RuntimeError("gunicorn started no worker")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="posts per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per system")
    args = parser.parse_args(argv)
    url = common.sibling_url(common.bench_url(), "views")
    common.create_database(url)
    server = None
    try:
        common.setup_django(url)
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        inbox, approver, session_key, csrf = _setup(args.requests)
        counts = _count_queries(inbox, approver, csrf)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
        env = {
            **os.environ,
            **common.BENCH_ENV,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "ALWAYSON_WEB_BIND": f"127.0.0.1:{PORT}",
            "WEB_CONCURRENCY": "1",
        }
        gunicorn = os.path.join(os.path.dirname(sys.executable), "gunicorn")
        server = subprocess.Popen(
            [gunicorn, "--config", "python:alwayson.gunicorn_conf", "bench.views:application"],
            cwd=common.ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        worker = _worker_pid(server.pid)
        time.sleep(2)
        cookies = f"sessionid={session_key}; csrftoken={csrf}"
        pairs = (("chat", "chat-ref"), ("answer", "answer-ref"))
        figures = {kind: [] for pair in pairs for kind in pair}
        for n in range(args.repeats + 1):  # the first round warms up, not counted
            for pair in pairs:
                for kind in pair if n % 2 == 0 else reversed(pair):
                    requests = _requests(kind, inbox, f"{kind}-{n}", args.requests)
                    result = _post_all(requests, cookies, csrf, worker)
                    if n:
                        figures[kind].append(result)
        print(
            f"gunicorn, 1 sync worker, 1 keep-alive connection, {args.requests} posts x "
            f"{args.repeats} runs, interleaved; load {common.load():.2f}"
        )
        print(
            f"{'post':<12} {'wall µs':>9} {'cpu µs':>8} {'queries':>8} "
            f"{'ref wall':>9} {'ref cpu':>8} {'ref q':>6} {'ratio wall':>10} {'ratio cpu':>9}"
        )
        for kind, ref in pairs:
            wall = common.median([w for w, _ in figures[kind]])
            cpu = common.median([c for _, c in figures[kind]])
            ref_wall = common.median([w for w, _ in figures[ref]])
            ref_cpu = common.median([c for _, c in figures[ref]])
            print(
                f"{kind:<12} {wall:>9,.0f} {cpu:>8,.0f} {counts[kind]:>8} "
                f"{ref_wall:>9,.0f} {ref_cpu:>8,.0f} {counts[ref]:>6} "
                f"{ref_wall / wall:>10.2f} {ref_cpu / cpu:>9.2f}"
            )
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        from django.db import connection

        connection.close()
        common.drop_database(url)


if __name__ == "__main__":
    main()
