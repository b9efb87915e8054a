"""A loopback OTLP/HTTP receiver: spans go through the real exporter and protobuf."""

import http.server
import threading

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inbox import tracing


class _Receiver(http.server.BaseHTTPRequestHandler):
    spans: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    _Receiver.spans = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    tracing.configure(exporter=OTLPSpanExporter(endpoint=endpoint), force=True)
    yield _Receiver.spans
    tracing.shutdown()
    server.shutdown()
    server.server_close()
