"""One copy of a value a plugin, a hook handler or a caller may change in place.

Used where the host hands out something of its own that must stay as it was: Amplifier hook
handlers' event data, a ``tool_error`` hook's error details (``dispatch.ErrorState``) and each call
of a ``MockTool``. One function, so that each place copies what ``copy.deepcopy`` cannot the same way.
"""

from __future__ import annotations

import copy
from typing import Any


def copy_of(value: Any) -> Any:
    """A deep copy of ``value``; for one ``copy.deepcopy`` fails on (nested past the stack, an
    object whose ``__deepcopy__`` raises), a copy of its dicts and lists, without recursion, the
    rest copied where it can be and shared where it cannot (found by attack: such an output,
    which the call returned before, failed every call with a ``tool:post`` handler).

    Limits: a leaf no ``copy.deepcopy`` takes (an object holding a lock or a socket) is shared, not
    copied; containers other than ``dict`` and ``list`` are copied only by ``copy.deepcopy``."""
    try:
        return copy.deepcopy(value)
    except Exception:  # RecursionError included
        pass
    copies: dict[int, Any] = {}
    top: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, top, 0)]
    while stack:
        node, into, at = stack.pop()
        if isinstance(node, (dict, list)):
            made = copies.get(id(node))
            if made is None:
                if isinstance(node, dict):
                    made = copies[id(node)] = dict.fromkeys(node)
                    stack.extend((item, made, key) for key, item in node.items())
                else:
                    made = copies[id(node)] = [None] * len(node)
                    stack.extend((item, made, index) for index, item in enumerate(node))
            into[at] = made
            continue
        try:
            into[at] = copy.deepcopy(node)
        except Exception:
            into[at] = node
    return top[0]
