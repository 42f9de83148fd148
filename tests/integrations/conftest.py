"""Fixtures of the framework adapter tests (``tox -e integrations``).

These tests need the frameworks installed (extras ``openai-agents``, ``pydantic-ai``, ``langchain``);
they import them directly, so a missing framework is an error, never a skip. The default test run
does not collect this directory (``tests/conftest.py``); ``tox -e integrations`` names it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from integration_helpers import GATE, Gate, lookup_order, refund_order, slow

from amplifier_tools import ToolHost


@pytest.fixture
def gate() -> Gate:
    GATE["current"] = Gate()
    return GATE["current"]


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[ToolHost]:
    """A started host: the policy and audit built-ins, the three shop tools, no entry points."""
    work = tmp_path / "work"
    work.mkdir()
    async with ToolHost(plugins=[lookup_order, refund_order, slow], builtins=["policy", "audit"],
                        entry_points=False, discover=False, working_dir=work,
                        config={"state_dir": str(tmp_path / "state"), "context": {"principal": "default-user"},
                                "plugins": {"audit": {"fsync": "never"}}}) as started:
        yield started
