"""The completion invariant (DESIGN "Completion, cancellation and close"), under faults.

For every call that reaches ``host.call``: exactly one of ``tool_post``/``tool_error``, then
``tool_complete`` once, then exactly one audit record; a cancelled call re-raises
``CancelledError`` after it is recorded; a call cut by ``close()`` is recorded and returns
``host_closing``. Each scenario counts hook calls per call id and audit records per call id.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, hookimpl
from amplifier_tools.errors import PluginLoadError


class Counting:
    """Counts each call hook per call id; optionally fails or hangs in one hook."""

    name = "counting"

    def __init__(self) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()
        self.completed: dict[str, ToolResult] = {}

    @hookimpl
    def tool_pre(self, call: Any) -> None:
        self.seen["tool_pre", call.id] += 1

    @hookimpl
    def tool_post(self, call: Any) -> None:
        self.seen["tool_post", call.id] += 1

    @hookimpl
    def tool_error(self, call: Any) -> None:
        self.seen["tool_error", call.id] += 1

    @hookimpl
    def tool_complete(self, call: Any, result: ToolResult) -> None:
        self.seen["tool_complete", call.id] += 1
        self.completed[call.id] = result

    def assert_once(self, call_id: str) -> ToolResult:
        """Exactly one of post/error, exactly one complete; the result observers saw."""
        assert self.seen["tool_post", call_id] + self.seen["tool_error", call_id] == 1, self.seen
        assert self.seen["tool_complete", call_id] == 1, self.seen
        return self.completed[call_id]


class Sleeps:
    name = "sleeps"
    description = "Sleeps for `seconds`."
    input_schema = {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}

    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.running = asyncio.Event()

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.started += 1
        self.running.set()
        await asyncio.sleep(input["seconds"])
        self.finished += 1
        return ToolResult(True, "slept")


class RaisesCancelled:
    name = "raises_cancelled"
    description = "Raises CancelledError itself."

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        raise asyncio.CancelledError


def audit_records(host: ToolHost) -> Counter[str]:
    path = Path(host.capabilities["audit.path"])
    if not path.exists():
        return Counter()
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return Counter(r["call_id"] for r in records if r.get("kind") == "call")


def audit_record(host: ToolHost, call_id: str) -> dict[str, Any]:
    path = Path(host.capabilities["audit.path"])
    (record,) = [r for r in map(json.loads, path.read_text().splitlines())
                 if r.get("kind") == "call" and r["call_id"] == call_id]
    return record


@pytest.fixture
async def setup(tmp_path: Path) -> Any:
    counting = Counting()
    sleeps = Sleeps()
    config = {"plugins": {},
              "tools": {"sleeps": {"policies": {"concurrency": {"limit": 1, "queue": True}}}}}
    host = ToolHost(config=config, plugins=[ToolsPlugin(sleeps, RaisesCancelled()), counting],
                    builtins=["policy", "audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    yield host, counting, sleeps
    # Whatever the scenario did, the policy plugin holds nothing afterwards.
    assert not any(held_resources(host).values()), held_resources(host)
    await host.close()


def held_resources(host: ToolHost) -> dict[str, int]:
    held: dict[str, int] = host.plugin_manager.get_plugin("policy").held_resources()
    return held


async def test_caller_cancel_while_tool_runs_is_recorded_then_reraised(setup: Any) -> None:
    host, counting, sleeps = setup
    task = asyncio.ensure_future(host.call("sleeps", {"seconds": 30}, call_id="c1"))
    await sleeps.running.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    result = counting.assert_once("c1")
    assert result.error["code"] == "cancelled" and result.error["type"] == "SystemError"
    assert audit_records(host)["c1"] == 1
    assert audit_record(host, "c1")["error"]["code"] == "cancelled"
    # The concurrency slot came back: the next call runs instead of waiting forever.
    after = await asyncio.wait_for(host.call("sleeps", {"seconds": 0}, call_id="c2"), 20)
    assert after.success, after.error


async def test_wait_for_timeout_records_the_call_and_raises_timeout(setup: Any) -> None:
    host, counting, _ = setup
    with pytest.raises((asyncio.TimeoutError, TimeoutError)):
        await asyncio.wait_for(host.call("sleeps", {"seconds": 30}, call_id="w1"), 0.05)
    assert counting.assert_once("w1").error["code"] == "cancelled"
    assert audit_records(host)["w1"] == 1


async def test_cancel_while_queued_for_a_slot_is_recorded_and_the_tool_never_starts(setup: Any) -> None:
    host, counting, sleeps = setup
    first = asyncio.ensure_future(host.call("sleeps", {"seconds": 0.3}, call_id="q1"))
    await sleeps.running.wait()
    queued = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="q2"))
    await asyncio.sleep(0.02)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert (await first).success
    assert sleeps.started == 1
    assert counting.assert_once("q2").error["code"] == "cancelled"
    assert audit_records(host) == Counter({"q1": 1, "q2": 1})
    assert (await asyncio.wait_for(host.call("sleeps", {"seconds": 0}, call_id="q3"), 20)).success


async def test_tool_raising_cancelled_error_is_recorded(setup: Any) -> None:
    """Nobody cancelled the call: from 3.11, where a task says whether it is being cancelled, the
    tool's own ``CancelledError`` is its failure (``test_what_tools_raise.py``); on 3.10 it
    cannot be told from a cancellation, and cancels the caller. Recorded once either way."""
    host, counting, _ = setup
    if sys.version_info >= (3, 11):
        result = await host.call("raises_cancelled", {}, call_id="r1")
        assert result.error is not None and result.error["code"] == "tool_raised"
        assert counting.assert_once("r1").error["code"] == "tool_raised"
    else:  # pragma: no cover - exercised by the py310 tox env
        with pytest.raises(asyncio.CancelledError):
            await host.call("raises_cancelled", {}, call_id="r1")
        assert counting.assert_once("r1").error["code"] == "cancelled"
    assert audit_records(host)["r1"] == 1


async def test_cancel_during_async_tool_post_never_runs_tool_error_too(tmp_path: Path) -> None:
    entered = asyncio.Event()

    class SlowPost:
        name = "slow-post"

        @hookimpl
        async def tool_post(self, call: Any) -> None:
            entered.set()
            await asyncio.sleep(0.2)  # it runs to its end despite the cancellation (within its hook timeout)

    counting = Counting()
    async with ToolHost(plugins=[ToolsPlugin(Sleeps()), counting, SlowPost()], builtins=["audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="p1"))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert counting.seen["tool_error", "p1"] == 0
        assert counting.seen["tool_complete", "p1"] == 1
        assert counting.completed["p1"].error["code"] == "cancelled"
        assert audit_records(host)["p1"] == 1


async def test_second_cancel_during_recording_does_not_lose_the_record(tmp_path: Path) -> None:
    """A caller that cancels again while the call is being recorded still gets one record."""
    gate = asyncio.Event()
    released = asyncio.Event()

    class SlowObserver:
        name = "slow-observer"

        @hookimpl
        async def tool_error(self, call: Any) -> None:
            gate.set()
            await released.wait()

    counting = Counting()
    sleeps = Sleeps()
    async with ToolHost(plugins=[ToolsPlugin(sleeps), counting, SlowObserver()], builtins=["audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call("sleeps", {"seconds": 30}, call_id="d1"))
        await sleeps.running.wait()
        task.cancel()
        await gate.wait()
        task.cancel()  # again, while tool_error observers run
        await asyncio.sleep(0)
        released.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        counting.assert_once("d1")
        assert audit_records(host)["d1"] == 1


async def test_close_cuts_calls_after_grace_records_them_and_returns_host_closing(tmp_path: Path) -> None:
    counting = Counting()
    sleeps = Sleeps()
    config = {"shutdown_grace_ms": 50, "plugins": {"audit": {"fsync": "never"}},
              "tools": {"sleeps": {"policies": {"concurrency": {"limit": 1, "queue": True}}}}}
    host = ToolHost(config=config, plugins=[ToolsPlugin(sleeps), counting], builtins=["policy", "audit"],
                    entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    log_path = Path(host.capabilities["audit.path"])
    running = asyncio.ensure_future(host.call("sleeps", {"seconds": 30}, call_id="k1"))
    await sleeps.running.wait()
    queued = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="k2"))
    await asyncio.sleep(0.02)
    await host.close()
    cut, never_started = await running, await queued
    assert not any(held_resources(host).values())
    assert cut.error["code"] == "host_closing" and never_started.error["code"] == "host_closing"
    assert sleeps.started == 1 and sleeps.finished == 0  # the queued call never started its tool
    counting.assert_once("k1")
    counting.assert_once("k2")
    records = Counter(r["call_id"] for r in map(json.loads, log_path.read_text().splitlines())
                      if r.get("kind") == "call")
    assert records == Counter({"k1": 1, "k2": 1})
    late = await host.call("sleeps", {"seconds": 0})
    assert late.error["code"] == "host_closing"


async def test_close_lets_in_flight_calls_finish_within_grace(tmp_path: Path) -> None:
    sleeps = Sleeps()
    host = ToolHost(config={"shutdown_grace_ms": 5000}, plugins=[ToolsPlugin(sleeps)], builtins=False,
                    entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    call = asyncio.ensure_future(host.call("sleeps", {"seconds": 0.1}))
    await sleeps.running.wait()
    await host.close()
    assert (await call).success
    assert sleeps.finished == 1


async def test_calls_arriving_while_closing_are_refused_and_recorded(tmp_path: Path) -> None:
    sleeps = Sleeps()
    counting = Counting()
    host = ToolHost(config={"shutdown_grace_ms": 5000},
                    plugins=[ToolsPlugin(sleeps), counting], builtins=["audit"], entry_points=False,
                    working_dir=tmp_path, discover=False)
    await host.start()
    log_path = Path(host.capabilities["audit.path"])
    first = asyncio.ensure_future(host.call("sleeps", {"seconds": 0.2}))
    await sleeps.running.wait()
    closing = asyncio.ensure_future(host.close())
    await asyncio.sleep(0.01)
    refused = await host.call("sleeps", {"seconds": 0}, call_id="late")
    assert refused.error["code"] == "host_closing"
    await closing
    assert (await first).success
    counting.assert_once("late")
    assert any(json.loads(line)["call_id"] == "late" for line in log_path.read_text().splitlines()
               if json.loads(line).get("kind") == "call")


# -- fail-closed hooks ---------------------------------------------------------------------


class Explodes:
    """Fails in ``hook`` (raises) — fail closed by default."""

    def __init__(self, hook: str, name: str = "explodes") -> None:
        self.name = name
        self.hook = hook

    @hookimpl(tryfirst=True)
    def tool_post(self, call: Any) -> None:
        if self.hook == "tool_post":
            raise RuntimeError("boom in tool_post")

    @hookimpl(tryfirst=True)
    def tool_complete(self, call: Any) -> None:
        if self.hook == "tool_complete":
            raise RuntimeError("boom in tool_complete")


class Resurrects:
    """Runs after the failing plugin and tries to put the output back."""

    name = "resurrects"

    @hookimpl(trylast=True)
    def tool_post(self, call: Any) -> ToolResult:
        return ToolResult(True, "resurrected")


async def test_fail_closed_in_tool_post_cannot_be_undone_by_a_later_replacement(tmp_path: Path) -> None:
    counting = Counting()
    async with ToolHost(plugins=[ToolsPlugin(Sleeps()), Resurrects(), Explodes("tool_post"), counting],
                        builtins=False, entry_points=False, working_dir=tmp_path, discover=False) as host:
        result = await host.call("sleeps", {"seconds": 0}, call_id="f1")
    assert not result.success and result.output is None
    assert result.error["code"] == "hook_failed" and result.error["plugin"] == "explodes"
    actions = [(d["plugin"], d["action"]) for d in result.metadata["trail"]]
    assert ("resurrects", "replace_ignored") in actions
    counting.assert_once("f1")


async def test_fail_closed_tool_complete_the_audit_records_what_the_caller_got(tmp_path: Path) -> None:
    async with ToolHost(config={"plugins": {}},
                        plugins=[ToolsPlugin(Sleeps()), Explodes("tool_complete")], builtins=["audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        result = await host.call("sleeps", {"seconds": 0}, call_id="o1")
        record = audit_record(host, "o1")
    assert not result.success and result.output is None
    assert record["status"] == "error"
    assert record["error"]["code"] == result.error["code"] == "hook_failed"
    assert record["error"]["plugin"] == "explodes"


@pytest.mark.parametrize("hook", ["tool_pre", "tool_post", "tool_error", "tool_complete"])
@pytest.mark.parametrize("fault", ["raises", "hangs"])
async def test_a_failing_hook_in_any_position_still_ends_the_call_once(
    tmp_path: Path, hook: str, fault: str
) -> None:
    class Faulty:
        name = "faulty"

        async def _fault(self) -> None:
            if fault == "raises":
                raise RuntimeError(f"boom in {hook}")
            await asyncio.sleep(30)

        @hookimpl
        async def tool_pre(self, call: Any) -> None:
            if hook == "tool_pre":
                await self._fault()

        @hookimpl
        async def tool_post(self, call: Any) -> None:
            if hook == "tool_post":
                await self._fault()

        @hookimpl
        async def tool_error(self, call: Any) -> None:
            if hook == "tool_error":
                await self._fault()

        @hookimpl
        async def tool_complete(self, call: Any) -> None:
            if hook == "tool_complete":
                await self._fault()

    counting = Counting()
    config = {"plugins": {"faulty": {"hook_timeout_ms": 50}}}
    arguments = {"seconds": 0} if hook != "tool_error" else {}  # tool_error needs a failing call
    async with ToolHost(config=config, plugins=[ToolsPlugin(Sleeps()), Faulty(), counting],
                        builtins=["audit"], entry_points=False, working_dir=tmp_path, discover=False) as host:
        result = await host.call("sleeps", arguments, call_id="h1")
        assert audit_records(host) == Counter({"h1": 1})
        record = audit_record(host, "h1")
    counting.assert_once("h1")
    assert not result.success
    assert record["status"] == "error"
    if hook != "tool_error":  # a failing tool_error hook leaves the original error standing
        assert result.error["plugin"] == "faulty"
        assert result.error["code"] == ("hook_failed" if fault == "raises" else "hook_timeout")
        assert record["error"]["code"] == result.error["code"]


# -- hostile input and misspelled hooks -------------------------------------------------------


async def test_deeply_nested_arguments_are_the_callers_contract_error(host_factory: Any) -> None:
    host = await host_factory(ToolsPlugin(Sleeps()))
    nested: Any = []
    for _ in range(5000):
        nested = [nested]
    result = await host.call("sleeps", {"seconds": 0, "extra": nested})
    assert result.error["type"] == "ContractError" and result.error["code"] == "invalid_json"
    assert "deeper than" in result.error["message"]
    assert result.error["pointer"].startswith("/extra/0/0")


async def test_huge_integer_argument_is_the_callers_contract_error(host_factory: Any) -> None:
    host = await host_factory(ToolsPlugin(Sleeps()))
    result = await host.call("sleeps", {"seconds": 10**4400})
    assert result.error["type"] == "ContractError" and result.error["pointer"] == "/seconds"


@pytest.mark.parametrize("key,value", [
    ("default_timeout_ms", float("nan")), ("hook_timeout_ms", float("inf")),
    ("tools.sleeps.policies.rate_limit.interval_ms", float("nan")),
    ("tools.sleeps.policies.circuit_breaker.cooldown_ms", float("nan")),
    ("tools.sleeps.policies.timeout_ms", float("nan")),
])
async def test_nan_and_infinity_in_config_are_refused_naming_the_key(
    tmp_path: Path, key: str, value: float
) -> None:
    from amplifier_tools.errors import ConfigError

    text_value = "nan" if value != value else "inf"
    *table, leaf = key.split(".")
    if table:
        head = ".".join(f'"{p}"' if p == "sleeps" else p for p in table)
        body = f"[{head}]\n{leaf} = {text_value}\n"
        if "rate_limit" in key:
            body += "limit = 3\n"
    else:
        body = f"{leaf} = {text_value}\n"
    config = tmp_path / "amplifier-tools.toml"
    config.write_text(body)
    with pytest.raises(ConfigError) as caught:
        ToolHost(config=config, plugins=[ToolsPlugin(Sleeps())], builtins=False, entry_points=False,
                 working_dir=tmp_path)
    assert key in str(caught.value) and str(config) in str(caught.value)


async def test_misspelled_hook_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    class Typo:
        name = "typo-policy"

        @hookimpl
        def tool_pree(self, call: Any) -> None:
            raise AssertionError("never called")

    with pytest.raises(PluginLoadError) as caught:
        async with ToolHost(plugins=[Typo()], builtins=False, entry_points=False, working_dir=tmp_path,
                            discover=False):
            pass
    assert "typo-policy" in str(caught.value) and "'tool_pree'" in str(caught.value)
    assert "did you mean 'tool_pre'" in str(caught.value)


async def test_hook_wrapper_on_mount_is_refused(tmp_path: Path) -> None:
    class Wraps:
        name = "wraps"

        @hookimpl(wrapper=True)
        def mount(self, coordinator: Any, config: Any) -> Any:
            return (yield)

    with pytest.raises(PluginLoadError, match="wraps.*mount as a hook wrapper"):
        async with ToolHost(plugins=[Wraps()], builtins=False, entry_points=False, working_dir=tmp_path,
                            discover=False):
            pass


# -- policy waits are not hook timeouts -------------------------------------------------------


class WaitsByPolicy:
    """Waits in tool_pre (as a queue would) and bounds the wait itself."""

    name = "waits"
    hook_timeout_ms = None

    @hookimpl
    async def tool_pre(self, call: Any) -> None:
        await asyncio.sleep(0.3)


async def test_a_plugin_declaring_no_hook_timeout_may_wait_longer_than_the_host_default(tmp_path: Path) -> None:
    async with ToolHost(config={"hook_timeout_ms": 50}, plugins=[ToolsPlugin(Sleeps()), WaitsByPolicy()],
                        builtins=False, entry_points=False, working_dir=tmp_path, discover=False) as host:
        result = await host.call("sleeps", {"seconds": 0})
    assert result.success, result.error


async def test_the_plugins_config_section_still_overrides_its_declared_hook_timeout(tmp_path: Path) -> None:
    config = {"plugins": {"waits": {"hook_timeout_ms": 50}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Sleeps()), WaitsByPolicy()],
                        builtins=False, entry_points=False, working_dir=tmp_path, discover=False) as host:
        result = await host.call("sleeps", {"seconds": 0})
    assert result.error["code"] == "hook_timeout" and result.error["plugin"] == "waits"


async def test_two_calls_sharing_a_call_id_never_release_each_others_slot(setup: Any) -> None:
    """A caller-chosen call id is not unique: the first call finishing must not free the second's slot."""
    host, _, sleeps = setup
    first = asyncio.ensure_future(host.call("sleeps", {"seconds": 0.2}, call_id="same"))
    await sleeps.running.wait()
    second = asyncio.ensure_future(host.call("sleeps", {"seconds": 0.2}, call_id="same"))
    await asyncio.sleep(0.05)
    assert held_resources(host)["slot_waiters"] == 1
    assert (await first).success
    third = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="other"))
    await asyncio.sleep(0.05)
    assert sleeps.started == 2  # the second holds the only slot; the third still waits for it
    assert (await second).success and (await third).success


