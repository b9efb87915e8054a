"""The production web process's gunicorn worker (alwayson/gunicorn_conf.py names it): plain WSGI
for requests, one event loop for the live pages' streams, and bodies bounded before they are read.
Why each, and how: docs/explanation/live-pages.md#the-server.

Requests run on gunicorn's gthread threads, one at a time, in arrival order, as in a sync
worker (Turns): one that runs long (a lock wait, a slow client) lets the next start beside it
after TURN. A live page's stream, an async generator that never ends by itself, is taken from
gunicorn and handed to the process's event loop, as is every connection the worker closes
(closed gracefully there, never on gunicorn's main thread). A body larger than any view accepts
(ALWAYSON_REQUEST_MAX_BYTES) is refused 413 unread; a chunked one is read up to that limit and
handed to Django with its length, since Django reads none of a body whose length is not
declared.

Kept-alive connections are spread over the workers as they are accepted (Shares): a client
that keeps a few connections open would otherwise have them all on whichever worker woke
first, one core serving everything while the other idles. A kept-alive connection whose next
request comes at once is served by the thread that answered the last, while no other
connection waits in line: gunicorn's round trip through its poller for each request cost a
fifth of the webhook's rate.
"""

import asyncio
import collections
import concurrent.futures
import io
import logging
import mmap
import os
import select
import socket
import struct
import threading
import time

from gunicorn.workers.gthread import ThreadWorker

log = logging.getLogger(__name__)

# What the client sends on a stream's connection after its request is read and dropped, this
# much at a time: only its end (or an error) matters, which says the client has left.
READ_SIZE = 4096
# On a stop: how long the streams get to close (their browsers reconnect to a running process),
# then how long what they leave behind (the live pages' hub) gets to clean up.
CLOSE_STREAMS = 2.0
CLEAN_UP = 5.0
# A connection the worker closes: how long, and how much of what the client still sends, the
# loop reads before it closes (gunicorn's close_graceful's figures), so the client's last
# bytes do not turn the close into a reset that loses the response.
LINGER = 2.0
LINGER_BYTES = 64 * 1024
# Framing of the connection, which the server decides: Django's values are dropped.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "content-length", "transfer-encoding"})
HTTP_1 = frozenset({"HTTP/1.0", "HTTP/1.1"})
# While a worker leaves a new connection to another (Worker.accept_hold at most), it looks
# again this often.
HOLD_POLL = 0.002
# After answering on a kept-alive connection, how long its thread waits for that client's next
# request before handing the connection back to gunicorn's poller, when no other connection
# waits in line (Worker.next_request_here).
NEXT_REQUEST_WAIT = 0.002
# How long a request serves alone before another of its worker's threads may start on the next
# connection in line (Turns): many times a webhook's or a form post's few milliseconds under
# load, so the line rarely overlaps; short enough that a request waiting on a lock or a slow
# client delays the others by little.
TURN = 0.05


