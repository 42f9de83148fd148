"""Generate docs/hooks.md from the hookspec docstrings: ``python docs/gen_hooks.py``.

``tests/test_docs.py`` fails when the file is out of date, when a hookspec is
missing from it, or when a hookspec has no ``test_hook_<name>`` test.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

HEADER = """# Hook reference

Generated from `amplifier_tools/hookspecs.py` by `python docs/gen_hooks.py`; do not edit by hand.

Implement any of these with `@amplifier_tools.hookimpl` in a plugin module or object (sync or
`async def`; take only the arguments you need). See [writing plugins](plugins.md) for the life of
one call.
"""


def hookspecs() -> list[tuple[str, str, str]]:
    """(name, signature, docstring) of every hookspec, in source order."""
    from amplifier_tools import hookspecs as module

    specs = []
    for name, fn in inspect.getmembers(module, inspect.isfunction):
        if not hasattr(fn, "amplifier_tools_spec"):
            continue
        params = ", ".join(inspect.signature(fn).parameters)
        specs.append((inspect.getsourcelines(fn)[1], name, f"{name}({params})", inspect.getdoc(fn) or ""))
    return [(name, sig, doc) for _, name, sig, doc in sorted(specs)]


def render() -> str:
    parts = [HEADER]
    for _, signature, doc in hookspecs():
        parts.append(f"\n## `{signature}`\n\n{doc}\n")
    return "".join(parts)


if __name__ == "__main__":
    target = Path(__file__).with_name("hooks.md")
    target.write_text(render())
    print(f"wrote {target}", file=sys.stderr)
