"""An MCP server reached through the egress gateway: the SDK's HTTP requests as calls of the
run's `run.http`. Imported with the SDK, where a server is reached (alwayson/claude/mcp.py)."""

import httpx2

from alwayson.egress.gateway import RESERVED_HEADERS

# Headers neither sent to the gateway (it sets its own) nor taken back from it (its body is
# decoded already).
DROPPED_HEADERS = frozenset({"accept-encoding", "content-encoding", "content-length"})


class EgressTransport(httpx2.AsyncBaseTransport):
    """The MCP connection's HTTP requests as calls of the run's egress gateway, to the service
    the server's configuration names: the gateway checks the allowlist and the lease, adds the
    credential this process never holds, and scrubs it from what comes back."""

    def __init__(self, bridge, run, service: str):
        self.bridge, self.run, self.service = bridge, run, service

    async def handle_async_request(self, request):
        body = await request.aread()
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in RESERVED_HEADERS and name.lower() not in DROPPED_HEADERS
        }
        path = request.url.raw_path.decode("ascii")

        def send():
            return self.run.http.request(
                self.service, request.method, path, content=body, headers=headers
            )

        answer = await self.bridge.call(send)
        shown = {k: v for k, v in answer.headers.items() if k.lower() not in DROPPED_HEADERS}
        return httpx2.Response(answer.status, headers=shown, content=answer.content)
