"""A bare Streamable HTTP MCP server written with the SDK alone (low-level ``Server``, uvicorn), for
the HTTP import bench and tests: nothing of amplifier-tools runs in it.

It listens on 127.0.0.1 on a free port, prints its endpoint URL as the first line on stdout, and
serves until it gets SIGTERM or SIGINT. Tools: ``add`` (``a + b`` as text) and ``big`` (one text
block of ``bytes`` characters).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from serve_on_free_port import serve_on_free_port

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
    await serve_on_free_port(app)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