class Shares:
    """Each worker's open connections, in memory the master maps before it forks, so that
    every worker reads the others'. A slot per worker, by its age (gunicorn numbers each
    worker it starts): (pid, open connections), 64-bit each; a slot whose pid is gone is
    skipped, so a worker killed without clearing its slot holds no one back."""

    SLOTS = 64
    ENTRY = struct.Struct("qq")

    def __init__(self):
        self.memory = mmap.mmap(-1, self.SLOTS * self.ENTRY.size)

    def publish(self, age: int, connections: int):
        self.ENTRY.pack_into(self.memory, self.offset(age), os.getpid(), connections)

    def clear(self, age: int):
        self.ENTRY.pack_into(self.memory, self.offset(age), 0, 0)

    def fewer_elsewhere(self, age: int, connections: int) -> bool:
        """Whether a live worker other than `age`'s holds fewer connections."""
        mine = self.offset(age)
        for offset in range(0, len(self.memory), self.ENTRY.size):
            pid, theirs = self.ENTRY.unpack_from(self.memory, offset)
            if offset != mine and pid and theirs < connections and _alive(pid):
                return True
        return False

    def offset(self, age: int) -> int:
        return (age % self.SLOTS) * self.ENTRY.size


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Turns:
    """The worker's request threads (gunicorn's pool: submit and shutdown), serving the
    connections in line one at a time, as a sync worker does: a thread that answers a request
    takes the next connection in line itself, and another starts on it only when none is
    serving, or when each one serving has been at it for `turn` seconds (waiting for an inbox's
    lock, a slow client, a slow page), so a slow request never holds the worker. Threads that
    serve at once share the GIL and the cores: each of their requests then takes as long as
    all of them, and the tail under load widens; a hand-off to a sleeping thread waits for
    the kernel to run it, which on a busy host costs more than the request."""

    def __init__(self, threads: int, turn: float):
        self.size = threads
        self.turn = turn
        self.changed = threading.Condition(threading.Lock())
        self.line = collections.deque()  # (future, function, arguments)
        self.started = {}  # serving thread -> when its turn began
        self.threads = 0
        self.idle = 0  # threads waiting for the line
        self.watching = 0  # of them, waiting for a turn to run out
        self.coming = 0  # threads started or woken since a thread last looked at the line
        self.stopping = False

    def submit(self, function, *args) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        with self.changed:
            if self.stopping:
                raise RuntimeError("the worker's threads have stopped")
            self.line.append((future, function, args))
            if not self.started or not self.watching:
                self._call()
        return future

    def shutdown(self, wait=True, cancel_futures=False):
        """Idle threads end now, serving ones once their request is answered; the process
        waits for them as it exits (gunicorn asks without waiting, as of a ThreadPoolExecutor
        whose threads are joined at exit)."""
        with self.changed:
            self.stopping = True
            self.changed.notify_all()

    def waiting(self) -> bool:
        """Whether a connection waits in line, or one that came would: no thread is idle and
        the pool has no room for another."""
        return bool(self.line) or (not self.idle and self.threads >= self.size)

    def step_aside(self):
        """From a serving thread about to wait for its client: its turn is over."""
        with self.changed:
            self.started.pop(threading.get_ident(), None)
            if self.line:
                self._call()

    def step_in(self) -> bool:
        """From a thread that stepped aside: a new turn, unless another is serving one."""
        with self.changed:
            now = time.monotonic()
            if self._turn_left(now) > 0:
                return False
            self.started[threading.get_ident()] = now
            return True

    def _serve(self):
        me = threading.get_ident()
        with self.changed:
            while (work := self._next()) is not None:
                self.started[me] = time.monotonic()
                self.changed.release()
                try:
                    future, function, args = work
                    if future.set_running_or_notify_cancel():
                        try:
                            future.set_result(function(*args))
                        except BaseException as error:
                            future.set_exception(error)
                finally:
                    self.changed.acquire()
                    self.started.pop(me, None)
            self.threads -= 1

    def _call(self):
        """One more thread to look at the line (to serve, or to watch the turn): an idle one,
        else a new one if the pool has room; none while another is on its way."""
        if self.coming:
            return
        if self.idle:
            self.changed.notify()
        elif self.threads < self.size:
            self.threads += 1
            threading.Thread(target=self._serve, name="alwayson-request").start()
        else:
            return
        self.coming += 1

    def _turn_left(self, now) -> float:
        """Seconds until no serving thread is within its turn (0 or less: none is)."""
        if not self.started:
            # Exactly none: (now - turn) + turn - now rounds to a hair above 0 for some
            # clocks, and a thread would then wait for a turn nobody holds.
            return 0.0
        return max(self.started.values()) + self.turn - now

    def _next(self):
        """The next connection in line once this thread may take it (None: stopping)."""
        while not self.stopping:
            # Whoever looks serves or watches, as a thread called for would. Not counted by
            # wait()'s answer: a wait that times out as it is notified says it timed out.
            self.coming = 0
            wait = None
            if self.line:
                wait = self._turn_left(time.monotonic())
                if wait <= 0:
                    work = self.line.popleft()
                    if self.line and not self.watching:
                        self._call()
                    return work
            self.idle += 1
            self.watching += wait is not None
            try:
                self.changed.wait(wait)
            finally:
                self.idle -= 1
                self.watching -= wait is not None
        return None


