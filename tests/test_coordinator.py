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


async def test_a_tool_function_mounted_by_a_seed_module_gets_no_tool_call_id(host_factory: Any) -> None:
    """Found by a newcomer's trial: a ``@tool`` function mounted from a seed-style module's ``mount``
    (``[[modules]]``, a mount plan's ``tools:``) was handed ``_tool_call_id`` like Amplifier's tools,
    and every call failed with ``TypeError: upper() got an unexpected keyword argument``. The
    function's parameters are its contract; Amplifier's own tools still get the id."""
    import types

    from amplifier_tools import tool

    @tool(name="local::text.upper", effect="Pure")
    def upper(text: str) -> str:
        return text.upper()

    @tool(name="local::text.lower", effect="Pure")
    def lower(text: str) -> str:
        return text.lower()

    seen: list[dict[str, Any]] = []

    class SeedTool:
        name = "seed_echo"
        description = "echo"
        input_schema = {"type": "object"}

        async def execute(self, input: dict[str, Any]) -> dict[str, Any]:
            seen.append(dict(input))
            return {"success": True, "output": "ok"}

    async def mount_upper(coordinator: Any, config: dict[str, Any]) -> None:
        await coordinator.mount("tools", upper)
        await coordinator.mount("tools", SeedTool())

    async def mount_lower(coordinator: Any, config: dict[str, Any]) -> Any:
        return lower  # the seed lets mount return its tool

    mounting = types.ModuleType("mounting")
    mounting.mount = mount_upper  # type: ignore[attr-defined]
    returning = types.ModuleType("returning")
    returning.mount = mount_lower  # type: ignore[attr-defined]
    host = await host_factory(mounting, returning)
    upper_result = await host.call("text_upper", {"text": "hi"})
    lower_result = await host.call("text_lower", {"text": "HI"})
    seed_result = await host.call("seed_echo", {"x": 1}, call_id="call-9")
    assert (upper_result.success, upper_result.output) == (True, "HI"), upper_result.error
    assert (lower_result.success, lower_result.output) == (True, "hi"), lower_result.error
    assert seed_result.success and seen == [{"x": 1, "_tool_call_id": "call-9"}]
