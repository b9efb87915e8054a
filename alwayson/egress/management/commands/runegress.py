import ipaddress
import logging
import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from alwayson.egress.gateway import gateway_server
from inbox.exceptions import UnknownInbox
from inbox.models import Inbox

log = logging.getLogger("alwayson.egress")


class Command(BaseCommand):
    help = (
        "Serve the egress gateway on 127.0.0.1 for agents that run out of process: "
        "http://127.0.0.1:PORT/<service>/<path>, the credential added here."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=None, help="default ALWAYSON_EGRESS_PORT")
        parser.add_argument(
            "--addr", default="127.0.0.1", help="a loopback address (the gateway is local only)"
        )
        parser.add_argument(
            "--inbox", default=None, help="serve one inbox's agent: its per-inbox services apply"
        )

    def handle(self, *args, port, addr, inbox, verbosity, **options):
        port = port if port is not None else settings.ALWAYSON_EGRESS_PORT
        if not 0 < port < 65536:
            raise CommandError(f"--port must be 1-65535 (or set ALWAYSON_EGRESS_PORT), not {port}")
        try:
            loopback = ipaddress.ip_address(addr).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            # Whoever reaches the gateway spends its credentials: never beyond this host.
            raise CommandError(f"--addr must be a loopback address, not {addr!r}")
        if inbox is not None:
            try:
                inbox = Inbox.objects.resolve(inbox)
            except UnknownInbox as exc:
                raise CommandError(str(exc)) from None
        logging.getLogger("alwayson").setLevel(logging.INFO if verbosity else logging.WARNING)
        try:
            server = gateway_server(port, inbox, addr)
        except OSError as exc:
            raise CommandError(f"cannot listen on {addr}:{port}: {exc}") from None
        stop = threading.Event()

        def handle_signal(signum, frame):
            stop.set()  # requests in flight finish; shutdown() waits for none of them

        signal.signal(signal.SIGTERM, handle_signal)
        signal.signal(signal.SIGINT, handle_signal)
        thread = threading.Thread(target=server.serve_forever, name="egress", daemon=True)
        thread.start()
        self.stdout.write(f"egress gateway on http://{addr}:{port}/<service>/<path>")
        while not stop.wait(0.2):
            pass
        server.shutdown()
        server.server_close()
