"""The production web process holds a bounded number of PostgreSQL sessions however many
requests it serves.

Each of its workers answers requests on WEB_THREADS threads (alwayson/web/serving.py), and
each thread keeps its connection between requests (CONN_MAX_AGE): at most one session per
thread, however many requests. (Under Django's ASGI handler each request's view ran on a
thread of its own, and a connection kept per thread was one more open session per request
served; PostgreSQL refused clients after about 80 webhooks. alwayson/asgi.py pools them for
an ASGI server.) Here gunicorn runs exactly as production starts it
(alwayson/ops/processes.py) and takes signed GitHub deliveries from several client threads;
its sessions, told apart by their application_name, are counted after each batch, so a leak
fails the test before it exhausts the shared cluster's connections. And a kept session
PostgreSQL ended (a restart, a failover) is replaced, not handed to a request.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from tests.support.processes import wait_for
from tests.support.web import ProductionWeb, exchange, github_delivery

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

WORKERS = 2
WEB_THREADS = 4
# Each worker's budget: a session per thread, and the metrics thread's while it adds the counts
# (alwayson/ops/metrics/). No page is open, so no stream's hub holds its LISTEN connection
# and its refreshing threads' sessions.
SESSIONS_PER_WORKER = WEB_THREADS + 1
THREADS = 8
BATCH = 40
BATCHES = 8  # 320 deliveries


@pytest.fixture
def web(tmp_path, transactional_db):
    """The production web command on the test database; stopped before the flush."""
    server = ProductionWeb(tmp_path, WEB_CONCURRENCY=str(WORKERS), WEB_THREADS=str(WEB_THREADS))
    yield server
    server.stop()


def deliver(server, slug, key):
    return exchange(server, github_delivery(slug, key)).status


def sessions(application_name):
    """The server's sessions: their backends' pids."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application_name]
        )
        return [pid for (pid,) in cursor.fetchall()]


def deliveries(threads, web, slugs, batch):
    """BATCH deliveries spread over the inboxes, sent at once: their statuses."""
    keys = [f"delivery-{batch}-{n}" for n in range(BATCH)]
    return list(threads.map(deliver, [web] * BATCH, slugs * (BATCH // THREADS), keys))


def test_the_web_process_keeps_a_session_per_thread_however_many_requests(web, make_inbox):
    from inbox.models import Event

    slugs = [make_inbox(f"hooks-{n}").slug for n in range(THREADS)]
    bound = WORKERS * SESSIONS_PER_WORKER
    statuses, counts = [], []
    with ThreadPoolExecutor(THREADS) as threads:
        for batch in range(BATCHES):
            statuses += deliveries(threads, web, slugs, batch)
            counts.append(len(sessions(web.application_name)))
            # A leak is stopped here, long before max_connections (other tests share it).
            assert counts[-1] <= bound, (counts, web.log()[-2000:])

    assert statuses == [202] * BATCH * BATCHES, web.log()[-2000:]
    assert Event.objects.count() == BATCH * BATCHES
    assert 0 < counts[-1] <= bound, counts


def test_a_kept_session_the_server_ended_is_replaced_before_a_request_gets_it(web, make_inbox):
    """What a PostgreSQL restart or a failover does to every connection the threads keep."""
    slugs = [make_inbox(f"hooks-{n}").slug for n in range(THREADS)]
    with ThreadPoolExecutor(THREADS) as threads:
        assert deliveries(threads, web, slugs, "before") == [202] * BATCH, web.log()[-2000:]
        ended = sessions(web.application_name)
        assert ended
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s) AS pid", [ended])
        wait_for(
            lambda: not set(ended) & set(sessions(web.application_name)),
            10,
            "the server to end the web's sessions",
        )
        after = deliveries(threads, web, slugs, "after")

    assert after == [202] * BATCH, web.log()[-3000:]