# -- found by attack after the first round ---------------------------------------------------


class SlowToolError:
    """An async tool_error observer (every Amplifier tool:error handler is async)."""

    name = "slow-tool-error"

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    @hookimpl
    async def tool_error(self, call: Any) -> None:
        self.entered.set()
        await asyncio.sleep(0.3)


async def test_cancel_while_the_tool_error_chain_runs_still_records_and_releases(tmp_path: Path) -> None:
    counting, slow = Counting(), SlowToolError()
    config = {"tools": {"raises_cancelled": {"policies": {"concurrency": {"limit": 1}}}}}

    class Fails:
        name = "fails"
        description = "Always fails."

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(False, "partial", {"message": "backend down"})

    config = {"tools": {"fails": {"policies": {"concurrency": {"limit": 1, "queue": True}}}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Fails()), counting, slow], builtins=["policy", "audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call("fails", {}, call_id="e1"))
        await slow.entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert counting.assert_once("e1").error["message"] == "backend down"  # the chain ran to its end
        assert audit_records(host)["e1"] == 1
        assert not any(held_resources(host).values())
        again = await asyncio.wait_for(host.call("fails", {}, call_id="e2"), 20)
        assert again.error["message"] == "backend down"  # the slot came back


@pytest.mark.parametrize("hook", ["tool_pre", "tool_complete"])
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_hook_raising_cancelled_error_itself_is_a_plugin_failure(tmp_path: Path, hook: str, kind: str) -> None:
    """Nobody cancelled the call: the caller gets a result, never CancelledError, and it is recorded."""
    if kind == "async" and sys.version_info < (3, 11):
        pytest.skip("3.10 cannot tell a task's own CancelledError from a cancellation (no Task.cancelling)")

    class RaisesCancelled:
        name = "raises-cancelled"

    def sync_impl(call: Any) -> None:
        raise asyncio.CancelledError

    async def async_impl(call: Any) -> None:
        await asyncio.sleep(0)
        raise asyncio.CancelledError

    setattr(RaisesCancelled, hook, staticmethod(hookimpl(tryfirst=True)(sync_impl if kind == "sync" else async_impl)))
    counting = Counting()
    async with ToolHost(plugins=[ToolsPlugin(Sleeps()), counting, RaisesCancelled()], builtins=["policy", "audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        result = await host.call("sleeps", {"seconds": 0}, call_id="rc")
        assert audit_records(host)["rc"] == 1
    assert result.error["code"] == "hook_failed" and result.error["plugin"] == "raises-cancelled"
    counting.assert_once("rc")


class Hostile:
    """An object whose str() and repr() raise."""

    def __repr__(self) -> str:
        raise RuntimeError("repr boom")

    def __str__(self) -> str:
        raise RuntimeError("str boom")


@pytest.mark.parametrize("output", [Hostile(), {Hostile(): 1}, [1, {"k": Hostile()}]])
async def test_outputs_whose_str_raises_are_still_recorded(tmp_path: Path, output: Any) -> None:
    class Returns:
        name = "returns"
        description = "Returns a hostile value."

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(True, output)

    async with ToolHost(plugins=[ToolsPlugin(Returns())], builtins=["audit"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        await host.call("returns", {}, call_id="hv")
        assert audit_records(host) == Counter({"hv": 1})
        assert audit_record(host, "hv")["altered"]


# -- a tool_complete observer that hands back a future (the audit's fsync wait) ---------------


class FutureObserver:
    """Hands back a future from ``tool_complete`` and settles it as the test says."""

    name = "futures"

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[None]] = []

    @hookimpl
    def tool_complete(self, call: Any) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future


class Last:
    """A later observer: it must run whatever the future observer's future does."""

    name = "last"

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def tool_complete(self, call: Any) -> None:
        self.seen.append(call.id)


async def test_a_future_from_tool_complete_is_waited_for_to_its_end_despite_a_cancellation(tmp_path: Path) -> None:
    futures, last = FutureObserver(), Last()
    async with ToolHost(plugins=[ToolsPlugin(Sleeps()), futures, last], builtins=["audit"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        call = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="f1"))
        while not futures.futures:
            await asyncio.sleep(0.001)
        call.cancel()  # while the call waits for the observer's future
        await asyncio.sleep(0.05)
        # Still waiting: the cancellation does not cut it short, and the audit (the last observer) waits too.
        assert not call.done() and audit_records(host) == Counter()
        futures.futures[0].set_result(None)
        with pytest.raises(asyncio.CancelledError):
            await call
        assert last.seen == ["f1"]  # every observer ran, then the cancellation was raised
        assert audit_records(host) == Counter({"f1": 1})


@pytest.mark.parametrize("outcome", ["raises", "hangs", "cancelled"])
async def test_a_future_from_tool_complete_that_fails_is_the_plugins_failure(tmp_path: Path, outcome: str) -> None:
    futures, last = FutureObserver(), Last()
    config = {"plugins": {"futures": {"hook_timeout_ms": 100}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Sleeps()), futures, last], builtins=["audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        call = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="f2"))
        while not futures.futures:
            await asyncio.sleep(0.001)
        if outcome == "raises":
            futures.futures[0].set_exception(RuntimeError("the backend is gone"))
        elif outcome == "cancelled":
            futures.futures[0].cancel()
        result = await asyncio.wait_for(call, 10)
        record = audit_record(host, "f2")
    assert not result.success and result.error["plugin"] == "futures"
    assert result.error["code"] == ("hook_timeout" if outcome == "hangs" else "hook_failed")
    assert last.seen == ["f2"] and record["error"]["code"] == result.error["code"]


class SlowComplete:
    """An async ``tool_complete`` observer that takes ``seconds``, then optionally fails."""

    name = "slow_complete"

    def __init__(self, seconds: float, fails: bool = False) -> None:
        self.seconds = seconds
        self.fails = fails

    @hookimpl
    async def tool_complete(self, call: Any) -> None:
        await asyncio.sleep(self.seconds)
        if self.fails:
            raise RuntimeError("observer bug")


def _closing_host(tmp_path: Path, *plugins: Any, tools: Any = (), **config: Any) -> ToolHost:
    settings = {"plugins": {"audit": {"fsync": "never"}}, **config}
    return ToolHost(config=settings, plugins=[ToolsPlugin(*tools), *plugins], builtins=["audit"],
                    entry_points=False, working_dir=tmp_path, discover=False)


async def test_a_call_cut_by_close_while_observed_returns_its_result_not_cancelled_error(tmp_path: Path) -> None:
    """Found by attack: a successful call still in a slow async ``tool_complete`` observer when
    ``close()``'s grace ran out raised ``CancelledError`` to a caller who never cancelled."""
    counting, sleeps = Counting(), Sleeps()
    host = _closing_host(tmp_path, SlowComplete(0.5), counting, tools=[sleeps], shutdown_grace_ms=100)
    await host.start()
    call = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="k1"))
    await asyncio.sleep(0.05)  # in the observer now
    await host.close()
    result = await call
    assert result.success, result.error  # what was recorded: the call had ended
    counting.assert_once("k1")
    assert audit_records(host) == Counter({"k1": 1})


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a task counts its cancellation requests from 3.11")
async def test_a_callers_cancellation_stands_when_close_cuts_the_call_too(tmp_path: Path) -> None:
    """Found by attack: the caller cancelled, and while the cancelled call was being recorded
    ``close()`` cut it as well; the caller got the cut's result, its own cancellation dropped."""
    counting, sleeps = Counting(), Sleeps()
    host = _closing_host(tmp_path, SlowComplete(0.5), counting, tools=[sleeps], shutdown_grace_ms=100)
    await host.start()
    call = asyncio.ensure_future(host.call("sleeps", {"seconds": 10}, call_id="k1"))
    await sleeps.running.wait()
    call.cancel()
    await asyncio.sleep(0.01)
    await host.close()
    with pytest.raises(asyncio.CancelledError):
        await call
    counting.assert_once("k1")
    assert audit_records(host) == Counter({"k1": 1})


@pytest.mark.parametrize("failure", ["timeout", "raises"])
async def test_a_cancellation_is_not_lost_when_the_observer_awaited_then_fails(tmp_path: Path, failure: str) -> None:
    """Found by attack: a cancellation that arrived while an async ``tool_complete`` observer was
    awaited was dropped when that observer then timed out or raised (fail-open): the cancelled
    caller got a result. It is honoured once the chain has ended."""
    counting, sleeps = Counting(), Sleeps()
    observer = SlowComplete(0.3, fails=failure == "raises")
    host = _closing_host(tmp_path, observer, counting, tools=[sleeps], plugins={
        "audit": {"fsync": "never"},
        "slow_complete": {"hook_timeout_ms": 200 if failure == "timeout" else 5000, "on_error": "ignore"}})
    await host.start()
    try:
        call = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="k1"))
        await asyncio.sleep(0.1)  # in the observer now
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        counting.assert_once("k1")
        assert audit_records(host) == Counter({"k1": 1})
    finally:
        await host.close()


async def test_two_concurrent_closes_both_return_once_the_host_is_idle(tmp_path: Path) -> None:
    """Found by attack: each ``close()`` waiting for the calls in flight made the pipeline's idle
    event anew, so the first waited on one nobody set, until its hook timeout (3 s here for a
    call done in 0.2 s)."""
    sleeps = Sleeps()
    host = _closing_host(tmp_path, tools=[sleeps], shutdown_grace_ms=3000)
    await host.start()
    call = asyncio.ensure_future(host.call("sleeps", {"seconds": 0.2}))
    await sleeps.running.wait()
    loop = asyncio.get_running_loop()
    started = loop.time()
    first = asyncio.ensure_future(host.close())
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(host.close())
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert (await call).success
    assert loop.time() - started < 2.0  # both ended with the call (≈ 0.2 s), not at the grace (3 s)


async def test_a_call_cut_by_two_closes_is_cancelled_once_and_returns_host_closing(tmp_path: Path) -> None:
    """A second ``close()`` after the grace cut the call again: two cancellation requests, and the
    second would read as the caller's own (``_after_cancel`` counts them from Python 3.11)."""

    class Stubborn:
        name = "stubborn"
        description = "Cleans up for 0.3 s when cancelled."

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                await asyncio.sleep(0.3)
                raise
            return ToolResult(True, "slept")

    counting = Counting()
    host = _closing_host(tmp_path, counting, tools=[Stubborn()], shutdown_grace_ms=200)
    await host.start()
    call = asyncio.ensure_future(host.call("stubborn", {}, call_id="k1"))
    await asyncio.sleep(0.01)
    first = asyncio.ensure_future(host.close())
    await asyncio.sleep(0.25)  # past the grace: the call is cut and cleaning up
    await asyncio.gather(first, host.close())
    result = await call
    assert result.error is not None and result.error["code"] == "host_closing"
    counting.assert_once("k1")
    assert audit_records(host) == Counter({"k1": 1})


class Swallows:
    """Catches the cancellation of its sleep, then returns (or raises, or sleeps on)."""

    name = "swallows"
    description = "Sleeps; when cancelled, carries on."
    input_schema = {"type": "object", "properties": {"then": {"type": "string"}}}

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.caught = 0

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.running.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            self.caught += 1
            if input.get("then") == "raise":
                raise RuntimeError("interrupted") from None
        return ToolResult(True, "done anyway")


async def cancelled_once_running(host: ToolHost, started: asyncio.Event, name: str, arguments: dict[str, Any],
                                 call_id: str) -> None:
    """Call ``name``, cancel the call once ``started`` is set, and expect ``CancelledError``."""
    call = asyncio.ensure_future(host.call(name, arguments, call_id=call_id))
    await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


swallowing = pytest.mark.skipif(sys.version_info < (3, 12, 3),
                                reason="counted reliably from CPython 3.12.3 (gh-116720: TaskGroup left a request)")


@swallowing
@pytest.mark.parametrize("then", ["return", "raise"])
async def test_a_cancellation_the_tool_swallowed_is_recorded_and_reraised(tmp_path: Path, then: str) -> None:
    """Found by attack: a tool that caught ``CancelledError`` and returned turned the cancelled
    call into a success (or into its own failure), and the caller's cancellation was lost."""
    counting, tool = Counting(), Swallows()
    host = _closing_host(tmp_path, counting, tools=[tool])
    await host.start()
    try:
        await cancelled_once_running(host, tool.running, "swallows", {"then": then}, "s1")
        assert tool.caught == 1
        result = counting.assert_once("s1")
        assert result.error is not None and result.error["code"] == "cancelled"
        assert audit_records(host) == Counter({"s1": 1})
        trail = [entry["action"] for entry in audit_record(host, "s1")["trail"]]
        assert "cancel_swallowed" in trail
    finally:
        await host.close()


@swallowing
async def test_the_callers_timeout_fires_when_the_tool_swallows_its_cancellation(tmp_path: Path) -> None:
    """The caller's ``asyncio.timeout`` cancels the call; the tool catches that and returns: the
    caller gets ``TimeoutError`` (before: the tool's success, the timeout never fired), and its
    task holds no cancellation request afterwards."""
    counting, tool = Counting(), Swallows()
    host = _closing_host(tmp_path, counting, tools=[tool])
    await host.start()
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await host.call("swallows", {}, call_id="s1")
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0
        assert counting.assert_once("s1").error["code"] == "cancelled"
        assert (await host.call("swallows.missing", {})).error["code"] == "unknown_tool"  # the task goes on
    finally:
        await host.close()


@swallowing
async def test_a_cut_by_close_the_tool_swallowed_returns_host_closing(tmp_path: Path) -> None:
    """``close()`` cuts the call after its grace; the tool catches that and returns. The caller,
    who never cancelled, gets ``host_closing`` (what was recorded) and its task is left with no
    cancellation request (before: the tool's success, and the cut's request left on the task)."""
    counting, tool = Counting(), Swallows()
    host = _closing_host(tmp_path, counting, tools=[tool], shutdown_grace_ms=100)
    await host.start()
    outcome: dict[str, Any] = {}

    async def caller() -> None:
        outcome["result"] = await host.call("swallows", {}, call_id="s1")
        current = asyncio.current_task()
        outcome["requests"] = current.cancelling() if current is not None else None

    call = asyncio.ensure_future(caller())
    await tool.running.wait()
    await host.close()
    await call
    assert outcome["result"].error["code"] == "host_closing"
    assert outcome["requests"] == 0
    counting.assert_once("s1")
    assert audit_records(host) == Counter({"s1": 1})


@swallowing
async def test_a_call_made_while_the_task_is_already_being_cancelled_is_not_taken_for_cancelled(
        tmp_path: Path) -> None:
    """Cleanup code in an ``except CancelledError`` block may still call a tool: the request that
    was pending before the call began is not the call's cancellation."""
    counting, sleeps = Counting(), Sleeps()
    host = _closing_host(tmp_path, counting, tools=[sleeps])
    await host.start()
    outcome: dict[str, Any] = {}

    async def worker() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            outcome["result"] = await host.call("sleeps", {"seconds": 0.01}, call_id="c1")
            raise

    try:
        task = asyncio.ensure_future(worker())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert outcome["result"].success, outcome["result"].error
        counting.assert_once("c1")
    finally:
        await host.close()


@swallowing
async def test_a_tool_pre_hook_that_swallowed_the_cancellation_does_not_start_the_tool(tmp_path: Path) -> None:
    """An async ``tool_pre`` hook catches the cancellation of its wait and returns None: the tool
    is not started for a call its caller cancelled."""
    entered = asyncio.Event()

    class Stubborn:
        name = "stubborn_pre"

        @hookimpl
        async def tool_pre(self, call: Any) -> None:
            entered.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                pass

    counting, sleeps = Counting(), Sleeps()
    host = _closing_host(tmp_path, Stubborn(), counting, tools=[sleeps])
    await host.start()
    try:
        await cancelled_once_running(host, entered, "sleeps", {"seconds": 0}, "p1")
        assert sleeps.started == 0
        assert counting.assert_once("p1").error["code"] == "cancelled"
        assert audit_records(host) == Counter({"p1": 1})
    finally:
        await host.close()


@swallowing
@pytest.mark.parametrize("then", ["raise", "return"])
async def test_a_retried_tool_that_swallowed_the_cancellation_is_not_retried(tmp_path: Path, then: str) -> None:
    """A retry-safe tool catches the cancellation and fails with a retryable error: the call ends
    as cancelled, with no further attempt."""

    class Flaky:
        name = "flaky"
        description = "Sleeps; when cancelled, fails retryably."
        effect = "Pure"

        def __init__(self) -> None:
            self.attempts = 0
            self.running = asyncio.Event()

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            self.attempts += 1
            self.running.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if input.get("then") == "return":  # found by attack: a returned failure was retried
                    return ToolResult(False, None, {"type": "ExecutionError", "code": "reset",
                                                    "message": "connection reset", "retryable": True})
                raise ConnectionError("connection reset") from None
            return ToolResult(True, "ok")

    counting, tool = Counting(), Flaky()
    host = ToolHost(
        config={"plugins": {"audit": {"fsync": "never"}},
                "tools": {"flaky": {"policies": {"retry": {"max_attempts": 3, "initial_backoff_ms": 1}}}}},
        plugins=[ToolsPlugin(tool), counting], builtins=["audit"], entry_points=False, working_dir=tmp_path,
        discover=False)
    await host.start()
    try:
        await cancelled_once_running(host, tool.running, "flaky", {"then": then}, "f1")
        assert tool.attempts == 1
        assert counting.assert_once("f1").error["code"] == "cancelled"
    finally:
        await host.close()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 runs a tool under a timeout in a task of its own")
async def test_close_awaited_from_inside_a_call_is_refused_and_the_call_is_recorded(tmp_path: Path) -> None:
    """Found by attack: a tool awaiting ``host.close()`` waited for its own call through the grace
    and the hook timeout, then the cleanups closed the audit log before the call was recorded.
    It is refused at once; ``ensure_future(host.close())`` closes the host after the call."""
    holder: dict[str, Any] = {}

    class Closes:
        name = "closes"
        description = "Closes its own host."

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            host = holder["host"]
            try:
                await host.close()
            except Exception as exc:  # what the tool saw is the assertion
                holder["error"] = exc
            holder["later"] = asyncio.ensure_future(host.close())
            return ToolResult(True, "closing")

    counting = Counting()
    host = holder["host"] = _closing_host(tmp_path, counting, tools=[Closes()], shutdown_grace_ms=2000)
    await host.start()
    audit_path = Path(host.capabilities["audit.path"])
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await asyncio.wait_for(host.call("closes", {}, call_id="x1"), 10)
    assert result.success, result.error
    assert getattr(holder["error"], "code", None) == "close_inside_call"
    await asyncio.wait_for(holder["later"], 10)
    assert loop.time() - started < 1.5
    counting.assert_once("x1")
    records = [json.loads(line) for line in audit_path.read_text().splitlines()]
    assert [r["call_id"] for r in records if r.get("kind") == "call"] == ["x1"]
    assert (await host.call("closes", {})).error["code"] == "host_closing"


async def test_a_tool_handling_its_own_task_groups_failure_is_not_taken_for_cancelled(tmp_path: Path) -> None:
    """Found by attack: CPython's ``TaskGroup`` before 3.12.3 cancels its task when a child fails
    while it waits, and never withdraws the request (gh-116720); that leftover was read as a
    cancellation the tool swallowed, and a caller who never cancelled got ``CancelledError``."""

    class Fanout:
        name = "fanout"
        description = "Fetches two things at once; reports what it got when one fails."

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            async def fails() -> None:
                await asyncio.sleep(0.01)
                raise ConnectionError("backend down")

            try:
                async with asyncio.TaskGroup() as group:  # type: ignore[attr-defined,unused-ignore]
                    group.create_task(fails())
                    group.create_task(asyncio.sleep(1))
            except Exception:  # an ExceptionGroup
                return ToolResult(True, "partial result")
            return ToolResult(True, "full result")

    if sys.version_info < (3, 11):
        pytest.skip("asyncio.TaskGroup is new in 3.11")
    counting = Counting()
    host = _closing_host(tmp_path, counting, tools=[Fanout()])
    await host.start()
    try:
        result = await host.call("fanout", {}, call_id="t1")
        assert result.success and result.output == "partial result", result.error
        counting.assert_once("t1")
    finally:
        await host.close()


class Events:
    """A ``tool_event`` observer, as an Amplifier logging module is: ``(event, call id, error code)``."""

    name = "events"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []

    @hookimpl
    def tool_event(self, event: str, data: dict[str, Any]) -> None:
        error = data.get("error")
        self.seen.append((event, data["tool_call_id"], error.get("code") if isinstance(error, dict) else None))


@pytest.mark.parametrize("where", ["tool", "tool_post"])
async def test_a_cancelled_call_sends_tool_event_observers_its_tool_error_event(tmp_path: Path, where: str) -> None:
    """Found by attack: an observer of events saw ``tool:pre`` of a cancelled call and nothing more
    (neither ``tool:post`` nor ``tool:error``), whether the tool or an async ``tool_post`` hook was
    running when the caller cancelled."""
    entered = asyncio.Event()

    class SlowPost:
        name = "slow-post"

        @hookimpl
        async def tool_post(self) -> None:
            entered.set()
            await asyncio.sleep(0.05)

    events, tool = Events(), Sleeps()
    plugins: list[Any] = [ToolsPlugin(tool), events, *([SlowPost()] if where == "tool_post" else [])]
    async with ToolHost(plugins=plugins, builtins=False, entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        task = asyncio.ensure_future(host.call("sleeps", {"seconds": 30 if where == "tool" else 0}, call_id="c1"))
        if where == "tool":
            await tool.running.wait()
        else:
            await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert events.seen == [("tool:pre", "c1", None), ("tool:error", "c1", "cancelled")]