class Worker(ThreadWorker):
    """gunicorn's gthread worker, which hands streams and the connections it closes to its
    event loop (Streams), spreads connections over the workers (Shares), and refuses oversize
    bodies before the application runs."""

    # Made at import, in gunicorn's master, which imports the worker class before it forks.
    shares = Shares()
    # How long, in seconds, a worker holding more connections than another leaves a new one
    # to the other, at most: long enough for the other's main thread to wake and accept (it
    # competes for its process's GIL with its request threads: 5 ms switch interval), short
    # enough that a worker whose loop is stuck delays a connection little.
    # ALWAYSON_WEB_ACCEPT_HOLD_MS (20): alwayson/gunicorn_conf.py's post_fork sets it.
    accept_hold: float

    def init_process(self):
        # Before gunicorn's init_process, which loads the application and then runs the worker's
        # loop until it stops.
        self.streams = Streams()
        self.handed = threading.local()  # whether this thread's connection went to a stream
        self.holding_since = None  # when it began to leave new connections to others
        try:
            super().init_process()
        finally:
            self.shares.clear(self.age)

    def load_wsgi(self):
        super().load_wsgi()
        # Here and not at the top: gunicorn's master imports this module to find the worker
        # class, before Django is set up; the application loaded just above has set it up.
        from django.conf import settings

        from alwayson.web import live

        self.max_body = settings.ALWAYSON_REQUEST_MAX_BYTES
        self.live = live
        self.wsgi = self.handing_off_streams(self.wsgi)

    def run(self):
        try:
            super().run()
        finally:
            # gunicorn's loop has ended (SIGTERM once its requests are answered; SIGQUIT or
            # SIGINT at once). Handed-off streams are not among the connections it waits
            # for, so they never hold the stop for graceful_timeout; they close here.
            self.streams.stop()

    # --- spreading connections ------------------------------------------------------------

    def accept(self, listener):
        """A new connection is left to a worker that holds fewer: this one stops listening
        (holds) until it no longer holds more than any other, or for accept_hold at most."""
        if self.holding_since is None and self.shares.fewer_elsewhere(self.age, self.nr_conns):
            self.holding_since = time.monotonic()
            super().set_accept_enabled(False)
            return
        super().accept(listener)
        self.shares.publish(self.age, self.nr_conns)

    def set_accept_enabled(self, enabled):
        # gunicorn's loop enables accepting again after every event: not while holding.
        super().set_accept_enabled(enabled and self.holding_since is None)

    def wait_for_and_dispatch_events(self, timeout):
        if self.holding_since is not None:
            if time.monotonic() - self.holding_since >= self.accept_hold:
                # No other worker took it in time: what still waits is taken here (nothing,
                # if one did: the accept finds none).
                self.end_hold()
                for listener in self.sockets:
                    super().accept(listener)
            elif not self.shares.fewer_elsewhere(self.age, self.nr_conns):
                self.end_hold()
            else:
                timeout = min(timeout, HOLD_POLL)
        # The count as of the last event (connections end in several places of gunicorn's
        # loop); a stopping worker accepts nothing more, so none leaves it a connection.
        if self.alive:
            self.shares.publish(self.age, self.nr_conns)
        else:
            self.shares.clear(self.age)
        super().wait_for_and_dispatch_events(timeout)

    def end_hold(self):
        self.holding_since = None
        self.set_accept_enabled(self.alive and self.nr_conns < self.worker_connections)

    def get_thread_pool(self):
        return Turns(self.cfg.threads, TURN)

    def handle(self, conn):
        """The connection's requests while they come at once (next_request_here), then back
        to gunicorn. One it will not keep is closed by the loop: on gunicorn's main thread
        close_graceful() waits up to 2 s for the client, stalling the whole worker."""
        self.handed.off = False
        keep = super().handle(conn)
        while keep is True and self.next_request_here(conn):
            keep = super().handle(conn)
        if keep is False and not self.handed.off and not self.cfg.is_ssl:
            try:
                own = _take(conn.sock)
            except OSError:  # gunicorn closed it already, or no descriptor is left
                return keep
            self.streams.linger(own)
        return keep

    def next_request_here(self, conn) -> bool:
        """Whether this thread serves the connection's next request itself, as a sync worker
        would: when it is already read, or arrives within NEXT_REQUEST_WAIT while no other
        connection waits in line and another thread could take one that comes meanwhile, and
        no other thread serves when it arrives (else it goes back in line behind that one).
        Back on gunicorn's poller, each request costs two hand-offs between threads (the
        poller's, then the pool's) and two changes to the poller."""
        if not self.alive:
            return False
        if conn.parser.unreader.buf.getvalue():  # read ahead with the last body
            return True
        if self.tpool.waiting():
            return False
        poll = select.poll()  # not select(): any descriptor number
        self.tpool.step_aside()
        try:
            poll.register(conn.sock, select.POLLIN)
            came = bool(poll.poll(NEXT_REQUEST_WAIT * 1000))
        except (OSError, ValueError):  # closed meanwhile
            return False
        return came and self.tpool.step_in()

    # --- streams -------------------------------------------------------------------------

    def handing_off_streams(self, application):
        # Under TLS terminated by gunicorn itself the connection is an SSL socket whose state
        # cannot move to another socket: pages are then polled, as under any WSGI server.
        push = not self.cfg.is_ssl

        def serve(environ, start_response):
            if not push or environ.get("SERVER_PROTOCOL") not in HTTP_1:
                return application(environ, start_response)
            environ[self.live.PUSH] = True
            started = []

            def start(status, headers, exc_info=None):
                started[:] = [status, headers]
                return start_response(status, headers, exc_info)

            response = application(environ, start)
            if not (getattr(response, "streaming", False) and getattr(response, "is_async", False)):
                return response
            self.hand_off(environ["gunicorn.socket"], *started, response)
            return []

        return serve

    def hand_off(self, client, status, headers, response):
        """Take the connection from gunicorn and give it, with the response, to the loop."""
        own = _take(client)
        self.handed.off = True
        try:
            # request_finished, in the thread where request_started was sent (the thread's
            # database connection is kept or closed there, as after any request).
            response.close()
        finally:
            if not self.streams.serve(own, _head(status, headers), response):
                own.close()

    # --- bodies ---------------------------------------------------------------------------

    def handle_request(self, req, conn):
        refusal = self.body_refusal(req, conn.sock)
        if refusal is not None:
            status, reason = refusal
            self.log.info("%s %s refused: %s %s", req.method, req.path, status, reason)
            conn.sock.sendall(_plain(status, reason))
            return False  # closed, the body unread
        return super().handle_request(req, conn)

    def body_refusal(self, req, sock):
        """(status, reason) when the request's body must not reach the application; None
        when it may (a chunked one then read, within the limit, into memory)."""
        lengths = [value for name, value in req.headers if name == "CONTENT-LENGTH"]
        if lengths:
            # gunicorn's parser refuses a repeated, negative or non-numeric length itself (400);
            # checked again here so that no such value reaches Django.
            try:
                declared = int(lengths[0])
            except ValueError:
                declared = -1
            if len(lengths) > 1 or declared < 0:
                return "400 Bad Request", "the Content-Length is not a length"
            if declared > self.max_body:
                return "413 Content Too Large", f"the body is larger than {self.max_body} bytes"
            return None
        if any(name == "TRANSFER-ENCODING" for name, _ in req.headers):
            return self.read_chunked(req, sock)
        return None

    def read_chunked(self, req, sock):
        """A chunked body (gunicorn's parser accepts no other transfer coding), read here up
        to the limit, then given to Django with its length: Django reads a body only up to
        its declared length, so it would see none of it."""
        if req._expected_100_continue:
            # The client sends the body once told to; gunicorn would tell it only when it
            # builds the environ, after this read.
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            req._expected_100_continue = False
        body = req.body.read(self.max_body + 1)
        if len(body) > self.max_body:
            return "413 Content Too Large", f"the body is larger than {self.max_body} bytes"
        req.body = io.BytesIO(body)
        req.headers = [(name, value) for name, value in req.headers if name != "TRANSFER-ENCODING"]
        req.headers.append(("CONTENT-LENGTH", str(len(body))))
        return None


