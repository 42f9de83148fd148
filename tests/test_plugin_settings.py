"""One settings path for every built-in plugin: its ``[plugins.<name>]`` table is structured strictly
into the plugin's frozen attrs class, and every problem is one ``ConfigError`` naming the full key.

Config comes from TOML or JSON, so a value of the wrong type is refused, never coerced: ``true``
is not an integer, ``1.9`` is not a count, ``5`` is not a string or a path, a string is not a list.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import PluginLoadError, ToolHost
from amplifier_tools.builtins.audit.settings import AuditSettings
from amplifier_tools.builtins.bash.settings import BashSettings
from amplifier_tools.builtins.filesystem.settings import FilesystemSettings
from amplifier_tools.builtins.policy.settings import PolicySettings
from amplifier_tools.errors import ConfigError
from amplifier_tools.mcp.settings import McpSettings
from amplifier_tools.models import ToolContext
from amplifier_tools.plugin_settings import structure_settings

SETTINGS: dict[str, type[Any]] = {"filesystem": FilesystemSettings, "bash": BashSettings, "audit": AuditSettings,
                                  "policy": PolicySettings, "mcp": McpSettings}


def refused(plugin: str, table: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        structure_settings(table, SETTINGS[plugin], f"plugins.{plugin}")
    return info.value


def server(**fields: Any) -> dict[str, Any]:
    """``[plugins.mcp]`` with one server, ``fs``."""
    return {"servers": {"fs": {"command": "mcp-fs", **fields}}}


# -- unknown keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(("plugin", "table", "key", "hint"), [
    ("filesystem", {"max_sise": 1}, "plugins.filesystem.max_sise", "did you mean 'max_size'?"),
    ("bash", {"defualt_timeout": 5}, "plugins.bash.defualt_timeout", "did you mean 'default_timeout'?"),
    ("audit", {"fsynk": "always"}, "plugins.audit.fsynk", "did you mean 'fsync'?"),
    ("policy", {"default_acton": "deny"}, "plugins.policy.default_acton", "did you mean 'default_action'?"),
    ("policy", {"rules": [{"action": "allow"}, {"action": "deny", "tool": ["x"]}]}, "plugins.policy.rules[1].tool",
     "did you mean 'tools'?"),
    ("mcp", {"severs": {}}, "plugins.mcp.severs", "did you mean 'servers'?"),
    ("mcp", server(arg=["--stdio"]), "plugins.mcp.servers.fs.arg", "did you mean 'args'?"),
    ("mcp", server(tools={"read": {"enable": False}}), "plugins.mcp.servers.fs.tools.read.enable",
     "did you mean 'enabled'?"),
    ("mcp", {"serve": {"principle": "me"}}, "plugins.mcp.serve.principle", "did you mean 'principal'?"),
])
def test_an_unknown_key_is_named_in_full_with_a_did_you_mean(plugin: str, table: dict[str, Any], key: str,
                                                            hint: str) -> None:
    error = refused(plugin, table)
    assert error.key == key and error.hint == hint
    assert str(error).startswith(f"{key}: unknown key (expected one of [")


@pytest.mark.parametrize("plugin", sorted(SETTINGS))
async def test_each_plugin_reads_its_table_through_the_one_path(plugin: str, tmp_path: Path) -> None:
    host = ToolHost(config={"plugins": {plugin: {"bogus_key": 1}}}, builtins=[plugin], entry_points=False,
                    discover=False, working_dir=tmp_path)
    with pytest.raises(PluginLoadError) as info:
        await host.start()
    await host.close()
    cause = info.value.__cause__
    assert isinstance(cause, ConfigError) and cause.key == f"plugins.{plugin}.bogus_key"
    assert f"plugins.{plugin}.bogus_key: unknown key" in str(info.value)


# -- wrong types -------------------------------------------------------------------------------


@pytest.mark.parametrize(("plugin", "table", "key", "expected"), [
    # true is not an integer
    ("filesystem", {"max_size": True}, "plugins.filesystem.max_size", "a positive integer"),
    ("bash", {"max_output_bytes": True}, "plugins.bash.max_output_bytes", "a positive integer"),
    ("bash", {"kill_grace": True}, "plugins.bash.kill_grace", "a positive number of seconds"),
    ("audit", {"fsync_every": True}, "plugins.audit.fsync_every", "a positive integer"),
    ("policy", {"idempotency_window_ms": True}, "plugins.policy.idempotency_window_ms", "a positive number"),
    ("mcp", server(max_restarts=True), "plugins.mcp.servers.fs.max_restarts", "a non-negative integer"),
    # 1.9 is not a count
    ("filesystem", {"max_results": 1.9}, "plugins.filesystem.max_results", "a positive integer"),
    ("bash", {"max_processes": 1.9}, "plugins.bash.max_processes", "a positive integer"),
    ("audit", {"checkpoint_every": 1.9}, "plugins.audit.checkpoint_every", "a positive integer"),
    ("mcp", server(max_tools=1.9), "plugins.mcp.servers.fs.max_tools", "a positive integer"),
    # 5 is not a string or a path
    ("filesystem", {"denied_paths": [".env", 5]}, "plugins.filesystem.denied_paths", "a list of paths or patterns"),
    ("bash", {"spill_dir": 5}, "plugins.bash.spill_dir", "a directory path"),
    ("audit", {"path": 5}, "plugins.audit.path", "a file path"),
    ("policy", {"store_prefix": 5}, "plugins.policy.store_prefix", "a non-empty string"),
    ("policy", {"rules": [{"action": "deny", "name": 5}]}, "plugins.policy.rules[0].name", "a string"),
    ("policy", {"rules": [{"action": "deny", "reason": 404}]}, "plugins.policy.rules[0].reason", "a string"),
    ("mcp", server(cwd=5), "plugins.mcp.servers.fs.cwd", "a directory path"),
    # an environment holds names and NUL-free strings (found by review: a raw ValueError at start)
    ("mcp", server(env={"A=B": "x"}), "plugins.mcp.servers.fs.env",
     "a table of environment variable names to strings without NUL bytes"),
    ("mcp", server(env={"X": "a\x00b"}), "plugins.mcp.servers.fs.env",
     "a table of environment variable names to strings without NUL bytes"),
    ("bash", {"env": {"X": "a\x00b"}}, "plugins.bash.env",
     "a table of environment variable names to strings without NUL bytes"),
    ("mcp", {"serve": {"principal": 5}}, "plugins.mcp.serve.principal", "a string"),
    # a string is not a list
    ("filesystem", {"allowed_read_paths": "/srv"}, "plugins.filesystem.allowed_read_paths",
     "a list of paths or patterns"),
    ("bash", {"allow": "rm"}, "plugins.bash.allow", "a list of non-empty strings"),
    ("policy", {"rules": [{"action": "deny", "tools": "local::bash"}]}, "plugins.policy.rules[0].tools",
     "a list of glob strings"),
    ("mcp", server(args="--stdio"), "plugins.mcp.servers.fs.args", "a list of strings"),
    # nor a flag or a number
    ("filesystem", {"allow_hardlinks": 1}, "plugins.filesystem.allow_hardlinks", "true or false"),
    ("audit", {"record_output": "yes"}, "plugins.audit.record_output", "true or false"),
    ("bash", {"max_timeout": "600"}, "plugins.bash.max_timeout", "a positive number of seconds"),
    ("mcp", server(startup_timeout_ms="10s"), "plugins.mcp.servers.fs.startup_timeout_ms", "a positive number"),
])
def test_a_value_of_the_wrong_type_is_refused_not_coerced(plugin: str, table: dict[str, Any], key: str,
                                                          expected: str) -> None:
    error = refused(plugin, table)
    assert error.key == key
    assert error.detail.startswith(f"must be {expected}, got "), error.detail


def test_a_table_that_is_not_a_table_is_refused() -> None:
    error = refused("bash", ["sandbox", "off"])
    assert error.key == "plugins.bash" and error.detail == "must be a table, got ['sandbox', 'off']"


# -- nested tables and lists -----------------------------------------------------------------------


@pytest.mark.parametrize(("plugin", "table", "key", "detail"), [
    ("mcp", server(startup_timeout_ms=0), "plugins.mcp.servers.fs.startup_timeout_ms",
     "must be a positive number, got 0"),
    ("mcp", {"servers": {"fs": {"args": []}}}, "plugins.mcp.servers.fs.command",
     "a server has either command (stdio) or url"),
    ("mcp", server(tools={"read": {"effect": "Harmless"}}), "plugins.mcp.servers.fs.tools.read.effect",
     "must be 'Pure', 'IdempotentWrite', 'NonIdempotentWrite' or 'ExternalSideEffects', got 'Harmless'"),
    ("mcp", {"servers": {"fs": "npx mcp-fs"}}, "plugins.mcp.servers.fs", "must be a table, got 'npx mcp-fs'"),
    ("mcp", {"servers": {"my server": {"command": "x"}}}, "plugins.mcp.servers.my server",
     "server names may use letters, digits, '_' and '-' only"),
    ("policy", {"rules": [{"action": "allow"}, {"action": "deny"}, {"action": "block"}]},
     "plugins.policy.rules[2].action", "must be 'allow' or 'deny', got 'block'"),
    ("policy", {"rules": [{"name": "no-etc", "paths": ["/etc/*"]}]}, "plugins.policy.rules[0].action",
     "missing 'action': must be 'allow' or 'deny'"),
    ("policy", {"rules": [{"action": "deny", "arguments": {"path": "/etc/*"}}]}, "plugins.policy.rules[0].arguments",
     "must be a table mapping JSON pointers ('/path') to glob strings"),
    ("policy", {"rules": [{"action": "allow"}, "deny everything"]}, "plugins.policy.rules[1]",
     "must be a table, got 'deny everything'"),
])
def test_a_nested_error_names_its_path(plugin: str, table: dict[str, Any], key: str, detail: str) -> None:
    error = refused(plugin, table)
    assert error.key == key and error.detail.startswith(detail), error.detail


# -- the rules the plugins enforce ---------------------------------------------------------------


@pytest.mark.parametrize(("plugin", "table", "key", "detail"), [
    ("bash", {"default_timeout": 700}, "plugins.bash.default_timeout", "must not exceed max_timeout (600), got 700"),
    ("bash", {"env_allowlist": ["HOME", "MY-VAR"]}, "plugins.bash.env_allowlist",
     "must be a list of environment variable names"),
    ("bash", {"secrets": {"GITHUB TOKEN": "github"}}, "plugins.bash.secrets",
     "must be a table of environment variable names to strings"),
    ("bash", {"sandbox": "docker"}, "plugins.bash.sandbox", "must be 'auto' (bubblewrap where it works"),
    ("bash", {"allowed_paths": [""]}, "plugins.bash.allowed_paths", "must be a list of non-empty strings"),
    ("filesystem", {"new_file_mode": 0o4755}, "plugins.filesystem.new_file_mode",
     "0o4755 is not a permission mode between 0o000 and 0o777"),
    ("filesystem", {"new_file_mode": "rw-r-----"}, "plugins.filesystem.new_file_mode", "'rw-r-----' is not an octal"),
    ("filesystem", {"max_line_chars": 0}, "plugins.filesystem.max_line_chars", "must be a positive integer, got 0"),
    ("audit", {"fsync": "sometimes"}, "plugins.audit.fsync", "must be 'always', 'interval' or 'never'"),
    ("audit", {"rotate_seconds": float("nan")}, "plugins.audit.rotate_seconds", "must be a positive number"),
    ("policy", {"store": "postgres://db"}, "plugins.policy.store", "must be 'memory', 'sqlite' or a URL starting redis://"),
    ("mcp", server(max_message_bytes=512), "plugins.mcp.servers.fs.max_message_bytes",
     "must be an integer number of bytes, at least 1024"),
    ("mcp", server(sandbox_read_paths=["venv"]), "plugins.mcp.servers.fs.sandbox_read_paths",
     "must be a list of absolute paths"),
])
def test_each_plugins_rules_are_kept(plugin: str, table: dict[str, Any], key: str, detail: str) -> None:
    error = refused(plugin, table)
    assert error.key == key and error.detail.startswith(detail), error.detail


def test_a_rules_hint_reaches_the_error() -> None:
    assert refused("policy", {"store": "postgres://db"}).hint.startswith('e.g. store = "redis://')
    assert "0o640" in (refused("filesystem", {"new_file_mode": 0o1000}).hint or "")


def test_values_spelled_in_more_than_one_way_are_read_as_meant() -> None:
    assert structure_settings({"new_file_mode": "0640"}, FilesystemSettings, "plugins.filesystem").new_file_mode \
        == 0o640
    bash = structure_settings({"sandbox": "none", "user": 0, "kill_grace": 0.5}, BashSettings, "plugins.bash")
    assert (bash.sandbox, bash.user, bash.kill_grace) == ("none", 0, 0.5)
    assert structure_settings({"user": "nobody"}, BashSettings, "plugins.bash").user == "nobody"


# -- defaults ------------------------------------------------------------------------------------


def test_an_empty_table_gives_the_documented_defaults() -> None:
    fs = structure_settings({}, FilesystemSettings, "plugins.filesystem")
    assert (fs.allowed_read_paths, fs.allowed_write_paths, fs.denied_paths) == (None, None, ())
    assert fs.write_denied_paths == (".git", ".env*") and fs.new_file_mode is None
    assert (fs.max_size, fs.default_limit, fs.max_line_chars, fs.max_results, fs.max_matches) == \
        (10 * 1024 * 1024, 2000, 2000, 1000, 200)
    assert not fs.allow_hardlinks and not fs.require_read_before_write

    bash = structure_settings({}, BashSettings, "plugins.bash")
    assert (bash.default_timeout, bash.max_timeout, bash.kill_grace, bash.max_output_bytes) == (120, 600, 2, 32768)
    assert (bash.sandbox, bash.sandbox_network, bash.spill_dir, bash.allowed_paths, bash.user) == \
        ("auto", False, None, None, None)
    assert (bash.env, bash.secrets, bash.allow, bash.deny, bash.env_allowlist) == ({}, {}, (), (), ())

    audit = structure_settings({}, AuditSettings, "plugins.audit")
    assert (audit.path, audit.fsync, audit.fsync_every, audit.fsync_interval_ms, audit.mode) == \
        (None, "interval", 1000, 100, "fail_closed")
    assert (audit.record_output, audit.redact_patterns, audit.otel) == (False, True, False)
    assert (audit.rotate_bytes, audit.rotate_seconds, audit.checkpoint_key_ref, audit.checkpoint_every) == \
        (None, None, None, 1000)

    policy = structure_settings({}, PolicySettings, "plugins.policy")
    assert (policy.rules, policy.default_action, policy.idempotency_window_ms) == ((), "allow", 24 * 3600 * 1000)
    assert (policy.store, policy.store_unavailable, policy.store_prefix, policy.store_timeout_ms) == \
        ("memory", "fail", "amplifier-tools:", 2000)

    mcp = structure_settings({}, McpSettings, "plugins.mcp")
    assert mcp.servers == {} and mcp.serve.name == "amplifier-tools" and mcp.serve.tools is None


def test_a_nested_table_gets_its_defaults_too() -> None:
    fs = structure_settings({"servers": {"fs": {"command": "mcp-fs"}}}, McpSettings, "plugins.mcp").servers["fs"]
    assert (fs.command, fs.args, fs.stderr, fs.sandbox, fs.timeout_ms) == ("mcp-fs", (), "inherit", "off", None)
    assert (fs.startup_timeout_ms, fs.max_restarts, fs.max_message_bytes, fs.max_tools) == \
        (10_000, 3, 16 * 1024 * 1024, 1000)
    rules = structure_settings({"rules": [{"action": "deny", "name": "no-etc"}, {"action": "allow"}]},
                               PolicySettings, "plugins.policy").rules
    assert [rule.name for rule in rules] == ["no-etc", "rule 2"]  # unnamed: its place in the list
    assert (rules[1].tools, rules[1].principals, rules[1].reason) == (("*",), None, "")


def test_only_a_settings_class_is_structured_this_way() -> None:
    with pytest.raises(TypeError, match="not marked @settings_class"):
        structure_settings({}, ToolContext, "plugins.x")


def test_settings_are_frozen() -> None:
    bash = structure_settings({}, BashSettings, "plugins.bash")
    with pytest.raises(AttributeError):
        bash.max_timeout = 1  # type: ignore[misc]


# -- per-tool overrides ([tools."name"]) are checked as written, like plugin tables -------------------


@pytest.mark.parametrize(("override", "key", "expected"), [
    ({"security": {"required_scopes": "fs:read"}}, "security.required_scopes", "a list of strings"),
    ({"policies": {"timeout_ms": True}}, "policies.timeout_ms", "a number"),
    ({"policies": {"timeout_ms": "5"}}, "policies.timeout_ms", "a number"),
    ({"policies": {"concurrency": {"limit": 2.5}}}, "policies.concurrency.limit", "an integer"),
    ({"policies": {"rate_limit": {"limit": "30", "interval_ms": 60000}}}, "policies.rate_limit.limit", "an integer"),
    ({"policies": {"budgets": [{"per": "principal", "max_calls": True}]}}, "policies.budgets[0].max_calls",
     "an integer"),
    ({"description": 5}, "description", "a string"),
])
def test_a_tool_override_of_the_wrong_type_is_refused_not_coerced(
        override: dict[str, Any], key: str, expected: str) -> None:
    """Found by a new-user trial: a scope string became its letters, ``true`` became a 1 ms timeout."""
    from amplifier_tools.registry import apply_overrides
    from amplifier_tools.spec import ToolSpec

    with pytest.raises(ConfigError) as caught:
        apply_overrides(ToolSpec(name="local::x", description="d"), override, key="tools.local::x")
    assert caught.value.key == f"tools.local::x.{key}"
    assert f"must be {expected}" in str(caught.value)


async def test_a_host_refuses_a_scope_string_in_a_tool_override(tmp_path: Path) -> None:
    config = {"tools": {"local::fs.read_file": {"security": {"required_scopes": "fs:read"}}}}
    with pytest.raises(ConfigError) as caught:
        async with ToolHost(config=config, builtins=["filesystem"], entry_points=False, discover=False,
                            working_dir=tmp_path):
            pass
    assert "tools.local::fs.read_file.security.required_scopes" in str(caught.value)


def test_settings_classes_resolved_by_two_threads_at_once_are_all_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by running hosts on uvloop in two threads: two hosts starting at once resolved the
    pending settings classes together, and one start failed with ``plugin 'audit': failed to mount:
    IndexError: list assignment index out of range`` — or a class was dropped from the pending list
    unmarked, and then refused as "not marked @settings_class" (or, nested, structured loosely)."""
    import threading
    import time

    import attrs

    from amplifier_tools import plugin_settings

    @attrs.frozen
    class One:
        a: int = 1

    @attrs.frozen
    class Two:
        a: int = 1

    @attrs.frozen
    class Three:
        a: int = 1

    for cls in (One, Two, Three):
        plugin_settings.settings_class(cls)
    resolve = attrs.resolve_types

    def slow_resolve(cls: Any, *args: Any, **kwargs: Any) -> Any:  # widens the window both threads share
        time.sleep(0.02)
        return resolve(cls, *args, **kwargs)

    monkeypatch.setattr(plugin_settings.attrs, "resolve_types", slow_resolve)
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def work() -> None:
        start.wait()
        try:
            structure_settings({"a": 2}, Three, "plugins.three")
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert failures == []
    for cls in (One, Two, Three):
        with pytest.raises(ConfigError, match="plugins.x.a"):
            structure_settings({"a": "5"}, cls, "plugins.x")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_child_forked_while_another_thread_resolves_settings_can_resolve_them() -> None:
    """Found by review: the lock around resolving pending settings classes, held by another thread
    of the parent at the fork, stayed held in the child, whose first host start then hung."""
    import threading

    from amplifier_tools import plugin_settings

    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with plugin_settings._RESOLVING:
            taken.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(5)
    try:
        pid = os.fork()
        if pid == 0:  # the child: resolve within a second, or report the hang
            done = threading.Event()
            threading.Thread(target=lambda: (plugin_settings._resolve_pending(), done.set()), daemon=True).start()
            os._exit(0 if done.wait(1.0) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0


# -- found by a newcomer's trial (2026-12-02): the hint of a value refused ----------------------


@pytest.mark.parametrize(("plugin", "table", "hint"), [
    ("bash", {"max_timeout": "600"},
     "plugins.bash.max_timeout must be a positive number of seconds, got a string: write it without quotes"),
    ("filesystem", {"max_size": True}, "plugins.filesystem.max_size must be a positive integer, got a boolean"),
    ("bash", {"max_memory_bytes": 1.5}, "plugins.bash.max_memory_bytes must be a positive integer, got a float"),
    ("bash", {"allow": "rm"}, "plugins.bash.allow must be a list of non-empty strings, got a string"),
    ("mcp", server(command=5), "plugins.mcp.servers.fs.command must be the command that starts a stdio server "
                               "(a non-empty string), got an integer"),
    ("mcp", {"serve": {"port": "80"}}, "plugins.mcp.serve.port must be a TCP port number (0 to 65535; 0 picks a "
                                       "free one), got a string: write it without quotes"),
    # of the right type, refused by a rule: what to change it to
    ("bash", {"default_timeout": -2}, "change plugins.bash.default_timeout to a positive number of seconds"),
    ("policy", {"rules": [{"action": "alow"}]}, "change plugins.policy.rules[0].action to 'allow' or 'deny'"),
    # found by a newcomer's trial (2026-12-03): [plugins.mcp.serve.clients] written for [[…]]; the hint
    # repeated the message ("… must be a list of tables, got a table")
    ("mcp", {"serve": {"clients": {"token_ref": "ci_token"}}},
     "head each entry [[plugins.mcp.serve.clients]] (double brackets: a list of tables); "
     "[plugins.mcp.serve.clients] is one table"),
])
def test_a_refused_value_hints_at_what_the_key_takes(plugin: str, table: dict[str, Any], hint: str) -> None:
    """The hint was the command line's generic one, "set plugins.bash.max_timeout in the
    configuration, or skip the plugin with AMPLIFIER_TOOLS_DISABLE_PLUGINS=bash": the key was set,
    and for a server's key it offered to disable the whole ``mcp`` plugin."""
    assert refused(plugin, table).hint == hint


def test_the_command_line_prints_what_a_wrongly_typed_key_takes(tmp_path: Path) -> None:
    from cli_helpers import cli

    config = tmp_path / "elsewhere.toml"
    config.write_text('[plugins.bash]\nmax_timeout = "600"\n')
    work = tmp_path / "work"
    work.mkdir()
    out = cli(work, "--config", str(config), "list")
    assert out.returncode == 2
    assert "plugins.bash.max_timeout: must be a positive number of seconds, got '600'" in out.stderr
    assert out.stderr.endswith("hint: plugins.bash.max_timeout must be a positive number of seconds, got a string: "
                               "write it without quotes\n"), out.stderr


def test_a_string_of_deeply_nested_brackets_is_refused_for_its_type() -> None:
    """Found by review: the hint's look at what a quoted value would be unquoted (``json.loads``)
    hit the recursion limit on ``"[[[…"``, and the RecursionError became the error ("invalid:
    maximum recursion depth exceeded ...") with the generic hint the hint was made to replace."""
    error = refused("filesystem", {"max_size": "[" * 100_000})
    assert error.hint == "plugins.filesystem.max_size must be a positive integer, got a string"
    assert "recursion" not in str(error)
