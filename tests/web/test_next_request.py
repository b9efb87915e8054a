"""Which thread serves a kept-alive connection's next request (alwayson/web/serving.py's
Worker.next_request_here): the thread that answered the last one, as a sync worker would, when
the request is there already or comes at once and another thread stays free for everyone
else; otherwise gunicorn's poller, as before. The requests themselves, on a real server:
tests/processes/test_web_server.py."""

import io
import socket
import threading
from types import SimpleNamespace

import pytest

from alwayson.web.serving import Worker


def worker(threads=4, serving=1, queued=0, alive=True):
    """The worker's state the decision reads (a Worker is otherwise made by gunicorn)."""
    made = Worker.__new__(Worker)
    made.alive = alive
    made.cfg = SimpleNamespace(threads=threads)
    made.counting = threading.Lock()
    made.serving, made.queued = serving, queued
    return made


@pytest.fixture
def client():
    """(the server's end of a kept-alive connection as gunicorn holds it, the client's)."""
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        buffered = SimpleNamespace(unreader=SimpleNamespace(buf=io.BytesIO()))
        yield SimpleNamespace(sock=server_end, parser=buffered), client_end


def test_a_next_request_already_sent_is_served_by_the_thread_that_answered_the_last(client):
    conn, sent = client
    sent.sendall(b"POST /hooks/github/desk/ HTTP/1.1\r\n")

    assert worker().next_request_here(conn)


def test_a_client_that_sends_nothing_more_goes_back_to_the_poller(client):
    conn, _ = client

    assert not worker().next_request_here(conn)


def test_a_closed_client_is_left_to_the_request_s_own_read_which_ends_it(client):
    conn, sent = client
    sent.close()

    assert worker().next_request_here(conn)  # readable: the read finds the end and closes


@pytest.mark.parametrize(
    "serving, queued", [(4, 0), (3, 1), (1, 3)], ids=["all serving", "one queued", "three queued"]
)
def test_no_thread_waits_for_its_client_unless_another_stays_free(client, serving, queued):
    conn, sent = client
    sent.sendall(b"POST /hooks/github/desk/ HTTP/1.1\r\n")

    assert not worker(threads=4, serving=serving, queued=queued).next_request_here(conn)


def test_a_request_read_with_the_last_body_is_served_at_once_however_busy(client):
    conn, _ = client
    conn.parser.unreader.buf.write(b"POST /hooks/github/desk/ HTTP/1.1\r\n")

    assert worker(threads=4, serving=4, queued=2).next_request_here(conn)


def test_a_stopping_worker_hands_every_connection_back(client):
    conn, sent = client
    sent.sendall(b"POST /hooks/github/desk/ HTTP/1.1\r\n")

    assert not worker(alive=False).next_request_here(conn)
