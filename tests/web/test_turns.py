"""The production web worker's request threads (alwayson/web/serving.py's Turns): the
connections in line are served one at a time, in arrival order, by the thread that answered
the last one when it is free; another thread starts on the line only when none is serving or
when each one serving has run past its turn (or steps aside to wait for its client), so one
slow request never holds the worker. The worker itself, on a real server:
tests/processes/test_web_turns_pg.py and test_web_server.py."""

import random
import threading
import time

import pytest

from alwayson.web.serving import Turns

WAIT = 30  # seconds: a bound on a wait, never a measure
LONG = 3600  # a turn no request here outlasts


@pytest.fixture
def make_turns():
    made = []

    def make(threads=4, turn=LONG):
        made.append(Turns(threads, turn))
        return made[-1]

    yield make
    for turns in made:
        turns.shutdown()


class Served:
    """What ran: in which order, on which thread, and how many at once at most."""

    def __init__(self):
        self.lock = threading.Lock()
        self.order = []
        self.threads = []
        self.now = 0
        self.most = 0

    def job(self, name, until=None):
        def run():
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
                self.order.append(name)
                self.threads.append(threading.get_ident())
            try:
                if until is not None:
                    assert until.wait(WAIT)
                return name
            finally:
                with self.lock:
                    self.now -= 1

        return run


def test_connections_in_line_are_served_one_at_a_time_in_arrival_order_by_one_thread(make_turns):
    turns = make_turns()
    served = Served()
    release = threading.Event()
    first = turns.submit(served.job("first", until=release))
    rest = [turns.submit(served.job(n)) for n in range(20)]
    release.set()

    assert [future.result(WAIT) for future in rest] == list(range(20))
    assert first.result(WAIT) == "first"
    assert served.order == ["first", *range(20)]
    assert served.most == 1
    assert set(served.threads) == {served.threads[0]}  # no hand-off to another thread


def test_a_request_past_its_turn_lets_the_next_in_line_start_beside_it(make_turns):
    turns = make_turns(turn=0.05)
    served = Served()
    release = threading.Event()
    stuck = turns.submit(served.job("stuck", until=release))
    following = [turns.submit(served.job(n)) for n in range(3)]

    assert [future.result(WAIT) for future in following] == [0, 1, 2]
    assert not stuck.done()
    release.set()
    assert stuck.result(WAIT) == "stuck"
    assert served.most >= 2  # more only if a following one itself outran a turn


def test_no_more_threads_than_the_pool_s_serve_at_once(make_turns):
    turns = make_turns(threads=2, turn=0)
    release = threading.Event()
    started = [threading.Event() for _ in range(3)]

    def job(n):
        started[n].set()
        assert release.wait(WAIT)
        return n

    futures = [turns.submit(job, n) for n in range(3)]
    assert started[0].wait(WAIT) and started[1].wait(WAIT)

    assert not started[2].is_set() and not futures[2].running()
    assert turns.waiting()
    release.set()
    assert [future.result(WAIT) for future in futures] == [0, 1, 2]


def test_a_thread_that_steps_aside_to_wait_for_its_client_leaves_the_turn_to_the_next(
    make_turns,
):
    turns = make_turns()
    release = threading.Event()

    def waits_for_its_client():
        turns.step_aside()
        assert release.wait(WAIT)
        turns.step_in()
        return "kept alive"

    waiting = turns.submit(waits_for_its_client)
    following = turns.submit(lambda: "next")

    assert following.result(WAIT) == "next"
    assert not waiting.done()
    release.set()
    assert waiting.result(WAIT) == "kept alive"


@pytest.mark.parametrize("turn", [LONG, 0.05])
def test_a_thread_steps_in_at_once_whatever_the_clock_reads_while_none_serves(
    make_turns, monkeypatch, turn
):
    """No turn is held, so none is left, exactly: (now - turn) + turn - now is a hair above 0
    at some clock readings (0.007 s after boot with a turn of an hour), and the thread that
    waited for its client was then refused its next request."""
    turns = make_turns(turn=turn)
    for reading in (0.007, 0.014, 1415.462042212, 123456.789, 1e7 + 0.1):
        monkeypatch.setattr(time, "monotonic", lambda reading=reading: reading)
        assert turns._turn_left(reading) <= 0
        assert turns.step_in() is True
        turns.step_aside()


def test_no_connection_is_left_in_line_while_turns_run_out_as_threads_are_called(make_turns):
    """Turns so short that the threads watching them time out all the time, often just as
    another calls them: a call must not be lost then (one was, and the line waited with every
    thread idle)."""
    turns = make_turns(turn=0.0002)
    pick = random.Random(36)
    for _ in range(1000):
        futures = [
            turns.submit(time.sleep, pick.random() * 0.0004) for _ in range(pick.randint(1, 6))
        ]
        for future in futures:
            future.result(WAIT)


def test_a_request_s_error_reaches_its_future_and_the_thread_serves_on(make_turns):
    turns = make_turns()

    def fails():
        raise ValueError("the request failed")

    failed = turns.submit(fails)

    with pytest.raises(ValueError, match="the request failed"):
        failed.result(WAIT)
    assert turns.submit(lambda: "served").result(WAIT) == "served"


def test_a_stopped_pool_takes_nothing_more_and_its_threads_end(make_turns):
    turns = make_turns()
    assert turns.submit(lambda: "served").result(WAIT) == "served"
    threads = [t for t in threading.enumerate() if t.name == "alwayson-request"]

    turns.shutdown()

    with pytest.raises(RuntimeError):
        turns.submit(lambda: "late")
    for thread in threads:
        thread.join(WAIT)
    assert turns.threads == 0
