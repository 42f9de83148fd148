"""``copies.copy_of``: the one copy of what the host hands to code that may change it in place."""

from __future__ import annotations

import threading
from typing import Any

from amplifier_tools.copies import copy_of
from amplifier_tools.pytest_plugin import MockTool


def _nested(depth: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    node = top
    for _ in range(depth):
        node["down"] = {}
        node = node["down"]
    return top


def test_what_deepcopy_cannot_copy_is_copied_container_by_container() -> None:
    lock = threading.Lock()  # copy.deepcopy refuses it, and with it the whole value
    value = {"lock": lock, "items": [1, {"two": 2}], "deep": _nested(5_000)}
    copied = copy_of(value)
    assert copied is not value and copied["items"] == [1, {"two": 2}]
    mine, theirs, depth = copied["deep"], value["deep"], 0
    while mine:  # nested past the stack: compared without recursion
        assert mine is not theirs and list(mine) == ["down"]
        mine, theirs, depth = mine["down"], theirs["down"], depth + 1
    assert depth == 5_000 and theirs == {}
    assert copied["items"] is not value["items"] and copied["items"][1] is not value["items"][1]
    assert copied["lock"] is lock  # shared: it cannot be copied
    copied["items"][1]["two"] = 3
    assert value["items"][1]["two"] == 2


def test_a_shared_list_stays_shared_in_the_copy() -> None:
    shared = [1, 2]
    copied = copy_of({"a": shared, "b": shared, "lock": threading.Lock()})
    assert copied["a"] is copied["b"] and copied["a"] is not shared


async def test_a_mock_tool_returning_what_deepcopy_refuses_still_gives_each_call_its_own_dicts() -> None:
    tool = MockTool(return_value={"rows": [{"n": 1}], "lock": threading.Lock()})
    first = await tool.execute({})
    first.output["rows"][0]["n"] = 99
    second = await tool.execute({})
    assert second.output["rows"] == [{"n": 1}]
