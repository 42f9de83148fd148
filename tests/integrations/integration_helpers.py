"""Tools and helpers shared by the framework adapter tests: three small shop tools (one needs a
scope the policy plugin checks, one waits on a gate so a run can be cancelled mid-call), the audit
records a host wrote, and what the policy plugin holds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from amplifier_tools import ToolHost, tool

#: The scope ``refund`` requires; a context without it is denied by the policy plugin.
REFUND_SCOPE = "payments:refund"


@tool(name="shop::orders.lookup", effect="Pure")
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up by its id."""
    return {"order_id": order_id, "status": "shipped", "total": 42}


@tool(name="shop::orders.refund", effect="NonIdempotentWrite", security={"required_scopes": [REFUND_SCOPE]})
async def refund_order(order_id: str, amount: int) -> str:
    """Refund part of an order."""
    return f"refunded {amount} on {order_id}"


class Gate:
    """What the ``slow`` tool waits on, so a test can cancel a run while the tool is running."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()


GATE: dict[str, Gate] = {}


@tool(name="shop::slow", effect="Pure", policies={"concurrency": {"limit": 1}})
async def slow(seconds: float) -> str:
    """Take its time (the gate of the running test decides how long)."""
    gate = GATE["current"]
    gate.started.set()
    await asyncio.wait_for(gate.release.wait(), seconds)
    return "done"


def audit_records(host: ToolHost) -> list[dict[str, Any]]:
    """The host's call records, oldest first."""
    path = host.state_dir / "audit.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("kind") == "call"]


def held(host: ToolHost) -> dict[str, int]:
    """What the policy plugin holds right now (all zero when no call is in flight)."""
    return host.plugin_manager.get_plugin("policy").held_resources()  # type: ignore[no-any-return]


def shop_host(tmp_path: Path) -> ToolHost:
    """A host (not started) with the policy and audit built-ins, the three shop tools, no entry
    points, its working directory and state under ``tmp_path``."""
    work = tmp_path / "work"
    work.mkdir()
    return ToolHost(plugins=[lookup_order, refund_order, slow], builtins=["policy", "audit"],
                    entry_points=False, discover=False, working_dir=work,
                    config={"state_dir": str(tmp_path / "state"), "context": {"principal": "default-user"},
                            "plugins": {"audit": {"fsync": "never"}}})
