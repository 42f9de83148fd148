"""A real MCP server (the SDK's low-level ``Server``) for the cancellation attacks: stdio by
default; with ``http``, Streamable HTTP (uvicorn) on 127.0.0.1 on a free port, its endpoint URL
printed as the first line on stdout.

Tools: ``echo`` returns ``text`` as one text block; ``stall`` sleeps ``seconds`` with
``time.sleep``, which holds the server's whole event loop: it stops reading its stdin (its pipe
fills under the host's writes) or its HTTP connections, then answers "stalled" — after the host
has given up on the call and cancelled it.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

TOOLS = [types.Tool(name=name, description=f"The {name} tool.", input_schema={"type": "object"})
         for name in ("echo", "stall")]


def text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=value)])


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "stall":
        time.sleep(float(args.get("seconds", 5)))  # the loop is held: nothing is read meanwhile
        return text("stalled")
    return text(str(args.get("text", "")))


server = Server("stall", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def main_http() -> None:
    import uvicorn

    sock = socket.create_server(("127.0.0.1", 0))
    http = uvicorn.Server(uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(http.serve(sockets=[sock]))
    while not http.started:
        if serving.done():
            serving.result()
        await asyncio.sleep(0.01)
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    await serving


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        asyncio.run(main_http())
    else:
        anyio.run(main)
