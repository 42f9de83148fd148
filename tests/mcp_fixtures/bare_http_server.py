"""A bare Streamable HTTP MCP server written with the SDK alone (low-level ``Server``, uvicorn), for
the HTTP import bench and tests: nothing of amplifier-tools runs in it.

It listens on 127.0.0.1 on a free port, prints its endpoint URL as the first line on stdout, and
serves until it gets SIGTERM or SIGINT. Tools: ``add`` (``a + b`` as text) and ``big`` (one text
block of ``bytes`` characters).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server

TOOLS = [
    types.Tool(name="add", description="Add two integers.",
               input_schema={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                             "required": ["a", "b"]}),
    types.Tool(name="big", description="One large text block.",
               input_schema={"type": "object", "properties": {"bytes": {"type": "integer"}}}),
]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    text = str(args["a"] + args["b"]) if params.name == "add" else "x" * int(args.get("bytes", 0))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def main() -> None:
    app = Server("bare-http", version="2.0.0", on_list_tools=list_tools, on_call_tool=call_tool) \
        .streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            serving.result()
        await asyncio.sleep(0.01)
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    await serving


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
