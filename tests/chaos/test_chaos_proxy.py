"""The proxy the chaos run puts between each process and PostgreSQL (tests/support/tcp_proxy.py),
against a loopback echo server: it forwards, delays, goes silent and heals, aborts its
connections with an RST, and sends new connections elsewhere."""

import contextlib
import socket
import threading
import time

import pytest

from tests.support.tcp_proxy import TcpProxy


class Echo:
    """A TCP server on 127.0.0.1 that sends back what it gets, prefixed with its name."""

    def __init__(self, name: bytes):
        self.name = name
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn):
        with contextlib.suppress(OSError), conn:
            while data := conn.recv(1024):
                conn.sendall(self.name + data)

    def close(self):
        self.listener.close()


@pytest.fixture
def echo():
    server = Echo(b"a:")
    yield server
    server.close()


@pytest.fixture
def proxy(echo):
    with TcpProxy("127.0.0.1", echo.port) as running:
        yield running


def client(proxy, timeout=5.0):
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    sock.sendall(b"hi")
    assert sock.recv(1024) == b"a:hi"
    return sock


def round_trip(sock) -> float:
    started = time.monotonic()
    sock.sendall(b"x")
    assert sock.recv(1024).endswith(b"x")
    return time.monotonic() - started


def test_latency_delays_each_chunk_each_way_until_it_is_lifted(proxy):
    with client(proxy) as sock:
        proxy.delay(0.1)
        assert round_trip(sock) >= 0.2
        proxy.delay(0)
        assert round_trip(sock) < 0.1


def test_a_blackhole_holds_the_connection_open_and_silent_until_healed(proxy):
    with client(proxy, timeout=0.3) as sock:
        proxy.blackhole()
        sock.sendall(b"held")
        with pytest.raises(TimeoutError):
            sock.recv(1024)
        assert proxy.open_connections == 1
        proxy.heal()
        assert sock.recv(1024) == b"a:held"


def test_a_reset_aborts_every_open_connection_with_an_rst(proxy):
    first, second = client(proxy), client(proxy)
    with first, second:
        assert proxy.reset() == 2
        for sock in (first, second):
            with pytest.raises(ConnectionResetError):
                sock.sendall(b"x")
                sock.recv(1024)
        assert proxy.open_connections == 0
        with client(proxy):  # the listener stays open
            assert proxy.open_connections == 1


def test_retarget_sends_new_connections_to_the_other_server_and_leaves_open_ones(proxy):
    other = Echo(b"b:")
    try:
        with client(proxy) as old:
            proxy.retarget("127.0.0.1", other.port)
            old.sendall(b"1")
            assert old.recv(1024) == b"a:1"
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as new:
                new.sendall(b"2")
                assert new.recv(1024) == b"b:2"
    finally:
        other.close()


def test_a_connection_closed_by_either_end_leaves_the_proxy(proxy):
    with client(proxy):
        assert proxy.open_connections == 1
    deadline = time.monotonic() + 5
    while proxy.open_connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.open_connections == 0
