"""A userspace TCP proxy on 127.0.0.1, between a client under test and a server (PostgreSQL).

It forwards both ways until told otherwise:
- `blackhole()`: it stops forwarding and keeps every socket open, new connections accepted
  too. To the client that is a network that went silent or a server that stopped answering:
  its kernel still gets every segment acknowledged (by the proxy's), so neither TCP
  keepalives nor tcp_user_timeout notice anything, and only a deadline of the client's own
  ends the wait. `heal()` forwards again, what was held first, in order.
- `delay(seconds)`: every chunk waits this long before it is passed on, either way (a round
  trip gains twice that); `delay(0)` ends it.
- `reset()`: every open connection is aborted with a TCP RST on both sides, as a middlebox
  that dropped its state would; the listener stays open for new ones.
- `retarget(host, port)`: new connections go to another server (a promoted standby);
  open ones are left as they are.
"""

import contextlib
import socket
import struct
import threading
import time


class TcpProxy:
    def __init__(self, host, port):
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._stopped = False
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self.latency = 0.0
        self.accepted = 0

    def start(self):
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()
        return self

    def blackhole(self):
        """Forward nothing more, either way; every socket stays open."""
        self._forwarding.clear()

    def heal(self):
        self._forwarding.set()

    def delay(self, seconds: float):
        self.latency = max(0.0, float(seconds))

    def retarget(self, host, port):
        self.target = (host, int(port))

    def reset(self) -> int:
        """RST every open connection, both sides; returns how many."""
        with self._lock:
            pairs, self._pairs = self._pairs, set()
        for pair in pairs:
            for sock in pair:
                # SO_LINGER on with a zero timeout: the close sends an RST, not a FIN.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            for sock in pair:
                # SHUT_RD sends nothing but wakes a pump blocked in recv() (which holds the
                # socket open until it returns); the close then aborts the connection.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RD)
                with contextlib.suppress(OSError):
                    sock.close()
        return len(pairs)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def stop(self):
        self._stopped = True
        self._forwarding.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, set()
        for pair in pairs:
            for sock in pair:
                # Shut down first: a close alone would leave a pump's recv() holding the socket.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _accept(self):
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            pair = (client, server)
            with self._lock:
                self._pairs.add(pair)
                self.accepted += 1
            for source, sink in (pair, pair[::-1]):
                threading.Thread(
                    target=self._pump,
                    args=(pair, source, sink),
                    name="tcp-proxy-pump",
                    daemon=True,
                ).start()

    def _pump(self, pair, source, sink):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if self.latency:
                    time.sleep(self.latency)
                # Blackholed: the chunk is held (and what follows stays in the kernel's
                # buffer, acknowledged) until heal() or stop().
                self._forwarding.wait()
                if self._stopped:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # The first pump to end closes the pair; a pair reset() or stop() took is theirs.
            with self._lock:
                mine = pair in self._pairs
                self._pairs.discard(pair)
            if mine:
                for sock in pair:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        sock.close()
