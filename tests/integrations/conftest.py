"""Fixtures of the framework adapter tests (``tox -e integrations``).

These tests need the frameworks installed (extras ``openai-agents``, ``pydantic-ai``, ``langchain``);
they import them directly, so a missing framework is an error, never a skip. The default test run
does not collect this directory (``tests/conftest.py``); ``tox -e integrations`` names it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from integration_helpers import GATE, Gate, shop_host

from amplifier_tools import ToolHost


@pytest.fixture
def gate() -> Gate:
    GATE["current"] = Gate()
    return GATE["current"]


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[ToolHost]:
    """A started host: the policy and audit built-ins, the three shop tools, no entry points."""
    async with shop_host(tmp_path) as started:
        yield started
