"""serve-mcp over Streamable HTTP for ``bench_mcp``'s serve case: a host with the bench's ``add``
tool, served as ``amplifier-tools serve-mcp --transport streamable-http`` serves (bearer token
client, audit-visible refusals, DNS-rebinding protection), on a free loopback port. Prints the
endpoint URL as its first stdout line and serves until SIGTERM. The token is read from the
environment variable ``BENCH_MCP_TOKEN`` (a ``[secrets]`` reference, as a deployment configures it).
"""

from __future__ import annotations

import asyncio

from amplifier_tools import ToolHost
from amplifier_tools.mcp.http import serve_http
from amplifier_tools.mcp.server import serve_settings

from .bench_mcp import _Mount

#: The environment variable the client's token is read from.
TOKEN_VARIABLE = "BENCH_MCP_TOKEN"
CONFIG = {
    "secrets": {"bench": TOKEN_VARIABLE},
    "plugins": {"mcp": {"serve": {"transport": "streamable-http", "port": 0, "tools": ["*"],
                                  "clients": [{"token_ref": "bench", "principal": "bench"}]}}},
}


async def main() -> None:
    async with ToolHost(config=CONFIG, plugins=[_Mount()], builtins=["mcp"], entry_points=False,
                        discover=False) as host:
        await serve_http(host, serve_settings(host), ready=lambda url: print(url, flush=True), freeze_heap=True)


if __name__ == "__main__":
    asyncio.run(main())
