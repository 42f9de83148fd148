"""A stdio MCP server (the SDK's low-level ``Server``) that answers with rich content and sends
notifications, for the content, annotation and notification tests.

Tools: ``gallery`` returns one block of every MCP content type (text, image, audio, a resource
link, an embedded text resource and an embedded blob resource); ``work`` sends three
``notifications/progress`` (when the request carried a progress token) and two
``notifications/message`` before it answers; ``hinted`` is listed with annotations that differ
from every MCP default; ``bad_base64``, ``bad_mime`` and ``odd_type`` answer with content a
client cannot use (data that is not base64, a media type that is none, a block type MCP does
not define; the SDK's server refuses to send it, so with ``CONTENT_RAW=1`` the server speaks
JSON-RPC by hand and lists only ``odd_type``); ``big_image`` returns an image of ``size`` bytes.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params

#: A 1x1 transparent PNG.
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")).decode()
WAV = base64.b64encode(b"RIFF\x24\x00\x00\x00WAVEfmt ").decode()
BLOB = base64.b64encode(bytes(range(256))).decode()

GALLERY: list[dict[str, Any]] = [
    {"type": "text", "text": "here is everything", "annotations": {"audience": ["user"], "priority": 0.5}},
    {"type": "image", "data": PNG, "mimeType": "image/png"},
    {"type": "audio", "data": WAV, "mimeType": "audio/wav"},
    {"type": "resource_link", "uri": "file:///srv/report.pdf", "name": "report.pdf", "mimeType": "application/pdf",
     "description": "the quarterly report"},
    {"type": "resource", "resource": {"uri": "file:///srv/notes.txt", "mimeType": "text/plain",
                                      "text": "line one\nline two"}},
    {"type": "resource", "resource": {"uri": "file:///srv/blob.bin", "mimeType": "application/octet-stream",
                                      "blob": BLOB}},
]

#: As mcp-server-fetch's: read-only and open world (re-served, openWorldHint became false: Pure's hints).
HINTS = types.ToolAnnotations(title="Hinted tool", read_only_hint=True, destructive_hint=False,
                              idempotent_hint=False, open_world_hint=True)

OBJECT = {"type": "object"}
TOOLS = [
    types.Tool(name="gallery", description="Every content type.", input_schema=OBJECT,
               annotations=types.ToolAnnotations(read_only_hint=True)),
    types.Tool(name="work", description="Reports progress and logs.", input_schema=OBJECT,
               annotations=types.ToolAnnotations(read_only_hint=True)),
    types.Tool(name="hinted", description="Annotated unlike the defaults.", input_schema=OBJECT, annotations=HINTS),
    types.Tool(name="bad_base64", description="An image that is not base64.", input_schema=OBJECT),
    types.Tool(name="bad_mime", description="An image whose media type is none.", input_schema=OBJECT),
    types.Tool(name="odd_type", description="A block type MCP does not define.", input_schema=OBJECT),
    types.Tool(name="big_image", description="An image of `size` bytes.", input_schema={
        "type": "object", "properties": {"size": {"type": "integer"}}}),
]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
    args = params.arguments or {}
    if params.name == "gallery":
        return {"content": GALLERY}
    if params.name == "work":
        token = progress_token_from_params(ctx.params)
        await ctx.session.send_log_message("info", "starting the work", logger="fixture",
                                           related_request_id=ctx.request_id)
        for step in (1, 2, 3):
            if token is not None:
                await ctx.session.send_progress_notification(token, step, 3, f"step {step} of 3")
        await ctx.session.send_log_message("warning", {"note": "almost done"}, logger="fixture",
                                           related_request_id=ctx.request_id)
        return {"content": [{"type": "text", "text": "worked"}]}
    if params.name == "hinted":
        return {"content": [{"type": "text", "text": "ok"}]}
    if params.name == "bad_base64":
        return {"content": [{"type": "image", "data": "not base64!!", "mimeType": "image/png"}]}
    if params.name == "bad_mime":
        return {"content": [{"type": "image", "data": PNG, "mimeType": "<script>"}]}
    if params.name == "odd_type":
        return {"content": [{"type": "hologram", "data": "x"}]}
    if params.name == "big_image":
        data = base64.b64encode(b"\x89PNG" + b"\0" * (int(args.get("size", 1_000_000)) - 4)).decode()
        return {"content": [{"type": "image", "data": data, "mimeType": "image/png"}]}
    return {"content": [{"type": "text", "text": f"unknown tool {params.name}"}], "isError": True}


server = Server("content-server", version="2.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def raw_main() -> None:
    """JSON-RPC by hand, for what the SDK's server will not send: a block type MCP does not define."""
    for line in sys.stdin:
        request = json.loads(line) if line.strip() else {}
        method, rid = request.get("method"), request.get("id")
        if rid is None:
            continue
        if method == "initialize":
            result: dict[str, Any] = {"protocolVersion": request["params"]["protocolVersion"],
                                      "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "1.0.0"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "odd_type", "inputSchema": OBJECT}]}
        else:
            result = {"content": [{"type": "hologram", "data": "x"}]}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    import anyio

    if os.environ.get("CONTENT_RAW"):
        raw_main()
    else:
        anyio.run(main)
