"""The chaos run's network to PostgreSQL: one userspace TCP proxy (tests/support/tcp_proxy.py)
per process of the fleet, so a network fault hits one process as a cut cable would, and one
for the run's own connection, which no fault touches. Every connection of the run goes
through them, so a failover is one `retarget` away from every process."""

from urllib.parse import urlsplit, urlunsplit

from tests.support.tcp_proxy import TcpProxy

RUN = "run"  # the chaos run's own connection (set-up, the stall search, the final dump)


class Proxies:
    def __init__(self, port: int, names):
        self.by_name = {name: TcpProxy("127.0.0.1", port) for name in [RUN, *names]}

    def start(self):
        for proxy in self.by_name.values():
            proxy.start()

    def __getitem__(self, name) -> TcpProxy:
        return self.by_name[name]

    def url(self, name: str, direct_url: str) -> str:
        """`direct_url` (the cluster's), through `name`'s proxy."""
        parts = urlsplit(direct_url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.by_name[name].port}"
        netloc = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        return urlunsplit(parts._replace(netloc=netloc))

    def retarget(self, port: int):
        """Every new connection to the server on `port` (open ones end with the old one)."""
        for proxy in self.by_name.values():
            proxy.retarget("127.0.0.1", port)

    def stop(self):
        for proxy in self.by_name.values():
            proxy.stop()
