"""The host's own state out of the agent's reach (DESIGN "Host state and the trust boundary").

Host-level attacks: where state lives, what the host refuses at start, and how protected paths
reach the tools. The tools' own attack tests are in test_filesystem_protected.py and
test_bash_protected.py; the audit log's in test_audit*.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from helpers import EchoTool, ToolsPlugin

from amplifier_tools import ConfigError, ToolHost, hookimpl
from amplifier_tools.hoststate import default_state_dir

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def host(tmp_path: Path, config: Any = None, **kwargs: Any) -> ToolHost:
    kwargs.setdefault("builtins", False)
    return ToolHost(config=config, plugins=[ToolsPlugin(EchoTool())], entry_points=False,
                    working_dir=kwargs.pop("working_dir", tmp_path / "work"), discover=False, **kwargs)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


async def test_state_dir_defaults_outside_the_working_dir_private_to_the_user(
    tmp_path: Path, work: Path, state_home: Path
) -> None:
    async with host(tmp_path) as h:
        assert h.state_dir == default_state_dir(str(work))
        assert h.state_dir.is_relative_to(state_home) and not h.state_dir.is_relative_to(work)
        assert stat.S_IMODE(os.stat(h.state_dir).st_mode) == 0o700
        assert h.capabilities["session.state_dir"] == str(h.state_dir)
        assert h.protected_paths.protects(str(h.state_dir / "audit.jsonl")) is not None


async def test_state_dir_inside_the_working_dir_is_refused_naming_the_key(tmp_path: Path, work: Path) -> None:
    with pytest.raises(ConfigError, match=r"state_dir.*lies inside"):
        async with host(tmp_path, {"state_dir": str(work / ".state")}):
            pass


async def test_state_dir_inside_a_root_another_plugin_writes_is_refused(tmp_path: Path, work: Path) -> None:
    shared = tmp_path / "shared"

    class WritesShared:
        name = "writes-shared"

        @hookimpl
        def mount(self, coordinator: Any) -> None:
            coordinator.get_capability("session.writable_roots").append(str(shared))

    with pytest.raises(ConfigError, match="state_dir"):
        async with ToolHost(config={"state_dir": str(shared / "state")}, plugins=[WritesShared()], builtins=False,
                            entry_points=False, working_dir=work, discover=False):
            pass


@pytest.mark.parametrize("kind", ["symlink", "file", "group-writable"])
async def test_a_state_dir_that_is_not_a_private_directory_is_refused(tmp_path: Path, work: Path, kind: str) -> None:
    target = tmp_path / "state"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if kind == "symlink":
        target.symlink_to(elsewhere)
    elif kind == "file":
        target.write_text("x")
    else:
        target.mkdir()
        target.chmod(0o777)
    with pytest.raises(ConfigError) as caught:
        async with host(tmp_path, {"state_dir": str(target)}):
            pass
    assert "state_dir" in str(caught.value) and str(target) in str(caught.value)


async def test_an_existing_state_dir_is_never_chmodded(tmp_path: Path, work: Path) -> None:
    """state_dir = "/etc" must not make /etc private: only a directory the host made is set 0700."""
    existing = tmp_path / "existing"
    existing.mkdir()
    existing.chmod(0o755)
    async with host(tmp_path, {"state_dir": str(existing)}):
        pass
    assert stat.S_IMODE(os.stat(existing).st_mode) == 0o755


async def test_the_config_file_and_the_config_location_are_protected(tmp_path: Path, work: Path) -> None:
    config = work / "amplifier-tools.toml"
    config.write_text("[plugins.filesystem]\n")
    async with ToolHost(config=config, builtins=["filesystem"], entry_points=False, working_dir=work) as h:
        write = await h.call("fs_write_file", {"path": "amplifier-tools.toml", "content": "[plugins.audit]\n"
                                                                                         "enabled = false\n"})
        read = await h.call("fs_read_file", {"path": "amplifier-tools.toml"})
    assert write.error["code"] == read.error["code"] == "path_protected"
    assert config.read_text() == "[plugins.filesystem]\n"


async def test_a_config_named_through_a_symlink_protects_both_names(tmp_path: Path, work: Path) -> None:
    real = tmp_path / "conf" / "real.toml"
    real.parent.mkdir()
    real.write_text("")
    link = work / "tools.toml"
    link.symlink_to(real)
    async with ToolHost(config=link, builtins=["filesystem"], entry_points=False, working_dir=work) as h:
        assert h.protected_paths.protects(str(link)) is not None
        assert h.protected_paths.protects(str(real)) is not None
        replaced = await h.call("fs_write_file", {"path": "tools.toml", "content": "x"})
    assert replaced.error["code"] == "path_protected"
    assert link.is_symlink() and real.read_text() == ""


@needs_bwrap
async def test_sandboxed_bash_still_runs_when_the_config_is_named_through_a_symlink(
    tmp_path: Path, work: Path
) -> None:
    real = work / "real.toml"
    real.write_text('[plugins.bash]\nsandbox = "bubblewrap"\n')
    link = work / "link.toml"
    link.symlink_to(real)
    async with ToolHost(config=link, builtins=["bash"], entry_points=False, working_dir=work) as h:
        result = await h.call("bash", {"command": "cat real.toml; echo done"})
    assert result.success, result.error
    assert "sandbox" not in result.output["stdout"] and "done" in result.output["stdout"]


def test_the_default_host_puts_nothing_of_its_own_in_the_working_directory(tmp_path: Path, state_home: Path) -> None:
    """The README's first command, every built-in loaded: the working directory is left as it was,
    and the call's audit record is in the state directory, where `audit verify` finds it."""
    from cli_helpers import cli

    work = tmp_path / "project"
    work.mkdir()
    (work / "notes.txt").write_text("one\ntwo\n")
    called = cli(work, "call", "local::fs.read_file", '{"path": "notes.txt", "limit": 1}')
    assert called.returncode == 0, called.stderr
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]
    log = default_state_dir(str(work.resolve())) / "audit.jsonl"
    assert log.is_file() and log.is_relative_to(state_home)
    verified = cli(work, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


class ThirdPartyWrite:
    """Like Amplifier's write_file: an absolute or relative ``file_path``, no path rules of its own."""

    name = "write_file"
    description = "Write a file."
    input_schema = {"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["file_path", "content"]}

    def __init__(self, working_dir: Path) -> None:
        self.working_dir = working_dir
        self.written: list[str] = []

    async def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        target = self.working_dir / input["file_path"]
        target.write_text(input["content"])
        self.written.append(str(target))
        return {"success": True, "output": "ok"}


class ThirdPartyShell:
    name = "run"
    description = "Run a command (pretend)."
    input_schema = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}

    async def execute(self, input: dict[str, Any]) -> dict[str, Any]:
        return {"success": True, "output": input["command"]}


async def test_third_party_tools_cannot_name_protected_paths_in_their_arguments(tmp_path: Path, work: Path) -> None:
    """Amplifier's write_file rewrote amplifier-tools.toml and the next start had no audit or policy."""
    config = work / "amplifier-tools.toml"
    config.write_text("[plugins.filesystem]\n")
    writer = ThirdPartyWrite(work)
    async with ToolHost(config=config, plugins=[ToolsPlugin(writer, ThirdPartyShell())],
                        builtins=["filesystem", "audit"], entry_points=False, working_dir=work) as h:
        log = Path(h.capabilities["audit.path"])
        attempts = [
            ("write_file", {"file_path": "amplifier-tools.toml", "content": "disable_plugins = ['audit']\n"}),
            ("write_file", {"file_path": str(config), "content": "x"}),
            ("write_file", {"file_path": "sub/../amplifier-tools.toml", "content": "x"}),
            ("write_file", {"file_path": str(log), "content": "forged\n"}),
            ("run", {"command": f"echo forged >> {log}"}),
            ("run", {"command": "printf 'disable_plugins=[\"policy\"]' > amplifier-tools.toml"}),
        ]
        for tool, arguments in attempts:
            result = await h.call(tool, arguments)
            assert result.error is not None and result.error["code"] == "path_protected", (tool, arguments, result)
        ordinary = await h.call("write_file", {"file_path": "notes.txt", "content": "fine"})
        assert ordinary.success
        assert (await h.call("run", {"command": "ls -la"})).success
    assert config.read_text() == "[plugins.filesystem]\n"
    assert writer.written == [str(work / "notes.txt")]


async def test_a_working_directory_swapped_for_a_symlink_to_the_state_does_not_open_the_log(
        tmp_path: Path, work: Path) -> None:
    """A tool with host privileges moved the working directory away and left a symlink to the
    host's state directory in its place: ``write_file`` with the bare name ``audit.jsonl`` would
    write the audit log. The guard resolves the name where the kernel will open it."""
    writer = ThirdPartyWrite(work)
    async with ToolHost(plugins=[ToolsPlugin(writer)], builtins=["filesystem", "audit"], entry_points=False,
                        working_dir=work, discover=False) as h:
        log = Path(h.capabilities["audit.path"])
        assert (await h.call("write_file", {"file_path": "notes.txt", "content": "fine"})).success
        work.rename(tmp_path / "work-moved")
        work.symlink_to(log.parent)
        before = log.read_bytes()
        result = await h.call("write_file", {"file_path": log.name, "content": "forged\n"})
        assert result.error is not None and result.error["code"] == "path_protected", result
        after = log.read_bytes()
        assert after.startswith(before), "the log was rewritten"
        assert all(json.loads(line) for line in after.splitlines()), "a line that is no record was written"
    assert writer.written == [str(work / "notes.txt")]


async def test_a_hard_linked_audit_log_is_never_written_through(tmp_path: Path, work: Path) -> None:
    """A second name of the log may be a shell profile: the host refuses the file, naming it."""
    from amplifier_tools.hoststate import ensure_state_dir

    state = ensure_state_dir(default_state_dir(str(work)))
    profile = tmp_path / "profile.sh"
    profile.write_text("")
    os.link(profile, state / "audit.jsonl")
    async with ToolHost(plugins=[ToolsPlugin(EchoTool())], builtins=["audit"], entry_points=False,
                        working_dir=work, discover=False) as h:
        result = await h.call("echo", {"path": "$(touch /tmp/pwned-by-audit)"})
    assert not result.success and "hard link" in result.error["message"]
    assert profile.read_text() == ""


async def test_another_workspaces_state_is_protected_too(tmp_path: Path, work: Path) -> None:
    other = default_state_dir(str(tmp_path / "another-project"))
    other.mkdir(parents=True)
    (other / "audit.jsonl").write_text("{}\n")
    async with ToolHost(config={"plugins": {"filesystem": {"allowed_write_paths": [str(tmp_path)],
                                                           "allowed_read_paths": ["/"]}}},
                        builtins=["filesystem"], entry_points=False, working_dir=work, discover=False) as h:
        read = await h.call("fs_read_file", {"path": str(other / "audit.jsonl")})
        write = await h.call("fs_write_file", {"path": str(other / "audit.jsonl"), "content": "forged"})
    assert read.error["code"] == write.error["code"] == "path_protected"


def test_a_config_changed_planted_or_removed_between_runs_is_not_taken_on_trust(tmp_path: Path) -> None:
    """pyproject.toml rewritten by a tool switched audit and policy off at the next start."""
    from cli_helpers import cli

    work = tmp_path / "project"
    work.mkdir()
    assert cli(work, "list").returncode == 0  # first start: no config here, remembered as such
    (work / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.amplifier-tools]\n'
                                         'disable_plugins = ["audit", "policy"]\n')
    planted = cli(work, "list")
    assert planted.returncode == 2
    assert "appeared in the working directory" in planted.stderr and "amplifier-tools trust" in planted.stderr
    assert cli(work, "trust").returncode == 0  # the operator reviewed it
    assert cli(work, "list").returncode == 0
    (work / "pyproject.toml").write_text('[tool.amplifier-tools]\ndisable_plugins = ["audit"]\n')
    edited = cli(work, "list")
    assert edited.returncode == 2 and "changed since the host last started" in edited.stderr
    assert cli(work, "trust").returncode == 0
    (work / "pyproject.toml").unlink()
    removed = cli(work, "list")
    assert removed.returncode == 2 and "is gone" in removed.stderr
    # The hint named the deleted file to review (found by a newcomer's pass).
    assert "hint: if its removal was meant, accept it with: amplifier-tools trust" in removed.stderr
    outside = tmp_path / "elsewhere.toml"
    outside.write_text("")
    assert cli(work, "--config", str(outside), "list").returncode == 0  # tools cannot reach it: no trust needed


