"""Shared fixtures for the core test suite (tools and plugins live in helpers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import EchoTool

from amplifier_tools import ToolHost


@pytest.fixture
def echo() -> EchoTool:
    return EchoTool()


@pytest.fixture
async def host_factory(tmp_path: Any) -> AsyncIterator[Any]:
    """``await host_factory(*plugins, config=...)`` -> a started host without built-ins or entry points."""
    hosts: list[ToolHost] = []

    async def make(*plugins: Any, config: dict[str, Any] | None = None, **kwargs: Any) -> ToolHost:
        kwargs.setdefault("builtins", False)
        kwargs.setdefault("entry_points", False)
        kwargs.setdefault("working_dir", tmp_path)
        host = ToolHost(config=config, plugins=plugins, **kwargs)
        await host.start()
        hosts.append(host)
        return host

    yield make
    for host in reversed(hosts):
        await host.close()

