"""A userspace TCP proxy on 127.0.0.1, between a client under test and a server (PostgreSQL).

It forwards both ways until told to blackhole: then it stops forwarding and keeps every
socket open, new connections accepted too. To the client that is a network that went silent
or a server that stopped answering: its kernel still gets every segment acknowledged (by the
proxy's), so neither TCP keepalives nor tcp_user_timeout notice anything, and only a deadline
of the client's own ends the wait. `heal()` forwards again, what was held first, in order.
"""

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, host, port):
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._stopped = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.accepted = 0

    def start(self):
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()
        return self

    def blackhole(self):
        """Forward nothing more, either way; every socket stays open."""
        self._forwarding.clear()

    def heal(self):
        self._forwarding.set()

    def stop(self):
        self._stopped = True
        self._forwarding.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
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
            with self._lock:
                self._sockets += [client, server]
                self.accepted += 1
            for source, sink in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(source, sink), name="tcp-proxy-pump", daemon=True
                ).start()

    def _pump(self, source, sink):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                # Blackholed: the chunk is held (and what follows stays in the kernel's
                # buffer, acknowledged) until heal() or stop().
                self._forwarding.wait()
                if self._stopped:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
