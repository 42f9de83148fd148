"""The approval plugin, installed as a distribution and discovered through its entry point."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from amplifier_tools_approval import ApprovalPlugin, parse_config

from amplifier_tools import ConfigError, ToolContext, hookimpl
from amplifier_tools.pytest_plugin import MockTool


class Mount:
    name = "mount-tools"

    def __init__(self, *tools: Any) -> None:
        self.tools = tools

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        for tool in self.tools:
            await coordinator.mount("tools", tool)


def tools() -> tuple[MockTool, MockTool]:
    return (MockTool("local::mail.send", return_value="sent", effect="ExternalSideEffects"),
            MockTool("local::mail.read", return_value="inbox", effect="Pure"))


# Other installed plugins that need config (the http-fetch example) would stop the host:
# these tests are about approval alone, so they say so the way an operator would.
OTHERS = ["http-fetch"]


async def test_discovered_through_its_entry_point_and_enforced(tool_host: Any) -> None:
    send, read = tools()
    config = {"plugins": {"approval": {"approvers": ["alice"]}}, "disable_plugins": OTHERS}
    async with tool_host(Mount(send, read), config=config, entry_points=True) as host:
        info = {p.name: p for p in host.plugins}["approval"]
        assert (info.source, info.distribution) == ("entry_point", "amplifier-tools-approval")
        denied = await host.call("mail_send", {})
        approved = await host.call("mail_send", {}, context=ToolContext(attributes={"approved_by": "alice"}))
        wrong = await host.call("mail_send", {}, context=ToolContext(attributes={"approved_by": "mallory"}))
        pure = await host.call("mail_read", {})
    assert denied.error["code"] == "approval_required" and denied.error["plugin"] == "approval"
    assert approved.output == "sent"
    assert approved.metadata["trail"][0]["reason"] == "approved by alice"
    assert "'mallory' is not allowed" in wrong.error["message"]
    assert pure.output == "inbox"
    assert send.call_count == 1


async def test_each_host_has_its_own_settings(tool_host: Any) -> None:
    ctx = ToolContext(attributes={"approved_by": "bob"})
    async with tool_host(Mount(*tools()), config={"plugins": {"approval": {"approvers": ["alice"]}},
                                                     "disable_plugins": OTHERS},
                         entry_points=True) as strict, \
            tool_host(Mount(*tools()), config={"plugins": {"approval": {"approvers": ["bob"]}},
                                                  "disable_plugins": OTHERS},
                      entry_points=True) as lenient:
        assert (await strict.call("mail_send", {}, context=ctx)).error["code"] == "approval_required"
        assert (await lenient.call("mail_send", {}, context=ctx)).output == "sent"


@pytest.mark.parametrize(
    ("window", "now", "allowed"),
    [("08:00-18:00", "12:00", True), ("08:00-18:00", "19:30", False), ("22:00-06:00", "23:15", True),
     ("22:00-06:00", "12:00", False)],
)
def test_time_window(window: str, now: str, allowed: bool) -> None:
    policy = parse_config({"approvers": ["a"], "window": window})
    hour, minute = map(int, now.split(":"))
    policy.now = lambda: dt.datetime(2026, 1, 1, hour, minute, tzinfo=dt.timezone.utc)
    send, _ = tools()
    decision = policy.decide(send.spec, ToolContext(attributes={"approved_by": "a"}))
    assert (decision is None) is allowed
    if not allowed:
        assert decision is not None and decision.code == "outside_window"


@pytest.mark.parametrize(
    ("config", "key"),
    [({}, "plugins.approval.approvers"), ({"approvers": ["a"], "colour": 1}, "plugins.approval.colour"),
     ({"approvers": ["a"], "effects": ["Loud"]}, "plugins.approval.effects"),
     ({"approvers": ["a"], "window": "8-18"}, "plugins.approval.window")],
)
def test_bad_config_names_the_key(config: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(config)


async def test_unconfigured_plugin_fails_host_start(tool_host: Any) -> None:
    from amplifier_tools import PluginLoadError

    with pytest.raises(PluginLoadError, match="approval.*approvers"):
        async with tool_host(Mount(*tools()), entry_points=True,
                             config={"plugins": {"approval": {}}, "disable_plugins": OTHERS}):
            pass


def test_plugin_class_is_the_entry_point_target() -> None:
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="amplifier_tools") if ep.name == "approval"]
    assert ep.load() is ApprovalPlugin


class Exploding(dict):  # type: ignore[type-arg]
    """Attributes whose reading fails (an embedding's lazy mapping, say)."""

    def get(self, *args: Any) -> Any:
        raise RuntimeError("attribute store down")


@pytest.mark.parametrize(("attributes", "code"), [({"approved_by": ["alice"]}, "approval_required"),
                                                  (Exploding(), "approval_failed")])
async def test_a_failure_while_deciding_is_a_denial_even_with_on_error_ignore(
        tool_host: Any, attributes: Any, code: str) -> None:
    # Before: approved_by=["alice"] made the hook raise TypeError (unhashable), attributes that
    # fail to read raised too, and with the section's on_error = "ignore" the host let the
    # unapproved call run.
    send, _ = tools()
    config = {"plugins": {"approval": {"approvers": ["alice"], "on_error": "ignore"}}, "disable_plugins": OTHERS}
    async with tool_host(Mount(send), config=config, entry_points=True) as host:
        result = await host.call("mail_send", {}, context=ToolContext(attributes=attributes))
    assert (result.error["type"], result.error["code"]) == ("PolicyError", code)
    assert send.call_count == 0


def test_an_approver_must_be_exactly_a_name() -> None:
    # Before: a str subclass that compares equal to everything passed as "alice".
    class Anyone(str):
        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return hash("alice")

    send, _ = tools()
    decision = parse_config({"approvers": ["alice"]}).decide(
        send.spec, ToolContext(attributes={"approved_by": Anyone("mallory")}))
    assert decision is not None and decision.code == "approval_required"


@pytest.mark.parametrize(
    "config",
    [{"approvers": ["a"], "effects": []},  # before: accepted, and nothing needed approval any more
     {"approvers": ["a"], "effects": {"ExternalSideEffects": True}},  # before: accepted (its keys)
     {"approvers": ["a"], "window": "08:00-08:00"}],  # before: accepted, and nothing could run, ever
)
def test_a_setting_that_would_silently_approve_or_block_everything_is_refused(config: dict[str, Any]) -> None:
    key = "effects" if "effects" in config else "window"
    with pytest.raises(ConfigError, match=rf"plugins\.approval\.{key}"):
        parse_config(config)
