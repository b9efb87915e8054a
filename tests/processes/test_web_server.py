"""The production web process (alwayson/ops/processes.py's "web": gunicorn with
alwayson/web/serving.py's workers) bounds a request's body before it is read, and answers what
a plain WSGI server answers: on SQLite and on PostgreSQL.

A body declared larger than any view accepts (ALWAYSON_REQUEST_MAX_BYTES) is refused with 413
as soon as the headers arrive, none of it read, nothing written under the process's temporary
directory; a chunked body, whose size nobody declares, is read up to that limit and cut there.
A client that half-closes its socket after a whole request is answered. Connections kept
alive are spread over the workers.
"""

import json
import os
import re
import socket
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from inbox.models import Event
from tests.support.processes import child_pids, wait_for
from tests.support.web import (
    GITHUB_BODY,
    ProductionWeb,
    collect_static,
    connect,
    exchange,
    github_delivery,
    head,
    read_answer,
)

pytestmark = pytest.mark.django_db(transaction=True)

FIFTY_MIB = 50 * 1024 * 1024


@pytest.fixture
def web(tmp_path, transactional_db):
    """Stopped before the test database is flushed."""
    server = ProductionWeb(tmp_path, WEB_CONCURRENCY="1")
    yield server
    server.stop()


@pytest.fixture
def desk(make_inbox):
    return make_inbox("desk")


def written_under(directory):
    return sorted(str(path) for path in directory.rglob("*"))


def test_a_signed_webhook_is_stored_and_answered_202(web, desk):
    answer = exchange(web, github_delivery("desk", "delivery-1"))

    assert answer.status == 202, web.log()[-2000:]
    assert Event.objects.filter(inbox=desk, source="github").count() == 1


def test_a_request_whose_client_half_closed_its_socket_after_sending_it_is_answered(web, desk):
    answer = exchange(web, github_delivery("desk", "half-closed"), half_close=True)

    assert answer.status == 202, web.log()[-2000:]
    assert Event.objects.filter(inbox=desk, source_id__endswith="half-closed").count() == 1


def test_a_kept_alive_connection_is_answered_request_after_request_and_two_sent_at_once(web, desk):
    """The thread that answered serves the connection's next request itself when it comes at
    once (or came with the last), as a load generator or a proxy sends them."""
    with connect(web) as sock:
        answers = []
        for n in range(3):
            sock.sendall(github_delivery("desk", f"in-a-row-{n}"))
            answers.append(read_answer(sock))
        sock.sendall(github_delivery("desk", "together-1") + github_delivery("desk", "together-2"))
        sock.shutdown(socket.SHUT_WR)  # then gunicorn closes it once both are answered
        rest = b""
        while data := sock.recv(65536):
            rest += data

    assert [(answer.status, answer.closed) for answer in answers] == [(202, False)] * 3
    assert re.findall(rb"HTTP/1\.1 (\d+) ", rest) == [b"202", b"202"], rest
    assert Event.objects.filter(inbox=desk, source="github").count() == 5


def test_a_client_sending_its_body_slowly_does_not_hold_the_worker(web, desk):
    """The worker's one process answers other deliveries while a client is still sending a
    body: that request has run past its turn (alwayson/web/serving.py's Turns)."""
    slow = github_delivery("desk", "slow-body")
    with connect(web) as sock:
        sock.sendall(slow[:-10])

        answers = [exchange(web, github_delivery("desk", f"meanwhile-{n}")) for n in range(3)]

        assert [answer.status for answer in answers] == [202] * 3, web.log()[-2000:]
        sock.sendall(slow[-10:])
        assert read_answer(sock).status == 202, web.log()[-2000:]
    assert Event.objects.filter(inbox=desk, source="github").count() == 4


@pytest.mark.parametrize("declared", ["9" * 20, str(FIFTY_MIB)], ids=["20 digits", "50 MiB"])
def test_a_body_declared_over_the_limit_is_refused_413_before_any_of_it_is_sent(
    web, desk, declared
):
    request = head("POST", "/hooks/github/desk/", {"Content-Type": "application/json"}, declared)

    answer = exchange(web, request, until_closed=True)  # the headers only

    assert answer.status == 413, web.log()[-2000:]
    limit = settings.ALWAYSON_REQUEST_MAX_BYTES
    assert answer.body == f"the body is larger than {limit} bytes\n".encode()
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert answer.closed
    assert written_under(web.tmp) == []
    assert not Event.objects.exists()


