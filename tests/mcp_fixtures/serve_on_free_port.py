"""Serve an ASGI app with uvicorn on 127.0.0.1 on a free port, for the HTTP fixture servers run as
scripts (``bare_http_server.py``, ``stall_server.py``): the endpoint URL is printed as the first
line on stdout once uvicorn has started, and serving goes on until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn


async def serve_on_free_port(app: Any, path: str = "/mcp", **config: Any) -> None:
    """Serve ``app`` (``config``: more ``uvicorn.Config`` settings) and print ``http://…{path}``."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **config))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            serving.result()
        await asyncio.sleep(0.01)
    print(f"http://127.0.0.1:{sock.getsockname()[1]}{path}", flush=True)
    await serving
