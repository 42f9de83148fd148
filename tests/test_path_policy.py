"""Attack tests for policy path rules (issue 14, finding 2): a deny rule on ``/etc/*`` (or on a secret
in the workspace) holds however the path is spelled, whichever tool carries it, and for walks of
the directory itself. Every path rule is decided by the filesystem's path engine on the resolved
path."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import EchoTool, ToolsPlugin

from amplifier_tools import PluginLoadError, ToolHost

ETC_RULE = {"name": "no-etc", "action": "deny", "tools": ["*"], "arguments": {"/path": "/etc/*"},
            "reason": "system files"}


async def policy_host(root: Path, rules: list[dict[str, Any]], *, builtins: tuple[str, ...] = ("filesystem", "policy"),
                      **extra: Any) -> ToolHost:
    config: dict[str, Any] = {"plugins": {"policy": {"rules": rules},
                                          "filesystem": {"allowed_read_paths": ["/"]}, **extra}}
    host = ToolHost(config=config, builtins=list(builtins), entry_points=False, working_dir=root, discover=False)
    await host.start()
    return host


@pytest.fixture
async def etc_host(tmp_path: Path) -> AsyncIterator[ToolHost]:
    (tmp_path / "ok.txt").write_text("fine\n")
    (tmp_path / "etc-link").symlink_to("/etc")
    host = await policy_host(tmp_path, [ETC_RULE])
    yield host
    await host.close()


def denied_by(result: Any, rule: str) -> bool:
    return result.error is not None and result.error["code"] == "rule_denied" and result.error["rule"] == rule


@pytest.mark.parametrize(("tool", "arguments"), [
    ("fs_grep", {"pattern": "root", "path": "/etc", "glob": "passwd"}),
    ("fs_grep", {"pattern": "root", "path": "/"}),  # a walk from above reaches /etc
    ("fs_list_dir", {"path": "/etc"}),
    ("fs_list_dir", {"path": "/etc/"}),
    ("fs_glob", {"pattern": "pass*", "path": "/etc"}),
    ("fs_read_file", {"path": "/proc/self/root/etc/passwd"}),
    ("fs_read_file", {"path": "/proc/self/root/proc/self/root/etc/hostname"}),
    ("fs_read_file", {"path": f"/proc/{os.getpid()}/root/etc/passwd"}),
    ("fs_read_file", {"path": "etc-link/passwd"}),  # a symlink inside the root
    ("fs_list_dir", {"path": "etc-link"}),
    ("fs_grep", {"pattern": "root", "path": "etc-link"}),
])
async def test_an_etc_deny_rule_holds_however_the_path_is_spelled(etc_host: ToolHost, tool: str,
                                                                  arguments: dict[str, Any]) -> None:
    result = await etc_host.call(tool, arguments)
    assert denied_by(result, "no-etc"), result
    assert "root:" not in str(result.output)


async def test_a_dev_fd_magic_link_is_resolved_to_the_file_it_names(etc_host: ToolHost) -> None:
    fd = os.open("/etc/passwd", os.O_RDONLY)
    try:
        result = await etc_host.call("fs_read_file", {"path": f"/dev/fd/{fd}"})
        assert denied_by(result, "no-etc"), result
    finally:
        os.close(fd)


async def test_a_magic_link_to_a_pipe_is_refused_by_every_path_deny_rule(etc_host: ToolHost) -> None:
    read_end, write_end = os.pipe()
    try:
        result = await etc_host.call("fs_read_file", {"path": f"/proc/self/fd/{read_end}"})
        assert denied_by(result, "no-etc"), result
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_walks_and_reads_elsewhere_still_work(etc_host: ToolHost, tmp_path: Path) -> None:
    assert (await etc_host.call("fs_read_file", {"path": "ok.txt"})).success
    assert (await etc_host.call("fs_grep", {"pattern": "fine"})).output["matches"][0]["file"] == "ok.txt"
    assert (await etc_host.call("fs_list_dir", {"path": str(tmp_path)})).success


async def test_an_allow_rule_on_a_directory_covers_walks_of_it_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "src-evil").mkdir()
    (tmp_path / "escape").symlink_to("/etc")
    config: dict[str, Any] = {"plugins": {"policy": {"default_action": "deny", "rules": [
        {"name": "src-only", "action": "allow", "tools": ["local::fs.*"], "arguments": {"/path": "./src"}}]}}}
    async with ToolHost(config=config, builtins=["filesystem", "policy"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        assert (await host.call("fs_grep", {"pattern": "x", "path": "src"})).success
        assert (await host.call("fs_read_file", {"path": "src/a.py"})).success
        (tmp_path / "src-evil" / "src").mkdir()  # a name elsewhere that merely equals 'src'
        assert denied_by(await host.call("fs_list_dir", {"path": "src-evil/src"}), "default")
        for arguments in ({"pattern": "x"}, {"pattern": "x", "path": "src-evil"}, {"pattern": "x", "path": "escape"},
                          {"pattern": "x", "path": "src/../escape"}):
            result = await host.call("fs_grep", arguments)
            assert denied_by(result, "default"), (arguments, result)


async def test_a_paths_rule_covers_every_path_argument(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "k.txt").write_text("KEY\n")
    rule = {"name": "no-secrets", "action": "deny", "paths": ["secrets*", "/etc/*"]}
    host = await policy_host(tmp_path, [rule])
    try:
        for tool, arguments in (("fs_read_file", {"path": "secrets/k.txt"}),
                                ("fs_read_file", {"path": "/etc/hostname"}),
                                ("fs_grep", {"pattern": "KEY"}),  # a name pattern may match below any walk
                                ("fs_list_dir", {"path": "secrets"})):
            assert denied_by(await host.call(tool, arguments), "no-secrets"), (tool, arguments)
        assert (await host.call("fs_write_file", {"path": "notes.txt", "content": "x"})).success
    finally:
        await host.close()


@pytest.mark.parametrize("paths", [[], "secrets*", [""], [3]])
async def test_a_bad_paths_selector_fails_start_naming_the_key(tmp_path: Path, paths: Any) -> None:
    with pytest.raises(PluginLoadError, match=r"plugins\.policy\.rules\[0\]\.paths"):
        await policy_host(tmp_path, [{"action": "deny", "paths": paths}])


# -- imported MCP tools -------------------------------------------------------------------------

PATH_SERVER = str(Path(__file__).parent / "mcp_fixtures" / "path_server.py")


async def mcp_host(root: Path, rules: list[dict[str, Any]]) -> ToolHost:
    pytest.importorskip("mcp")
    server = {"command": sys.executable, "args": [PATH_SERVER],
              "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FIXTURE_ROOT": str(root)}}
    return await policy_host(root, rules, builtins=("filesystem", "policy", "mcp"),
                             mcp={"servers": {"px": server}})


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "sub" / "inner").mkdir(parents=True)
    (tmp_path / "ok.txt").write_text("fine\n")
    (tmp_path / "secret.txt").write_text("S3CRET\n")
    (tmp_path / "link").symlink_to("secret.txt")
    (tmp_path / "jump").symlink_to("sub/inner")  # jump/.. is sub to the kernel, the workspace on paper
    return tmp_path


@pytest.mark.parametrize("arguments", [
    {"path": "secret.txt"}, {"path": "sub/../secret.txt"}, {"path": "./sub/./../secret.txt"}, {"path": "link"},
    {"path": "jump/../../secret.txt"},  # read by the server as sub/inner/../../secret.txt
])
async def test_an_imported_tools_path_is_resolved_before_the_rule(workspace: Path, arguments: dict[str, Any]) -> None:
    rule = {"name": "no-secret", "action": "deny", "tools": ["mcp::*"],
            "arguments": {"/path": f"{workspace}/secret*"}}
    host = await mcp_host(workspace, [rule])
    try:
        result = await host.call("mcp::px::read_text", arguments)
        assert denied_by(result, "no-secret"), result
        assert "S3CRET" not in str(result.output)
        assert (await host.call("mcp::px::read_text", {"path": "ok.txt"})).success
    finally:
        await host.close()


@pytest.mark.parametrize("rule_selector", [{"arguments": {"/paths": "/etc/*"}}, {"paths": ["/etc/*"]}])
async def test_a_path_inside_an_array_is_checked(workspace: Path, rule_selector: dict[str, Any]) -> None:
    host = await mcp_host(workspace, [{"name": "no-etc", "action": "deny", **rule_selector}])
    try:
        result = await host.call("mcp::px::read_many", {"paths": ["ok.txt", "/etc/passwd"]})
        assert denied_by(result, "no-etc"), result
        assert (await host.call("mcp::px::read_many", {"paths": ["ok.txt"]})).success
    finally:
        await host.close()


async def test_a_path_named_only_by_its_schema_format_is_checked(workspace: Path) -> None:
    host = await mcp_host(workspace, [{"name": "no-secret", "action": "deny", "paths": ["secret*"]}])
    try:
        result = await host.call("mcp::px::open_doc", {"doc": "sub/../secret.txt"})
        assert denied_by(result, "no-secret"), result
    finally:
        await host.close()


async def test_path_rules_resolve_without_the_filesystem_plugin(tmp_path: Path) -> None:
    (tmp_path / "etc-link").symlink_to("/etc")
    config = {"plugins": {"policy": {"rules": [ETC_RULE]}}}
    async with ToolHost(config=config, builtins=["policy"], plugins=[ToolsPlugin(EchoTool())], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        for path in ("etc-link/passwd", "/proc/self/root/etc/shadow", "x/../../../../../../../../etc/hosts"):
            assert denied_by(await host.call("echo", {"path": path}), "no-etc"), path
        assert (await host.call("echo", {"path": "notes.txt"})).output == "notes.txt"