def test_a_body_over_the_limit_being_sent_is_refused_413_and_nothing_reaches_the_disk(web, desk):
    sock = connect(web)
    sock.sendall(
        head("POST", "/hooks/github/desk/", {"Content-Type": "application/json"}, FIFTY_MIB)
    )

    def send_the_body():
        try:
            for _ in range(FIFTY_MIB // 65536):
                sock.sendall(b"x" * 65536)
        except OSError:
            pass  # the server closed the connection: what it should do

    sending = threading.Thread(target=send_the_body)
    sending.start()
    try:
        answer = read_answer(sock, until_closed=True)
    finally:
        sock.close()
        sending.join()

    assert answer.status == 413, web.log()[-2000:]
    assert answer.closed
    assert written_under(web.tmp) == []
    assert not Event.objects.exists()


@pytest.mark.parametrize("length", ["-1", "twelve", "1e3"])
def test_a_content_length_that_is_not_a_length_is_refused_400(web, desk, length):
    request = head("POST", "/hooks/github/desk/", {"Content-Length": length}) + GITHUB_BODY

    answer = exchange(web, request, until_closed=True)

    assert answer.status == 400
    assert answer.closed
    assert not Event.objects.exists()


def test_a_chunked_delivery_within_the_limit_is_read_whole_and_stored(web, desk):
    answer = exchange(web, github_delivery("desk", "chunked", chunked=True))

    assert answer.status == 202, web.log()[-2000:]
    assert Event.objects.filter(inbox=desk, source_id__endswith="chunked").count() == 1


def test_a_chunked_body_is_cut_at_the_limit_with_413(web, desk):
    body = b"x" * (settings.ALWAYSON_REQUEST_MAX_BYTES + 1)

    answer = exchange(
        web, github_delivery("desk", "too-long", body=body, chunked=True), until_closed=True
    )

    assert answer.status == 413, web.log()[-2000:]
    assert answer.closed
    assert written_under(web.tmp) == []
    assert not Event.objects.exists()


# --- its log lines -----------------------------------------------------------------------------

# alwayson's text line (alwayson/ops/logs.py): time, level, logger, message.
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) \S+ ")
# gunicorn's own formats: its error log's "[time] [pid] [LEVEL]" and the combined access log's
# "host - user [time]".
GUNICORN_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d |^\S+ - \S+ \[\d\d/\w{3}/\d{4}:")


def gunicorn_lines(web):
    web.terminate()
    return [line for line in web.log().splitlines() if "gunicorn" in line]


def test_the_web_process_writes_gunicorn_s_lines_in_alwayson_s_format(tmp_path, transactional_db):
    collect_static()  # the favicon's redirect names its hashed file
    web = ProductionWeb(tmp_path, WEB_CONCURRENCY="1")
    try:
        urllib.request.urlopen(f"{web.url}/favicon.ico", timeout=10).close()
        log = web.log()
        lines = gunicorn_lines(web)
    finally:
        web.stop()

    assert [line for line in log.splitlines() if GUNICORN_LINE.search(line)] == []
    assert all(TEXT_LINE.match(line) for line in lines), lines
    assert any(" INFO gunicorn.error Booting worker with pid: " in line for line in lines), lines
    [access] = [line for line in lines if " gunicorn.access " in line and "/favicon.ico" in line]
    assert re.search(r'127\.0\.0\.1 "GET /favicon\.ico HTTP/1\.1" 302 0 \d+ms "-" ', access)


def test_the_web_process_writes_json_lines_when_asked(tmp_path, transactional_db):
    collect_static()  # the favicon's redirect names its hashed file
    web = ProductionWeb(tmp_path, WEB_CONCURRENCY="1", ALWAYSON_LOG_FORMAT="json")
    try:
        urllib.request.urlopen(f"{web.url}/favicon.ico", timeout=10).close()
        lines = [json.loads(line) for line in gunicorn_lines(web)]
    finally:
        web.stop()

    loggers = {line["logger"] for line in lines}
    assert loggers == {"gunicorn.error", "gunicorn.access"}
    [access] = [line for line in lines if "/favicon.ico" in line["message"]]
    assert access["logger"] == "gunicorn.access"
    assert access["level"] == "INFO"
    assert '"GET /favicon.ico HTTP/1.1" 302' in access["message"]


def connections_held(pids, port):
    """How many connections to `port` each of `pids` holds open, from /proc: the server's end
    of each (local port `port`, ESTABLISHED), matched to the processes' descriptors."""
    ends = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "01":
            ends.add(f"socket:[{fields[9]}]")
    held = {}
    for pid in pids:
        descriptors = Path(f"/proc/{pid}/fd")
        held[pid] = sum(1 for fd in descriptors.iterdir() if _target(fd) in ends)
    return held


def _target(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def kept_alive(web, count):
    """`count` connections opened at once, as a load generator opens its own, each then kept
    alive after a delivery answered."""
    clients = [connect(web) for _ in range(count)]  # all waiting before a worker accepts one
    for client in clients:
        client.sendall(github_delivery("desk", f"kept-{uuid.uuid4()}"))
    for client in clients:
        answer = read_answer(client)
        assert (answer.status, answer.closed) == (202, False), web.log()[-2000:]
    return clients


def test_connections_kept_alive_are_spread_evenly_over_the_workers(tmp_path, desk):
    # The hold long enough for the other worker's main thread to get a core on a machine
    # running three suites at once (20 ms was not, in CI: 5 and 3): this is about where each
    # connection goes, not about how long a worker waits for another.
    web = ProductionWeb(tmp_path, WEB_CONCURRENCY="2", ALWAYSON_WEB_ACCEPT_HOLD_MS="500")
    clients = []
    try:
        workers = wait_for(
            lambda: len(pids := child_pids(web.process.pid)) == 2 and pids, 30, "two workers"
        )

        def both_serving():
            # A worker still loading the application takes no connection yet.
            probes = kept_alive(web, 2)
            try:
                return 0 not in connections_held(workers, web.port).values()
            finally:
                for probe in probes:
                    probe.close()

        wait_for(both_serving, 30, "both workers to serve", period=0.1)
        wait_for(lambda: sum(connections_held(workers, web.port).values()) == 0, 10, "no probe")
        clients = kept_alive(web, 8)
        held = connections_held(workers, web.port)
    finally:
        for client in clients:
            client.close()
        web.stop()

    assert sorted(held.values()) == [4, 4], held
