"""A real HTTP server on 127.0.0.1 for tests: records every request, answers by a rule.

`answer(request)` returns (status, headers, body) for a recorded request (a dict with method,
path, headers and body), or (status, headers, body, reason) to send a reason phrase of its own
in the status line; the default answers 200 with `{}`.
"""

import threading
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WAIT = 10


def ok(request):
    return 200, {"Content-Type": "application/json"}, b"{}"


class Loopback:
    def __init__(self, answer=ok):
        self.requests = []
        self.answer = answer
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                request = {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": self.rfile.read(length) if length else b"",
                }
                server.requests.append(request)
                status, headers, body, *reason = server.answer(request)
                with suppress(OSError):  # the client may have timed out and gone
                    self.send_response(status, *reason)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def url(self, path=""):
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(WAIT)