class Streams:
    """One asyncio event loop, on a thread of its own, serving the streams handed to it and
    closing the connections the worker will not keep: a task each, which ends when the client
    leaves, the stream's generator ends, the close is done, or the worker stops."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.tasks: set[asyncio.Task] = set()
        self.taking = True
        self.thread = threading.Thread(target=self._run, name="alwayson-streams", daemon=True)
        self.thread.start()

    def _run(self):
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def serve(self, client, head, response) -> bool:
        """From a request's thread: serve `response` on `client` (a socket of the caller's,
        which the loop owns from now on). False if the loop has stopped: the caller closes it."""
        return self._submit(client, self._serve(client, head, response))

    def linger(self, client):
        """From a request's thread: close `client` (the loop's from now on) gracefully."""
        if not self._submit(client, _linger(client)):
            client.close()

    def _submit(self, client, work) -> bool:
        try:
            self.loop.call_soon_threadsafe(self._start, client, work)
        except RuntimeError:  # the loop is closed
            work.close()  # a coroutine never started
            return False
        return True

    def _start(self, client, work):
        if not self.taking:
            work.close()
            client.close()
            return
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self, client, head, response):
        loop = asyncio.get_running_loop()
        content = None
        try:
            content = response.streaming_content
            client.setblocking(False)
            sending = loop.create_task(_send(client, head, content))
            leaving = loop.create_task(_until_gone(client))
            try:
                await asyncio.wait((sending, leaving), return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Cancelled while the generator awaits its next change, it runs its own
                # `finally` (the page leaves the hub) as the cancellation passes through it.
                sending.cancel()
                leaving.cancel()
                sent, _ = await asyncio.gather(sending, leaving, return_exceptions=True)
                if isinstance(sent, Exception) and not isinstance(sent, OSError):
                    log.error("a live stream failed", exc_info=sent)
        finally:
            try:
                await _close_generators(content, response)
            finally:
                client.close()

    def stop(self):
        """From the worker's main thread, once gunicorn's loop has ended: every stream closed,
        the hub's cleanup run, the loop stopped; within a few seconds whatever they do."""
        if not self.thread.is_alive():
            return
        closing = asyncio.run_coroutine_threadsafe(self._close(), self.loop)
        try:
            closing.result(CLOSE_STREAMS + CLEAN_UP + 1)
        except (TimeoutError, concurrent.futures.TimeoutError):
            log.warning("the live streams' loop did not stop in time; leaving it")
        except Exception:
            log.exception("stopping the live streams' loop")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(1)

    async def _close(self):
        self.taking = False
        open_streams = set(self.tasks)
        for task in open_streams:
            task.cancel()
        if open_streams:
            await asyncio.wait(open_streams, timeout=CLOSE_STREAMS)
        await asyncio.sleep(0)  # generators collected meanwhile are closed by the loop's hook
        # Imported here for the reason Worker.load_wsgi says; by now Django is set up.
        from alwayson.web import live

        try:
            await asyncio.wait_for(live.stop_hub(), CLEAN_UP)
        except TimeoutError:
            log.warning("the live pages' hub did not stop within %ss", CLEAN_UP)
        await self.loop.shutdown_asyncgens()
        await self.loop.shutdown_default_executor()


