"""A hook module: registers one ``tool:pre`` (or ``tool:post``) handler whose answer comes from config.

``config``: ``event`` (default ``tool:pre``), ``action`` (continue, deny, modify, ask_user,
inject_context, raise, garbage), ``priority``, ``name``, ``via`` (``get`` uses
``coordinator.get("hooks")`` like Amplifier's approval module; ``attr`` uses ``coordinator.hooks``),
``result_type`` (``dict`` or ``hookresult``: amplifier-core's own class).
"""

from __future__ import annotations

from typing import Any

SEEN: list[tuple[str, str, dict[str, Any]]] = []


def _result(config: dict[str, Any], **fields: Any) -> Any:
    if config.get("result_type") == "hookresult":
        from amplifier_core.models import HookResult

        return HookResult(**fields)
    return dict(fields)


async def mount(coordinator: Any, config: dict[str, Any]) -> Any:
    hooks = coordinator.get("hooks") if config.get("via", "get") == "get" else coordinator.hooks
    if not hooks:
        raise RuntimeError("No hooks registry available")
    action = config.get("action", "continue")
    name = config.get("name", f"{action}-handler")

    async def handler(event: str, data: dict[str, Any]) -> Any:
        SEEN.append((name, event, data))
        if action == "raise":
            raise RuntimeError("handler exploded")
        if action == "garbage":
            return 42
        if action == "deny":
            return _result(config, action="deny", reason="writes to production are blocked")
        if action == "modify":
            if event == "tool:post":
                result = dict(data["tool_result"])
                result["output"] = "[rewritten by hook]"
                return _result(config, action="modify", data={**data, "tool_result": result})
            tool_input = dict(data["tool_input"])
            tool_input["path"] = "rewritten-" + tool_input["path"]
            return _result(config, action="modify", data={**data, "tool_input": tool_input})
        if action == "ask_user":
            return _result(config, action="ask_user", approval_prompt="Allow this write?",
                           approval_options=["Allow", "Deny"], approval_default="deny")
        if action == "inject_context":
            return _result(config, action="inject_context", context_injection="lint: 3 warnings")
        return _result(config, action="continue")

    unregister = hooks.register(config.get("event", "tool:pre"), handler, priority=config.get("priority", 0),
                                name=name)
    return unregister
