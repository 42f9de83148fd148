"""A real MCP server (the SDK's low-level ``Server``) for the cancellation attacks: stdio by
default; with ``http``, Streamable HTTP (uvicorn) on 127.0.0.1 on a free port, its endpoint URL
printed as the first line on stdout.

Tools: ``echo`` returns ``text`` as one text block; ``stall`` sleeps ``seconds`` with
``time.sleep``, which holds the server's whole event loop: it stops reading its stdin (its pipe
fills under the host's writes) or its HTTP connections, then answers "stalled" — after the host
has given up on the call and cancelled it; ``wait`` sleeps ``seconds`` without holding the loop.

With ``http-deaf``: Streamable HTTP as with ``http``, except that a POST carrying a
``notifications/cancelled`` is never answered (the server keeps serving everything else).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

TOOLS = [types.Tool(name=name, description=f"The {name} tool.", input_schema={"type": "object"})
         for name in ("echo", "stall", "wait")]


def text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=value)])


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "stall":
        time.sleep(float(args.get("seconds", 5)))  # the loop is held: nothing is read meanwhile
        return text("stalled")
    if params.name == "wait":
        await anyio.sleep(float(args.get("seconds", 5)))
        return text("waited")
    return text(str(args.get("text", "")))


server = Server("stall", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def deaf_to_cancellations(app: Any) -> Any:
    """``app``, except that a POST whose body holds a ``notifications/cancelled`` is never answered."""

    async def deaf(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        messages = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        if any(b"notifications/cancelled" in m.get("body", b"") for m in messages):
            await anyio.sleep_forever()

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await app(scope, replay, send)

    return deaf


async def main_http(deaf: bool = False) -> None:
    from serve_on_free_port import serve_on_free_port

    app = server.streamable_http_app()
    await serve_on_free_port(deaf_to_cancellations(app) if deaf else app, timeout_graceful_shutdown=1)


if __name__ == "__main__":
    if sys.argv[1:2] in (["http"], ["http-deaf"]):
        asyncio.run(main_http(deaf=sys.argv[1] == "http-deaf"))
    else:
        anyio.run(main)
