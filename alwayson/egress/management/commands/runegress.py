import ipaddress
import logging
import signal
import threading
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError

from alwayson.command import AlwaysonCommand
from alwayson.egress.exceptions import EgressFailed
from alwayson.egress.gateway import Egress
from alwayson.egress.sealing import hide_from_same_user
from alwayson.egress.server import MODEL_SERVICE, model_service, socket_gateway, tcp_gateway
from inbox.exceptions import UnknownInbox
from inbox.models import Inbox

log = logging.getLogger("alwayson.egress")


class Command(AlwaysonCommand):
    help = (
        "Serve the egress gateway, the process that holds the credentials: on the Unix socket "
        "ALWAYSON_EGRESS_SOCKET for sealed workers, and on 127.0.0.1:PORT for agents that run "
        "out of process (with ALWAYSON_EGRESS_TOKEN)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--socket", default=None, help="Unix socket path; default ALWAYSON_EGRESS_SOCKET"
        )
        parser.add_argument("--port", type=int, default=None, help="default ALWAYSON_EGRESS_PORT")
        parser.add_argument(
            "--addr", default="127.0.0.1", help="a loopback address (the gateway is local only)"
        )
        parser.add_argument(
            "--inbox", default=None, help="the port serves one inbox's agent: its services apply"
        )

    def handle(self, *args, socket, port, addr, inbox, verbosity, **options):
        socket = settings.ALWAYSON_EGRESS_SOCKET if socket is None else socket
        port_asked = port is not None
        port = settings.ALWAYSON_EGRESS_PORT if port is None else port
        if (port_asked or port or not socket) and not 0 < port < 65536:
            raise CommandError(
                f"--port must be 1-65535 (or set ALWAYSON_EGRESS_PORT), not {port}; or "
                "serve sealed workers on ALWAYSON_EGRESS_SOCKET"
            )
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
        if port and not settings.ALWAYSON_EGRESS_TOKEN:
            raise CommandError(
                "ALWAYSON_EGRESS_TOKEN must be set to serve the gateway on a port: its clients "
                "bring it, so no other local process or web page can spend the credentials"
            )
        logging.getLogger("alwayson").setLevel(logging.INFO if verbosity else logging.WARNING)
        # This process holds every credential: no process of the same user may read them.
        hide_from_same_user()
        self.check_model_key()
        servers = []
        try:
            if socket:
                servers.append((socket_gateway(socket), f"unix:{socket}"))
            if port:
                server = tcp_gateway(port, settings.ALWAYSON_EGRESS_TOKEN, inbox, addr)
                servers.append((server, f"http://{addr}:{port}"))
        except OSError as exc:
            for server, _ in servers:
                server.server_close()
            raise CommandError(f"cannot listen: {exc}") from None
        stop = threading.Event()

        def handle_signal(signum, frame):
            stop.set()  # requests in flight finish; shutdown() waits for none of them

        signal.signal(signal.SIGTERM, handle_signal)
        signal.signal(signal.SIGINT, handle_signal)
        for server, where in servers:
            threading.Thread(target=server.serve_forever, name="egress", daemon=True).start()
            log.info("egress gateway on %s/<service>/<path>", where)
        while not stop.wait(0.2):
            pass
        for server, _ in servers:
            server.shutdown()
            server.server_close()
        if socket:
            Path(socket).unlink(missing_ok=True)

    def check_model_key(self):
        """A Messages API key the API refuses stops the gateway here, once, with its reason,
        as it stops an unsealed worker: a sealed worker has no key to check."""
        service = model_service()
        if not service:
            return
        try:
            answer = Egress(None, service).get(MODEL_SERVICE, "/v1/models", params={"limit": 1})
        except EgressFailed as exc:
            log.warning("could not reach the Messages API to check the key (%s)", exc)
            return
        if answer.status in (401, 403):
            raise CommandError(
                f"ANTHROPIC_API_KEY was refused by {service[MODEL_SERVICE].base_url} "
                f"({answer.status}). Check the key."
            )
