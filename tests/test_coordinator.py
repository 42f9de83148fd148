"""The seed coordinator surface seen by a plugin's mount."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import EchoTool

from amplifier_tools import hookimpl


async def test_coordinator_surface(host_factory: Any, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    emitted: list[tuple[str, Any]] = []

    class Provider:
        name = "provider"

        @hookimpl(tryfirst=True)
        async def mount(self, coordinator: Any) -> None:
            coordinator.register_capability("greeting", "hello")
            coordinator.register_contributor("observability.events", "provider", lambda: ["provider:ready"])
            await coordinator.mount("tools", EchoTool())
            await coordinator.mount("providers", object(), name="llm")

    class Consumer:
        name = "consumer"

        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            seen["working_dir"] = coordinator.get_capability("session.working_dir")
            seen["greeting"] = coordinator.get_capability("greeting")
            seen["tool"] = coordinator.get("tools", "echo")
            seen["providers"] = sorted(coordinator.get("providers"))

            async def later() -> list[str]:
                return ["consumer:ready"]

            coordinator.register_contributor("observability.events", "consumer", later)
            seen["events"] = await coordinator.collect_contributions("observability.events")
            coordinator.hooks.register("custom", lambda event, data: emitted.append((event, data)))
            await coordinator.hooks.emit("custom", {"n": 1})
            await coordinator.unmount("tools", "echo")

    host = await host_factory(Consumer(), Provider())
    assert seen["working_dir"] == str(tmp_path.resolve())
    assert seen["greeting"] == "hello"
    assert isinstance(seen["tool"], EchoTool)
    assert seen["providers"] == ["llm"]
    assert seen["events"] == [["provider:ready"], ["consumer:ready"]]
    assert emitted == [("custom", {"n": 1})]
    assert host.specs == []  # unmounted again
    assert (await host.call("echo", {"path": "x"})).error["code"] == "unknown_tool"
