"""The call pipeline's outcomes for bad calls, bad tools and hanging tools."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import EchoTool, ToolsPlugin

from amplifier_tools import (
    ContractError,
    ExecutionError,
    ToolCall,
    ToolContext,
    ToolHost,
    ToolResult,
    ToolSpec,
    tool,
)


class ReturnsThis:
    description = "returns a fixed value"
    input_schema = {"type": "object"}

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value

    async def execute(self, input: dict[str, Any]) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


async def test_unknown_tool_is_contract_error_with_suggestion(host_factory: Any, echo: EchoTool) -> None:
    host = await host_factory(ToolsPlugin(echo))
    result = await host.call("ecko", {"path": "a"})
    assert result.error["type"] == "ContractError"
    assert result.error["code"] == "unknown_tool"
    assert "'ecko'" in result.error["message"] and "did you mean 'echo'" in result.error["message"]


@pytest.mark.parametrize(
    ("arguments", "code", "fragment"),
    [
        (["path"], "invalid_input", "must be a JSON object, got list"),
        ("path=a", "invalid_input", "got str"),
        ({"path": b"bytes"}, "invalid_json", "/path: a bytes is not JSON data"),
        ({"path": "a", "times": float("nan")}, "invalid_json", "/times: nan is not a JSON number"),
        ({"path": "a", 3: "x"}, "invalid_json", "key 3 is not a string"),
        ({"path": {1, 2}}, "invalid_json", "/path: a set is not JSON data"),
        ({"times": 2}, "invalid_input", "/path: is a required property"),
        ({"path": "a", "extra": 1}, "invalid_input", "/extra: is not an allowed property"),
        ({"path": "a", "times": 0}, "invalid_input", "/times: 0 is less than the minimum of 1"),
    ],
)
async def test_bad_arguments_are_contract_errors_naming_the_field(
    host_factory: Any, echo: EchoTool, arguments: Any, code: str, fragment: str
) -> None:
    host = await host_factory(ToolsPlugin(echo))
    result = await host.call("echo", arguments)
    assert result.error["type"] == "ContractError"
    assert result.error["code"] == code
    assert fragment in result.error["message"]
    assert echo.calls == []


@pytest.mark.parametrize(
    ("value", "success", "output", "error_fragment"),
    [
        (ToolResult(output="fine"), True, "fine", None),
        (ToolResult(True, "fine", {"message": "stray"}, {"tool's": "own"}, "tool's id"), True, "fine", None),
        ({"success": True, "output": "seed dict"}, True, "seed dict", None),
        ({"output": "seed 003 shape", "is_error": False, "tool_call_id": "x"}, True, "seed 003 shape", None),
        ({"success": False, "error": "plain string error"}, False, None, "plain string error"),
        ({"success": False, "error": {"message": "nope", "type": "PermissionError"}}, False, None, "nope"),
        ("just a string", False, None, "returned str, not a ToolResult"),
        ({"result": 1}, False, None, "unknown keys ['result']"),
        (None, False, None, "returned NoneType"),
        ({"success": "yes", "output": 1}, False, None, "'success' is str, not bool"),
    ],
)
async def test_tool_results_are_normalized_or_rejected(
    host_factory: Any, value: Any, success: bool, output: Any, error_fragment: str | None
) -> None:
    host = await host_factory(ToolsPlugin(ReturnsThis("t", value)))
    result = await host.call("t", {})
    assert result.success is success
    assert result.tool_call_id is not None and result.tool_call_id != "tool's id"
    if success:
        assert result.output == output
        assert result.error is None  # a success carries no error, even when the tool's result had one
    else:
        assert error_fragment in result.error["message"]


async def test_seed_permission_error_maps_to_auth_error(host_factory: Any) -> None:
    tool = ReturnsThis("t", {"success": False, "error": {"message": "Path not allowed", "type": "PermissionError"}})
    host = await host_factory(ToolsPlugin(tool))
    result = await host.call("t", {})
    assert result.error["type"] == "AuthError"
    assert result.error["cause"] == "PermissionError"


async def test_foreign_result_object_is_normalized(host_factory: Any) -> None:
    class ForeignResult:  # e.g. a pydantic model from another framework
        def __init__(self) -> None:
            self.success = False
            self.output = "partial"
            self.error = {"message": "remote 503", "type": "ExecutionError", "retryable": True}

    host = await host_factory(ToolsPlugin(ReturnsThis("t", ForeignResult())))
    result = await host.call("t", {})
    assert result.error["type"] == "ExecutionError"
    assert result.error["retryable"] is True
    assert result.output == "partial"


@pytest.mark.parametrize(
    ("exc", "category", "code", "retryable"),
    [
        (KeyError("k"), "ExecutionError", "tool_raised", False),
        (ConnectionError("reset"), "ExecutionError", "tool_raised", True),
        (ContractError("bad version", code="unsupported_version"), "ContractError", "unsupported_version", False),
        (ExecutionError("upstream 500", code="upstream", retryable=True), "ExecutionError", "upstream", True),
    ],
)
async def test_tool_exceptions_become_typed_errors(
    host_factory: Any, exc: BaseException, category: str, code: str, retryable: bool
) -> None:
    host = await host_factory(ToolsPlugin(ReturnsThis("t", exc)))
    result = await host.call("t", {})
    assert result.error["type"] == category
    assert result.error["code"] == code
    assert result.error["retryable"] is retryable


async def test_hanging_tool_times_out_and_host_stays_usable(host_factory: Any, echo: EchoTool) -> None:
    class Hangs:
        name = "hangs"
        description = "never returns"
        spec = ToolSpec(name="hangs", effect="Pure", policies={"timeout_ms": 50})  # type: ignore[arg-type]
        cancelled = False

        async def execute(self, input: dict[str, Any]) -> Any:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                Hangs.cancelled = True
                raise

    host = await host_factory(ToolsPlugin(echo, Hangs()))
    started = time.monotonic()
    result = await host.call("hangs", {})
    assert time.monotonic() - started < 30  # the tool sleeps 60 s: it was cut off, not awaited
    assert result.error["type"] == "PolicyError" and result.error["code"] == "timeout"
    assert result.error["retryable"] is True  # Pure tools may be retried
    assert Hangs.cancelled
    assert (await host.call("echo", {"path": "still fine"})).output == "still fine"


async def test_context_deadline_bounds_the_call(host_factory: Any) -> None:
    class Slow(ReturnsThis):
        async def execute(self, input: dict[str, Any]) -> Any:
            await asyncio.sleep(5)

    host = await host_factory(ToolsPlugin(Slow("slow", None)))
    result = await host.call("slow", {}, context=ToolContext().with_timeout(0.05))
    assert result.error["code"] == "timeout"
    expired = await host.call("slow", {}, context=ToolContext(deadline=time.monotonic() - 1))
    assert expired.error["code"] == "deadline_exceeded"


async def test_secret_values_never_reach_the_caller(host_factory: Any) -> None:
    canary = "canary-7f3a9c1e-secret"

    class UsesSecret:
        name = "uses_secret"
        description = "echoes its token (badly)"
        spec = ToolSpec(name="uses_secret", security={"secret_refs": ["API_TOKEN"]})  # type: ignore[arg-type]

        async def execute(self, input: dict[str, Any], context: ToolContext) -> Any:
            token = context.secret("API_TOKEN")
            if input.get("fail"):
                raise RuntimeError(f"auth failed with token {token}")
            return {"success": True, "output": {"echo": f"token={token}", "nested": [token]}}

    host = await host_factory(ToolsPlugin(UsesSecret()))
    ctx = ToolContext(secrets={"API_TOKEN": canary})
    ok = await host.call("uses_secret", {}, context=ctx)
    failed = await host.call("uses_secret", {"fail": True}, context=ctx)
    assert ok.success
    assert canary not in repr(ok) and canary not in repr(failed)
    assert ok.output == {"echo": "token=[REDACTED]", "nested": ["[REDACTED]"]}
    missing = await host.call("uses_secret", {}, context=ToolContext())
    assert missing.error["type"] == "AuthError" and missing.error["code"] == "missing_secret"
    assert "API_TOKEN" in missing.error["message"]


@pytest.mark.parametrize(("secrets", "reason", "hint"), [
    (None, "could not be resolved: the context has no secrets", "configure [secrets]"),
    ({"other": "AMP_TEST_OTHER"}, "is not a key of the host's [secrets] ([secrets] keys: 'other')",
     '[secrets] my_ref = "MY_VARIABLE"'),
    ({"API_TOKEN": "AMP_TEST_UNSET_TOKEN"},
     "names, in [secrets], the environment variable 'AMP_TEST_UNSET_TOKEN', which is not set",
     "set AMP_TEST_UNSET_TOKEN in the environment"),
])
async def test_a_missing_secret_says_which_setting_to_fix(host_factory: Any, monkeypatch: pytest.MonkeyPatch,
                                                          secrets: dict[str, str] | None, reason: str,
                                                          hint: str) -> None:
    """The reference missing from [secrets], or the variable it names not set: the error says which."""
    monkeypatch.delenv("AMP_TEST_UNSET_TOKEN", raising=False)

    @tool(name="needs", effect="Pure", security={"secret_refs": ["API_TOKEN"]})
    def needs() -> str:
        """Needs a token."""
        return "ran"

    host = await host_factory(ToolsPlugin(needs), config={} if secrets is None else {"secrets": secrets})
    missing = await host.call("needs", {})
    assert missing.error["code"] == "missing_secret"
    assert missing.error["message"] == f"secret 'API_TOKEN' {reason}"
    assert hint in missing.error["hint"]


async def test_call_before_start_returns_error_instead_of_raising() -> None:
    from amplifier_tools import ToolHost

    host = ToolHost(builtins=False, entry_points=False)
    assert not host.started
    result = await host.call("anything", {})
    assert result.error["code"] == "host_not_started"
    async with host:
        assert host.started
    assert not host.started  # closed


async def test_wrong_call_or_context_types_are_errors_not_crashes(host_factory: Any, echo: EchoTool) -> None:
    host = await host_factory(ToolsPlugin(echo))
    bad_context = await host.call("echo", {"path": "x"}, context={"principal": "me"})  # type: ignore[arg-type]
    assert bad_context.error["code"] == "invalid_context" and "got dict" in bad_context.error["message"]
    bad_call = await host.execute({"name": "echo"})  # type: ignore[arg-type]
    assert bad_call.error["code"] == "invalid_call"
    assert echo.calls == []


async def test_execute_takes_a_tool_call_and_keeps_its_id(host_factory: Any, echo: EchoTool) -> None:
    host = await host_factory(ToolsPlugin(echo))
    result = await host.execute(ToolCall("call-42", "echo", {"path": "x"}))
    assert result.tool_call_id == "call-42"
    assert result.metadata["duration_ms"] >= 0


async def test_thousand_concurrent_sleeping_calls_overlap(host_factory: Any) -> None:
    class Sleeper:
        name = "sleeper"
        description = "sleeps 50 ms"
        input_schema = {"type": "object", "properties": {"i": {"type": "integer"}}}

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            await asyncio.sleep(0.05)
            return ToolResult(output=input["i"])

    host = await host_factory(ToolsPlugin(Sleeper()))
    started = time.monotonic()
    results = await asyncio.gather(*(host.call("sleeper", {"i": i}) for i in range(1000)))
    elapsed = time.monotonic() - started
    assert [r.output for r in results] == list(range(1000))
    assert len({r.tool_call_id for r in results}) == 1000
    # Run one after another they would take 50 s; the bound only proves they overlap
    # (the speed itself is measured in bench/, not asserted on a shared machine).
    assert elapsed < 25, f"1,000 concurrent 50 ms calls took {elapsed:.2f} s"


@pytest.mark.parametrize("kind", ["missing", "file"])
async def test_a_working_directory_that_is_not_one_stops_the_start(tmp_path: Path, kind: str) -> None:
    """Found by a newcomer's pass: the host started and every path argument then failed, call by call."""
    from amplifier_tools.errors import ConfigError

    where = tmp_path / "nowhere"
    if kind == "file":
        where.write_text("a file\n")
    host = ToolHost(working_dir=where, builtins=False, entry_points=False, discover=False)
    with pytest.raises(ConfigError) as refused:
        await host.start()
    assert refused.value.key == "working_dir" and str(where) in str(refused.value)
    assert ("does not exist" if kind == "missing" else "is not a directory") in str(refused.value)
    assert not host.started



def test_a_refused_call_asks_the_input_schema_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review of e7f70ea (the one-step argument check): before it, a refusal cost one
    ``is_valid`` (then ``iter_errors`` to explain it); the early return's ``is_valid`` was asked
    again by ``check_input``, so a client's refused calls (an expensive ``pattern``, a large array)
    cost one more full validation each."""
    from amplifier_tools import registry, schema
    from amplifier_tools.errors import ContractError

    asked: list[bool] = []
    real = schema.CompiledSchema.is_valid
    monkeypatch.setattr(schema.CompiledSchema, "is_valid", lambda self, value: asked.append(True) or real(self, value))
    spec = ToolSpec(name="t::t", version="1.0.0", description="d", effect="Pure",
                    input_schema={"type": "object", "properties": {"p": {"type": "string", "pattern": "^a+$"}}})
    validator = schema.compile_validator(spec.input_schema, owner=spec.name, which="input_schema")
    mounted = registry.MountedTool(spec, None, "x", "t", validator, None, lambda a: None, False)
    with pytest.raises(ContractError, match="does not match"):
        mounted.check_arguments({"p": "b"})
    assert len(asked) == 1
