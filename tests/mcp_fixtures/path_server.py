"""An MCP server whose tools take path arguments, for the path-rule tests (test_path_policy.py).

``read_text {path}`` and ``read_many {paths: [...]}`` return file contents, resolving relative
paths against ``FIXTURE_ROOT`` (its own working directory) the way a careless server would.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

TOOLS = [
    types.Tool(name="read_text", description="Read one text file.",
               input_schema={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    types.Tool(name="read_many", description="Read several text files.",
               input_schema={"type": "object", "properties": {
                   "paths": {"type": "array", "items": {"type": "string"}}}, "required": ["paths"]}),
    types.Tool(name="open_doc", description="Read a document named by a 'format: path' property.",
               input_schema={"type": "object", "properties": {"doc": {"type": "string", "format": "path"}}}),
]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    paths = {"read_text": [args.get("path")], "read_many": args.get("paths"), "open_doc": [args.get("doc")]}
    texts = [_read(str(p)) for p in paths.get(params.name) or []]
    return types.CallToolResult(content=[types.TextContent(type="text", text="\n".join(texts))])


server = Server("path-server", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    os.chdir(os.environ.get("FIXTURE_ROOT", "."))
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    sys.exit(anyio.run(main))
