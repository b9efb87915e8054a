"""The production web process (alwayson/ops/processes.py's "web": gunicorn with
alwayson/web/serving.py's workers) bounds a request's body before it is read, and answers what
a plain WSGI server answers: on SQLite and on PostgreSQL.

A body declared larger than any view accepts (ALWAYSON_REQUEST_MAX_BYTES) is refused with 413
as soon as the headers arrive, none of it read, nothing written under the process's temporary
directory; a chunked body, whose size nobody declares, is read up to that limit and cut there.
A client that half-closes its socket after a whole request is answered.
"""

import threading

import pytest
from django.conf import settings

from inbox.models import Event
from tests.support.web import (
    GITHUB_BODY,
    ProductionWeb,
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
