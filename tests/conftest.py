"""Shared fixtures for the core test suite (tools and plugins live in helpers.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import EchoTool
from redis_server import RedisServer

from amplifier_tools import ToolHost


@pytest.fixture(autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every test gets its own ``XDG_STATE_HOME``: hosts keep their state there, never in ~."""
    home = tmp_path_factory.mktemp("state-home")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """tenacity sleeps through ``asyncio.sleep``: the backoff delays, recorded instead of slept."""
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds: float, result: Any = None) -> Any:
        if seconds > 0:
            recorded.append(seconds)
        return await real_sleep(0, result)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    # tenacity before 8.2.3 (the floor, setup.cfg, is 8.2) bound ``asyncio.sleep`` as AsyncRetrying's
    # default at import, so the patch above missed it and the backoffs were slept, not recorded.
    import tenacity

    init = tenacity.AsyncRetrying.__init__
    if init.__defaults__ and real_sleep in init.__defaults__:
        monkeypatch.setattr(init, "__defaults__",
                            tuple(fake_sleep if value is real_sleep else value for value in init.__defaults__))
    return recorded


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



def pytest_configure(config: pytest.Config) -> None:
    """Use the project's own pytest plugin even when running from a source tree (no entry point)."""
    import amplifier_tools.pytest_plugin as plugin

    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "amplifier_tools.pytest_plugin")


#: The framework adapter tests: they need the frameworks (extras openai-agents, pydantic-ai,
#: langchain), which the default environments do not install. ``tox -e integrations`` runs them by
#: naming the directory; a run that does not name it does not collect it, rather than collecting
#: and skipping it (test_integrations_env.py checks the tox env exists and runs it).
INTEGRATIONS = Path(__file__).resolve().parent / "integrations"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave tests/integrations out unless an argument of this run names it or a path inside it."""
    if collection_path != INTEGRATIONS:
        return None
    base = config.invocation_params.dir
    for arg in config.args:
        named = (base / arg.split("::")[0]).resolve()
        if named == INTEGRATIONS or INTEGRATIONS in named.parents:
            return None
    return True


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A throwaway ``redis-server`` on 127.0.0.1 and a free port (tests/redis_server.py), stopped after the test."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    """The policy plugin's ``store`` setting for each kind of store (Redis: a fresh server); a test
    module may define its own ``store`` with fewer kinds."""
    if request.param != "redis":
        return str(request.param)
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url
