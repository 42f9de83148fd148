"""A module that imports amplifier-core at import time, as many Amplifier modules do."""

from amplifier_core.models import ToolResult  # noqa: F401


async def mount(coordinator, config):  # type: ignore[no-untyped-def]
    return None
