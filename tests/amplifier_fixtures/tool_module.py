"""A tool module as Amplifier writes them: a base class with an empty ``input_schema`` (like the
seed ``Tool`` protocol), the real schema from ``get_schema()``, ``mount`` returning the tool
instead of mounting it, and a failing run reported as ``success=False`` with output and no error."""

from __future__ import annotations

from typing import Any

INPUTS: list[dict[str, Any]] = []


class BaseTool:
    name = ""
    description = ""
    input_schema: dict[str, Any] = {}  # the seed protocol's empty default, on purpose


class RunTool(BaseTool):
    name = "run"
    description = "Run a pretend command."

    def get_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
                "additionalProperties": False}

    async def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        INPUTS.append(dict(input))
        if input["command"] == "picture":  # rich content: text and image blocks, as Amplifier's ToolResult has
            return {"success": True, "output": "a picture",
                    "content": [{"type": "text", "text": "a picture"},
                                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                             "data": "iVBORw0KGgo="}}]}
        if input["command"] == "false":
            return {"success": False, "output": {"stdout": "", "stderr": "boom: no such file", "returncode": 2}}
        return {"success": True, "output": {"stdout": "ok\n", "returncode": 0}}


async def mount(coordinator: Any, config: dict[str, Any]) -> Any:
    return RunTool()
