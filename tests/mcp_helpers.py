"""Helpers for the MCP tests: fixture server config, process liveness."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from amplifier_tools.procfs import is_live

FIXTURES = Path(__file__).parent / "mcp_fixtures"
FIXTURE_SERVER = str(FIXTURES / "fixture_server.py")
HOSTILE_SERVER = str(FIXTURES / "hostile_server.py")
REPO = str(Path(__file__).resolve().parent.parent)


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