async def _linger(client):
    """RFC 9112's close, as gunicorn's close_graceful() makes it: the sending side shut, what
    the client still sends read and dropped until it closes its side or LINGER has passed."""
    loop = asyncio.get_running_loop()
    try:
        client.setblocking(False)
        client.shutdown(socket.SHUT_WR)
        drained = 0
        async with asyncio.timeout(LINGER):
            while drained < LINGER_BYTES and (data := await loop.sock_recv(client, READ_SIZE)):
                drained += len(data)
    except (OSError, TimeoutError):
        pass
    finally:
        client.close()


async def _send(client, head, content):
    """The head, then every chunk as the generator yields it, each sent whole before the next
    is asked for: a client that reads slowly slows its own stream, and nothing piles up."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(client, head)
    async for chunk in content:
        await loop.sock_sendall(client, chunk)


async def _until_gone(client):
    """Returns when the client has closed its side or the connection failed."""
    loop = asyncio.get_running_loop()
    try:
        while await loop.sock_recv(client, READ_SIZE):
            pass
    except OSError:
        pass


async def _close_generators(content, response):
    """Django's streaming_content wraps the view's generator in one of its own, and closing
    the wrapper leaves the wrapped one suspended until it is collected: both are closed here,
    so the view's `finally` runs now (a stream cancelled while sending, not while awaiting)."""
    for generator in (content, getattr(response, "_iterator", None)):
        aclose = getattr(generator, "aclose", None)
        if aclose is None:
            continue
        try:
            await aclose()
        except Exception:
            log.exception("closing a live stream's generator")


def _take(client) -> socket.socket:
    """The connection `client` names, as a socket of the caller's; `client` is left naming a
    socket whose peer is already closed. A dup alone would not do: gunicorn goes on writing
    to its socket and shuts it down (close_graceful), which acts on the connection itself."""
    own = client.dup()
    dead, peer = socket.socketpair()
    peer.close()
    try:
        os.dup2(dead.fileno(), client.fileno(), inheritable=False)
    except OSError:
        own.close()
        raise
    finally:
        dead.close()
    return own


def _head(status, headers) -> bytes:
    """The response's head as Django made it, for a body that ends when the connection does."""
    lines = [f"HTTP/1.1 {status}"]
    lines += [f"{name}: {value}" for name, value in headers if name.lower() not in HOP_BY_HOP]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _plain(status, reason) -> bytes:
    body = f"{reason}\n".encode()
    head = (
        f"HTTP/1.1 {status}\r\n"
        "Connection: close\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body
