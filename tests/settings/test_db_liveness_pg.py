"""The liveness options reach every PostgreSQL connection a process opens: Django's own, and the
sessions the project opens beside it (the worker's LISTEN, the live pages' LISTEN); and a
connection through a network that went silent gives up after connect_timeout instead of
psycopg's 130 s. The options as libpq holds them (keepalives, tcp_user_timeout); psycopg
keeps connect_timeout itself, so that one is read from what the connection was opened with.
"""

import asyncio
import threading
import time

import psycopg
import pytest
from django.db import OperationalError, connection, connections

from alwayson.runtime.worker import WorkerPool
from alwayson.web import live
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

# The defaults (alwayson/settings/database.py), as libpq reports them.
LIBPQ = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
CONNECT_TIMEOUT = 10


def libpq_options(conn) -> dict:
    return {
        option.keyword.decode(): option.val.decode()
        for option in conn.pgconn.info
        if option.val is not None
    }


def liveness(options: dict) -> dict:
    return {key: options.get(key) for key in LIBPQ}


def test_djangos_connections_keep_alive_and_give_up_on_unacknowledged_data():
    connection.ensure_connection()

    assert liveness(libpq_options(connection.connection)) == LIBPQ
    assert connection.get_connection_params()["connect_timeout"] == CONNECT_TIMEOUT


@pytest.fixture
def opened(monkeypatch):
    """Every psycopg connection opened meanwhile: (the parameters it was given, libpq's)."""
    seen = []
    real, real_async = psycopg.connect, psycopg.AsyncConnection.connect.__func__

    def connect(*args, **kwargs):
        conn = real(*args, **kwargs)
        seen.append((kwargs, libpq_options(conn)))
        return conn

    async def connect_async(cls, *args, **kwargs):
        conn = await real_async(cls, *args, **kwargs)
        seen.append((kwargs, libpq_options(conn)))
        return conn

    monkeypatch.setattr(psycopg, "connect", connect)
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(connect_async))
    return seen


def test_the_workers_listen_connection_has_them_too(opened):
    pool = WorkerPool("listen-liveness", agent=lambda run: None)
    listening = threading.Thread(target=pool.listen)
    listening.start()
    try:
        deadline = time.monotonic() + 20
        while not opened and time.monotonic() < deadline:
            time.sleep(0.02)  # waiting for the thread to connect, not moving time
    finally:
        pool.request_stop()
        listening.join(10)

    [(given, libpq)] = opened
    assert given["connect_timeout"] == CONNECT_TIMEOUT
    assert liveness(libpq) == LIBPQ
    assert given["application_name"] == connection.get_connection_params()["application_name"]


def test_the_live_pages_listen_connection_has_them_too(opened):
    async def scenario():
        hub = live.Hub()
        hub.task = asyncio.get_running_loop().create_task(hub.listen())
        try:
            await asyncio.wait_for(hub.listening.wait(), 20)
        finally:
            await hub.stop()

    asyncio.run(scenario())

    assert opened
    for given, libpq in opened:
        assert given["connect_timeout"] == CONNECT_TIMEOUT
        assert liveness(libpq) == LIBPQ


def test_a_connection_through_a_silent_network_gives_up_after_the_connect_timeout():
    db = connection.settings_dict
    with TcpProxy(db["HOST"] or "127.0.0.1", db["PORT"] or 5432) as proxy:
        proxy.blackhole()
        wrapper = type(connections["default"])
        silent = wrapper({**db, "HOST": "127.0.0.1", "PORT": proxy.port}, "silent")
        started = time.monotonic()
        with pytest.raises(OperationalError):
            silent.ensure_connection()
        waited = time.monotonic() - started

    assert proxy.accepted >= 1  # it did reach the proxy: the network took it, then went silent
    assert CONNECT_TIMEOUT - 0.5 <= waited < CONNECT_TIMEOUT + 10
