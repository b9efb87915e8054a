"""Which thread serves a kept-alive connection's next request (alwayson/web/serving.py's
Worker.next_request_here): the thread that answered the last one, as a sync worker would, when
the request is there already or comes at once while no other connection waits in line (the
thread leaves its turn to the line while it waits); otherwise gunicorn's poller, as before.
The requests themselves, on a real server: tests/processes/test_web_server.py."""

import io
import socket
import threading
from types import SimpleNamespace

import pytest

from alwayson.web import serving
from alwayson.web.serving import Turns, Worker
from tests.support.processes import wait_for

WAIT = 30  # seconds: a bound on a wait, never a measure


@pytest.fixture
def turns():
    made = Turns(4, 3600)
    yield made
    made.shutdown()


def worker(turns, alive=True):
    """The worker's state the decision reads (a Worker is otherwise made by gunicorn)."""
    made = Worker.__new__(Worker)
    made.alive = alive
    made.tpool = turns
    return made


def in_line(turns, connections):
    """`connections` waiting in line behind a request that is being served; the returned
    event ends it."""
    release = threading.Event()
    serving = threading.Event()

    def serve():
        serving.set()
        assert release.wait(WAIT)

    turns.submit(serve)
    assert serving.wait(WAIT)
    for _ in range(connections):
        turns.submit(lambda: None)
    return release


@pytest.fixture
def client():
    """(the server's end of a kept-alive connection as gunicorn holds it, the client's)."""
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        buffered = SimpleNamespace(unreader=SimpleNamespace(buf=io.BytesIO()))
        yield SimpleNamespace(sock=server_end, parser=buffered), client_end


def test_a_next_request_already_sent_is_served_by_the_thread_that_answered_the_last(client, turns):
    conn, sent = client
    sent.sendall(b"POST /hooks/github/desk/ HTTP/1.1\r\n")

    assert worker(turns).next_request_here(conn)


def test_a_client_that_sends_nothing_more_goes_back_to_the_poller(client, turns):
    conn, _ = client

    assert not worker(turns).next_request_here(conn)


def test_a_closed_client_is_left_to_the_request_s_own_read_which_ends_it(client, turns):
    conn, sent = client
    sent.close()

    assert worker(turns).next_request_here(conn)  # readable: the read finds the end and closes


@pytest.mark.parametrize("connections", [1, 3], ids=["one in line", "three in line"])
def test_no_thread_waits_for_its_client_while_another_connection_waits_in_line(
    client, turns, connections
):
    conn, sent = client
    sent.sendall(b"POST /hooks/github/desk/ HTTP/1.1\r\n")
    release = in_line(turns, connections)
    try:
        assert not worker(turns).next_request_here(conn)
    finally:
        release.set()


def test_no_thread_waits_for_its_client_when_no_other_could_serve_meanwhile(client):
    """The worker's only thread serving: a connection that came while it waited would wait."""
    conn, sent = client
    sent.sendall(b"POST /hooks/github/desk/ HTTP/1.1\r\n")
    turns = Turns(1, 3600)
    release = in_line(turns, 0)
    try:
        assert not worker(turns).next_request_here(conn)
    finally:
        release.set()
        turns.shutdown()


def test_a_request_read_with_the_last_body_is_served_at_once_however_busy(client, turns):
    conn, _ = client
    conn.parser.unreader.buf.write(b"POST /hooks/github/desk/ HTTP/1.1\r\n")
    release = in_line(turns, 2)
    try:
        assert worker(turns).next_request_here(conn)
    finally:
        release.set()


def test_a_connection_that_comes_while_a_thread_waits_for_its_client_is_served_meanwhile(
    client, turns, monkeypatch
):
    """Waiting for its client, the thread has left its turn: the line does not wait for it."""
    monkeypatch.setattr(serving, "NEXT_REQUEST_WAIT", 2 * WAIT)
    conn, sent = client
    polling = threading.Event()
    served = threading.Event()

    def waits_for_its_client():
        turns.step_in()  # as a thread serving a request holds its turn
        polling.set()
        return worker(turns).next_request_here(conn)

    waiting = turns.submit(waits_for_its_client)
    assert polling.wait(WAIT)
    turns.submit(served.set)

    assert served.wait(WAIT)
    wait_for(lambda: not turns.started, WAIT, "the other thread to end its turn")
    sent.sendall(b"POST /hooks/github/desk/ HTTP/1.1\r\n")
    assert waiting.result(WAIT) is True


def test_a_next_request_that_comes_while_another_thread_serves_goes_back_in_line(
    client, turns, monkeypatch
):
    """Requests stay one at a time: the connection goes back to gunicorn, whose poller puts it
    in line at once, and the serving thread takes it next."""
    monkeypatch.setattr(serving, "NEXT_REQUEST_WAIT", 2 * WAIT)
    conn, sent = client
    polling = threading.Event()

    def waits_for_its_client():
        turns.step_in()
        polling.set()
        return worker(turns).next_request_here(conn)

    waiting = turns.submit(waits_for_its_client)
    assert polling.wait(WAIT)
    release = in_line(turns, 0)
    try:
        sent.sendall(b"POST /hooks/github/desk/ HTTP/1.1\r\n")
        assert waiting.result(WAIT) is False
    finally:
        release.set()


def test_a_stopping_worker_hands_every_connection_back(client, turns):
    conn, sent = client
    sent.sendall(b"POST /hooks/github/desk/ HTTP/1.1\r\n")

    assert not worker(turns, alive=False).next_request_here(conn)