def _discovering(work: Path) -> ToolHost:
    """A host started the way the command line starts one: in the current directory (``work``),
    finding its configuration itself."""
    assert Path.cwd() == work
    return ToolHost(plugins=[ToolsPlugin(EchoTool())], builtins=False, entry_points=False)


@pytest.mark.parametrize("moves", ["state_dir", "working_dir"])
async def test_a_planted_config_cannot_move_the_trust_record_it_is_checked_against(
        tmp_path: Path, work: Path, moves: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: a ``pyproject.toml`` written by a tool named a fresh ``state_dir`` (or
    another ``working_dir``, whose state it then was); the start looked for its trust record there,
    found none, and took the planted file on first-use trust (``sandbox = "off"`` with it)."""
    monkeypatch.chdir(work)
    async with _discovering(work):
        pass  # the first start: no configuration here, remembered as such
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = tmp_path / "fresh-state" if moves == "state_dir" else elsewhere
    (work / "pyproject.toml").write_text(f'[tool.amplifier-tools]\n{moves} = "{target}"\n'
                                         'default_timeout_ms = 1234\n')
    with pytest.raises(ConfigError, match="appeared in the working directory"):
        await _discovering(work).start()
    # Once the operator accepts it, it is taken, and its state_dir or working_dir with it.
    from cli_helpers import cli

    assert cli(work, "trust").returncode == 0
    async with _discovering(work) as accepted:
        assert accepted.config_file == str(work / "pyproject.toml")
        if moves == "state_dir":
            assert accepted.state_dir == target
        else:
            assert accepted.working_dir == str(elsewhere)
        # The record is kept apart from a configured state_dir, and protected like any host state.
        assert accepted.protected_paths.protects(str(accepted.trust_dir / "trusted-config.json")) is not None


async def test_a_config_symlinked_to_a_file_outside_is_still_checked(
        tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: ``amplifier-tools.toml`` made a symlink to an empty file outside the
    workspace was judged by where it led: outside, so unchecked, and every rule of the trusted
    ``pyproject.toml`` was dropped at the next start."""
    monkeypatch.chdir(work)
    (work / "pyproject.toml").write_text('[tool.amplifier-tools]\ndefault_timeout_ms = 1234\n')
    async with _discovering(work) as first:
        assert first.config_file == str(work / "pyproject.toml")  # first start: remembered
    empty = tmp_path / "outside" / "py.typed"
    empty.parent.mkdir()
    empty.write_text("")
    (work / "amplifier-tools.toml").symlink_to(empty)
    with pytest.raises(ConfigError, match="moved from"):
        await _discovering(work).start()


@pytest.mark.parametrize("name", ["pyproject.toml", "amplifier-tools.toml"])
def test_a_huge_config_file_stops_the_start_without_being_read(work: Path, name: str) -> None:
    """Found by attack: ``truncate -s 1G pyproject.toml`` made the next start read the whole file
    (9.6 s, 2 GiB); at 100 GiB it died of ``MemoryError``."""
    with open(work / name, "wb") as file:
        file.truncate(64 * 1024 * 1024 * 1024)  # sparse: 64 GiB of nothing
    with pytest.raises(ConfigError, match="larger than 4 MiB") as refused:
        ToolHost(plugins=[ToolsPlugin(EchoTool())], builtins=False, entry_points=False, working_dir=work)
    assert str(work / name) in str(refused.value)


async def test_two_projects_named_with_config_from_one_directory_keep_their_own_trust_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review of the planted-config fix: the record was kept per directory the host was
    started in, so two projects started with ``--config`` from one directory (an operator's shell,
    an MCP client's launch directory) refused each other in turn ("the configuration moved")."""
    monkeypatch.chdir(tmp_path)
    configs = []
    for name in ("projA", "projB"):
        project = tmp_path / name
        project.mkdir()
        config = project / "amplifier-tools.toml"
        config.write_text(f'working_dir = "{project}"\n')
        configs.append(config)
    for config in [*configs, *configs]:
        async with ToolHost(config=config, plugins=[ToolsPlugin(EchoTool())], builtins=False, entry_points=False):
            pass
    configs[0].write_text(configs[0].read_text() + "default_timeout_ms = 5\n")  # still caught when edited
    with pytest.raises(ConfigError, match="changed since the host last started"):
        await ToolHost(config=configs[0], plugins=[ToolsPlugin(EchoTool())], builtins=False,
                       entry_points=False).start()


def test_an_invalid_config_that_appeared_is_reported_as_untrusted_first(tmp_path: Path) -> None:
    """Found by a newcomer's trial: after a bash command wrote an invalid ``amplifier-tools.toml``,
    the next start said only "not valid TOML ... fix the configuration": the operator was not told
    that the file was new since the last trusted start, and may be a tool's."""
    from cli_helpers import cli

    work = tmp_path / "project"
    work.mkdir()
    planted = work / "amplifier-tools.toml"
    planted.write_text("x = [\n")
    first = cli(work, "list")  # a first start has nothing to compare with: the file's own error
    assert first.returncode == 2 and "not valid TOML" in first.stderr and "appeared" not in first.stderr
    planted.unlink()
    assert cli(work, "list").returncode == 0  # no configuration: remembered as such
    planted.write_text("x = [\n")
    out = cli(work, "list")
    assert out.returncode == 2, out.stderr
    assert (f"error: {planted}: a configuration file appeared in the working directory: {planted}; tools can "
            "write the working directory, so the host will not take it on trust, and it cannot be loaded "
            "either: not valid TOML: ") in out.stderr, out.stderr
    assert (f"hint: review {planted}: a tool may have written it; fix or remove it; then run: "
            "amplifier-tools trust") in out.stderr
    out = cli(work, "trust")  # ``trust`` cannot accept it as it is: it says so, and why (never "run trust")
    assert out.returncode == 2, out.stderr
    assert f"error: {planted}: not trusted: it cannot be loaded: not valid TOML: " in out.stderr, out.stderr
    assert ("hint: review it (a tool may have written it) and fix or remove it; then run amplifier-tools "
            "trust again") in out.stderr
    planted.write_text("default_timeout_ms = 1234\n")  # fixed: still to be trusted
    assert "appeared in the working directory" in cli(work, "list").stderr
    assert cli(work, "trust").returncode == 0 and cli(work, "list").returncode == 0
    planted.write_text("default_timeout_ms = 'x'\n")  # the trusted file edited: a value refused
    edited = cli(work, "list")
    assert edited.returncode == 2 and "changed since the host last started" in edited.stderr
    assert "cannot be loaded either: default_timeout_ms: 'x' is not of type 'number'" in edited.stderr
