"""Helpers for the MCP tests: fixture server config, process liveness, a host served over HTTP
in the test's process and an SDK client session to it (the SDK is imported where used: these
helpers are imported by tests that skip without it)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from amplifier_tools import ToolContext, ToolHost, ToolResult, hookimpl
from amplifier_tools.procfs import is_live

FIXTURES = Path(__file__).parent / "mcp_fixtures"
FIXTURE_SERVER = str(FIXTURES / "fixture_server.py")
HOSTILE_SERVER = str(FIXTURES / "hostile_server.py")
REPO = str(Path(__file__).resolve().parent.parent)


def audited_import(tmp_path: Path, servers: dict[str, Any], *plugins: Any,
                   **config: Any) -> ToolHost:
    """An unstarted host with the audit and mcp built-ins importing ``servers`` (``[plugins.mcp.servers]``),
    its audit log at ``tmp_path/audit.jsonl`` (``call_records``) and its working directory
    ``tmp_path/work``; ``config`` adds top-level settings (``secrets``)."""
    settings = {"state_dir": str(tmp_path / "state"), **config,
                "plugins": {"audit": {"path": str(tmp_path / "audit.jsonl")}, "mcp": {"servers": servers}}}
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return ToolHost(config=settings, builtins=["audit", "mcp"], plugins=list(plugins), entry_points=False,
                    working_dir=work, discover=False)


def call_records(tmp_path: Path) -> list[dict[str, Any]]:
    """The call records of the audit log ``audited_import`` configured."""
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "call"]


def fixture_server(**settings: Any) -> dict[str, Any]:
    """A ``[plugins.mcp.servers.<name>]`` section running the fixture server."""
    env = dict(settings.pop("env", {}))
    env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    return {"command": sys.executable, "args": [FIXTURE_SERVER], "env": env, **settings}


def hostile(tmp_path: Path, *, tools: list[dict[str, Any]] | None = None, **server: Any) -> Any:
    """A ``ToolHost`` importing the hostile server as ``h``: ``tools`` are extra tool
    definitions it lists, ``env`` adds to its environment, other keys are server settings."""
    from amplifier_tools import ToolHost

    env = dict(server.pop("env", {}))
    if tools is not None:
        env["HOSTILE_TOOLS"] = json.dumps(tools)
    section = {"command": sys.executable, "args": [HOSTILE_SERVER], "env": env, **server}
    return ToolHost(config={"plugins": {"mcp": {"servers": {"h": section}}}}, builtins=["mcp"],
                    entry_points=False, working_dir=tmp_path, discover=False)


def alive(pid: int) -> bool:
    """True while ``pid`` is a live process (zombies count as dead)."""
    return is_live(pid)


def wait_dead(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return not alive(pid)


def read_pid(path: Path) -> int:
    return int(path.read_text())


@asynccontextmanager
async def served_http(cfg: dict[str, Any], builtins: tuple[str, ...] = ("filesystem", "audit", "mcp"), *,
                      plugins: tuple[Any, ...] = (), freeze_heap: bool = False) -> AsyncIterator[str]:
    """The URL of ``cfg``'s host (with ``builtins`` and ``plugins``) served over HTTP in this
    process (``serve_http``, as ``serve-mcp --transport streamable-http`` does), until the block ends."""
    from amplifier_tools import ToolHost
    from amplifier_tools.mcp.http import serve_http
    from amplifier_tools.mcp.server import serve_settings

    async with ToolHost(config=cfg, plugins=list(plugins), builtins=list(builtins), entry_points=False,
                        discover=False) as host:
        url: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.create_task(serve_http(host, serve_settings(host), ready=url.set_result, stop=stop,
                                              freeze_heap=freeze_heap))
        done, _ = await asyncio.wait({url, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # raises what stopped the server
        try:
            yield url.result()
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


@asynccontextmanager
async def http_session(url: str, token: str | None) -> AsyncIterator[Any]:
    """An initialized SDK ``ClientSession`` to ``url`` over Streamable HTTP, with ``token`` as its
    bearer token (none: no ``Authorization`` header)."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers) as http, \
            streamable_http_client(url, http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as client:
        await client.initialize()
        yield client


class Completions:
    """Keeps each ``tool_complete``: the call's id and its error's code."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    @hookimpl
    def tool_complete(self, result: ToolResult, context: ToolContext) -> None:
        self.calls.append((context.call_id, None if result.error is None else result.error["code"]))


def words(path: Path) -> list[str]:
    """The words a witness process wrote to ``path`` so far (none before it exists)."""
    return path.read_text().split() if path.exists() else []


async def until(check: Callable[[], bool], seconds: float = 20.0) -> None:
    """Poll ``check()`` until true, failing after ``seconds`` (a loaded machine starts slowly)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true within {seconds} s")
        await asyncio.sleep(0.01)


class Kept(logging.Handler):
    """Every message a logger passes it (asyncio's "… was never retrieved" comes at collection time)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
