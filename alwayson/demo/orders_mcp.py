"""The demo's MCP server: one tool, order_status, over Streamable HTTP on 127.0.0.1 (the
official `mcp` SDK's MCPServer). docs/how-to/mcp-demo-inbox.md connects it to the demo inbox.

    .venv/bin/python -m alwayson.demo.orders_mcp        # http://127.0.0.1:9000/mcp
    .venv/bin/python -m alwayson.demo.orders_mcp 9100   # another port
"""

import sys

from mcp.server import MCPServer

ORDERS = {"881": "shipped on 2 December by parcel post, due Tuesday", "882": "being packed"}

server = MCPServer("orders")


@server.tool()
def order_status(order: str) -> str:
    """Where an order is: its shipping status, by order number."""
    # Printed so that the terminal shows each call as it arrives.
    print(f"order_status called for order {order}", flush=True)
    return ORDERS.get(order, f"No order {order}.")


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    server.run("streamable-http", host="127.0.0.1", port=port, stateless_http=True)
