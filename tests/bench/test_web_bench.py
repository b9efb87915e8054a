"""The web rows' tools: the wrk scripts (run for a second against a small local server that
records what they send; nothing is timed), the oversize and half-close probes against toy
sockets, the statement counter of the live rows, and the waiting approvals the answer rows
copy (PostgreSQL: they are found through its catalog)."""

import hashlib
import hmac
import json
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench import limits, load

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Recorder(BaseHTTPRequestHandler):
    """Keeps every request (method, path, headers, body) and answers as a product view
    would: 202 for a webhook, 302 for a form, 404 for anything else."""

    protocol_version = "HTTP/1.1"
    seen: list

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.seen.append((self.command, self.path, dict(self.headers), body))
        if self.path.startswith("/hooks/"):
            status = 202
        elif self.command == "POST":
            status = 302
        else:
            status = 404
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


class QuietServer(ThreadingHTTPServer):
    """wrk drops its connections when its time is up, mid-request: not worth a traceback."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture
def recorder():
    seen = []
    handler = type("Handler", (Recorder,), {"seen": seen})
    server = QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def slugs_file(tmp_path):
    path = tmp_path / "slugs"
    path.write_text("web-0\nweb-1\nweb-2\n")
    return path


def posts(seen):
    return [entry for entry in seen if entry[0] == "POST"]


def test_the_webhook_script_signs_once_and_sends_a_new_delivery_each_time(
    recorder, slugs_file, tmp_path
):
    base, seen = recorder
    body = b'{"action": "opened"}'
    (tmp_path / "body.json").write_bytes(body)
    signature = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()

    result = load.run(
        base, "webhook.lua", 4, 1, (slugs_file, tmp_path / "body.json", signature, "run7")
    )

    assert result.requests > 0 and result.unexpected(202) == {}
    assert result.statuses[202] == result.requests <= len(seen)
    deliveries = [headers["X-GitHub-Delivery"] for _, _, headers, _ in seen]
    assert len(set(deliveries)) == len(deliveries)  # every delivery new
    assert all(re.fullmatch(r"run7-[12]-\d+", delivery) for delivery in deliveries)
    for method, path, headers, sent in seen:
        assert method == "POST" and sent == body
        assert re.fullmatch(r"/hooks/github/web-[012]/", path)
        assert headers["X-Hub-Signature-256"] == signature
        assert headers["Content-Type"] == "application/json"
        assert (headers["X-GitHub-Hook-ID"], headers["X-GitHub-Event"]) == ("1", "issues")
    assert {path for _, path, _, _ in seen} == {f"/hooks/github/web-{n}/" for n in range(3)}


def test_the_chat_script_posts_the_form_with_a_new_uuid_shaped_message_id(recorder, slugs_file):
    base, seen = recorder
    cookie = "sessionid=abc; csrftoken=def"

    result = load.run(base, "chat.lua", 4, 1, (slugs_file, cookie, "TOKEN123", 0x10000005))

    assert result.requests > 0 and result.unexpected(302) == {}
    ids = []
    for method, path, headers, body in seen:
        form = dict(pair.split("=", 1) for pair in body.decode().split("&"))
        assert method == "POST" and re.fullmatch(r"/inbox/web-[012]/", path)
        assert headers["Cookie"] == cookie
        assert headers["Content-Type"] == "application/x-www-form-urlencoded"
        assert form["csrfmiddlewaretoken"] == "TOKEN123" and form["text"]
        assert UUID.fullmatch(form["message_id"]) and form["message_id"].startswith("10000005-")
        ids.append(form["message_id"])
    assert len(set(ids)) == len(ids)


def test_the_answer_script_takes_each_threads_prepared_ids_in_order_then_says_it_ran_out(
    recorder, slugs_file, tmp_path
):
    base, seen = recorder
    prefix = tmp_path / "ids"
    for thread in (1, 2):
        lines = [f"web-{n % 3} r-{thread}-{n}" for n in range(5)]
        Path(f"{prefix}.{thread}").write_text("\n".join(lines) + "\n")

    result = load.run(
        base, "answer.lua", 4, 1, (slugs_file, "sessionid=a", "TOK", "/approvals/", prefix, "t")
    )

    answered = [path for _, path, _, _ in posts(seen)]
    assert len(answered) == len(set(answered))  # each once
    # wrk calls the first thread's request() once before the run, to check the script: that
    # thread's first id is taken and never sent (its approval stays waiting).
    assert set(answered) == {
        f"/approvals/web-{n % 3}/r-{thread}-{n}/"
        for thread, first in ((1, 1), (2, 0))
        for n in range(first, 5)
    }
    assert all(body == b"csrfmiddlewaretoken=TOK&answer=yes" for _, _, _, body in posts(seen))
    assert result.exhausted > 0
    assert {path for method, path, _, _ in seen if method == "GET"} == {"/bench/exhausted/"}
    assert result.unexpected(302)["ran out of prepared request ids"] == result.exhausted


def test_the_answer_script_numbers_the_reference_views_ids_without_a_file(recorder, slugs_file):
    base, seen = recorder
    args = (slugs_file, "sessionid=a", "TOK", "/bench/answer/", "-", "ref3")

    result = load.run(base, "answer.lua", 2, 1, args)

    assert result.requests > 0 and result.unexpected(302) == {}
    paths = [path for _, path, _, _ in seen]
    assert all(re.fullmatch(r"/bench/answer/web-[012]/ref3-[12]-\d+/", path) for path in paths)
    assert len(set(paths)) == len(paths)


# --- bodies bounded before they are read (bench/limits.py) ---------------------------------------


class ToyServer:
    """A socket that answers each request's headers with `answer` (or never), standing in
    for a web server: its port, its temporary directory, its processes (this one)."""

    def __init__(self, tmp_path, answer):
        import os

        self.answer = answer
        self.tmpdir = tmp_path
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests = []
        self.pid = os.getpid()
        threading.Thread(target=self.serve, daemon=True).start()

    def pids(self):
        return [self.pid]

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                head += chunk
            self.requests.append(head)
            if self.answer:
                conn.sendall(self.answer)
                conn.close()
            else:
                self.held = conn  # never answered


def test_an_oversize_declaration_answered_at_once_is_a_413_with_nothing_on_disk(tmp_path):
    toy = ToyServer(tmp_path, b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n")

    found = limits.declared_only(toy, "web-0", 10**20 - 1)

    assert found["status"] == 413 and found["ms"] is not None and found["disk_bytes"] == 0
    assert b"Content-Length: 99999999999999999999\r\n" in toy.requests[0]
    assert b"POST /hooks/github/web-0/ HTTP/1.1" in toy.requests[0]
    row = limits._row("oversize", "limits.declared", {"production": found, "reference": found})
    assert row["met"] == "yes"


def test_an_oversize_declaration_never_answered_has_no_status_and_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "WAIT", 0.3)
    toy = ToyServer(tmp_path, None)
    (tmp_path / "spooled").write_bytes(b"x" * 1000)  # what the server wrote meanwhile

    found = limits.declared_only(toy, "web-0", 50 * 1024 * 1024)

    assert (found["status"], found["ms"], found["disk_bytes"]) == (None, None, 1000)
    row = limits._row("oversize", "limits.declared", {"production": found, "reference": found})
    assert row["met"] == "no"
    assert limits.shown(found) == "no answer in 0.3 s, 0.0 MiB on disk at most"


def test_what_a_server_holds_open_under_its_temporary_directory_counts_once_deleted(tmp_path):
    toy = ToyServer(tmp_path, None)
    with open(tmp_path / "body", "wb") as spooled:
        spooled.write(b"y" * 4096)
        spooled.flush()
        (tmp_path / "body").unlink()  # as a spooled temporary file is
        assert limits.disk_bytes(toy, toy.pids()) == 4096


# --- the live rows' statement counter (bench/counting.py) ----------------------------------------


@pytest.mark.django_db
def test_every_statement_of_a_connection_with_the_counter_is_counted_in_its_process_file(
    tmp_path,
):
    import os

    from django.db import connection

    from bench import counting

    counter = counting.Counter(tmp_path)
    with connection.execute_wrapper(counter):
        with connection.cursor() as cursor:
            for _ in range(3):
                cursor.execute("SELECT 1")
        list(json.loads(json.dumps([1])))  # no statement
    assert counting.total(tmp_path) == 3
    assert [path.name for path in tmp_path.iterdir()] == [str(os.getpid())]
    counter.add(2)
    assert counting.total(tmp_path) == 5


# --- the answer rows' waiting approvals (bench/waiting.py) ---------------------------------------


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_copied_approvals_wait_with_their_expiry_timers_and_the_product_answers_them(
    make_inbox, owner
):
    from django.db import IntegrityError

    from approvals.models import Approval, expiry_timer_key
    from approvals.services import answer_approval
    from bench.waiting import Waiting
    from inbox.models import Event
    from timers.models import Timer

    slugs = [make_inbox(owner=owner).slug for _ in range(3)]
    waiting = Waiting(slugs)
    assert set(waiting.tables) == {"approvals_approval", "timers_timer"}

    requests = [(slugs[n % 3], f"run1-1-{n}") for n in range(6)]
    assert waiting.make(requests) == 6

    for slug, request_id in requests:
        waiting.check_copy(slug, request_id)
        approval = Approval.objects.get(inbox__slug=slug, request_id=request_id)
        assert approval.answer == "" and approval.answered_at is None
        template_key = expiry_timer_key(waiting.templates[slug])
        template = Timer.objects.get(inbox__slug=slug, key=template_key)
        timer = Timer.objects.get(inbox__slug=slug, key=expiry_timer_key(request_id))
        assert (timer.due, timer.event_source) == (template.due, template.event_source)
        assert timer.event_id == request_id
    assert answer_approval(slugs[0], "run1-1-0", "yes", by=owner).stands == "yes"
    assert Event.objects.filter(inbox__slug=slugs[0], source_id="run1-1-0").exists()
    with pytest.raises(IntegrityError):
        waiting.make([(slugs[1], "run1-1-1")])  # already there: refused, not made twice


def test_an_answer_run_that_ran_out_of_approvals_is_run_again_with_more(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from bench import web

    made, runs = [], []

    class Waiting:
        def make(self, requests):
            made.append(len(requests))

        def check_copy(self, slug, request_id):
            pass

    def run(base, script, connections, seconds, args):
        runs.append(args[-2])
        exhausted = 50 if len(runs) == 1 else 0
        statuses = {302: 2000} | ({404: exhausted} if exhausted else {})
        return load.Result(2000 + exhausted, seconds, 1, 2, 3, 4, statuses, {}, exhausted)

    monkeypatch.setattr(load, "run", run)
    session = SimpleNamespace(cookie=lambda: "sessionid=x", token="t")
    server = SimpleNamespace(
        base="http://127.0.0.1:1", name="production", log="-", cpu_seconds=lambda: 0.0
    )
    rows = web.Rows(
        {"slugs": ["web-0"], "waiting": Waiting()}, server, server, session, "marked", tmp_path
    )
    result = rows.answer("production")(1, 4)

    assert len(runs) == 2 and runs[0] != runs[1]  # each run answers approvals of its own
    assert made[1] > made[0]
    assert result.exhausted == 0 and result.statuses == {302: 2000}


def test_a_warm_up_that_ended_before_a_cold_servers_first_answer_does_not_stop_the_bench(
    tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from bench import web

    def run(base, script, connections, seconds, args):
        return load.Result(0, seconds, 0, 0, 0, 0, {}, {}, 0)

    monkeypatch.setattr(load, "run", run)
    session = SimpleNamespace(cookie=lambda: "sessionid=x", token="t")
    server = SimpleNamespace(
        base="http://127.0.0.1:1", name="production", log="-", cpu_seconds=lambda: 0.0
    )
    rows = web.Rows({"slugs": ["web-0"], "waiting": None}, server, server, session, "m", tmp_path)

    rows.warming = True
    assert rows.webhook("production")(1, 4).requests == 0
    rows.warming = False
    with pytest.raises(RuntimeError, match="no requests"):
        rows.webhook("production")(1, 4)
