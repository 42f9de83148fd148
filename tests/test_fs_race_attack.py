"""The filesystem tools against a hostile workspace that changes while calls run: a root swapped
for a symbolic link, edits racing each other and other writers, names at the filesystem's limit."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import EchoTool, ToolsPlugin

from amplifier_tools import ToolHost
from amplifier_tools.builtins.filesystem import paths, tools

SECRET = "OUTSIDE-SECRET-3f7a"
STATE_MARKER = "STATE-MARKER-71c0"


def host_for(work: Path, **plugin: Any) -> ToolHost:
    return ToolHost(config={"plugins": {"filesystem": plugin}} if plugin else None, builtins=["filesystem"],
                    entry_points=False, working_dir=work, discover=False)


def assert_symlink_escape(result: Any) -> None:
    assert not result.success and result.output is None
    assert (result.error["type"], result.error["code"], result.error["rule"]) == (
        "AuthError", "path_denied", "symlink_escape"), result.error


async def test_a_root_swapped_for_a_symlink_while_the_host_runs_is_not_followed(tmp_path: Path) -> None:
    """``allowed_*_paths = ["build"]``; a command in the workspace replaces ``build`` by ``build ->
    ../outside`` after the start. Reads and writes under ``build`` followed it: ``read_file`` showed
    the outside secret and ``write_file`` planted a file outside."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "build").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    async with host_for(work, allowed_read_paths=["build"], allowed_write_paths=["build"]) as host:
        (work / "build" / "ok.txt").write_text("inside\n")
        assert (await host.call("fs_read_file", {"path": "build/ok.txt"})).success
        shutil.rmtree(work / "build")
        (work / "build").symlink_to(outside)
        read = await host.call("fs_read_file", {"path": "build/secret.txt"})
        assert_symlink_escape(read)
        assert SECRET not in str(read.error)
        assert_symlink_escape(await host.call("fs_write_file", {"path": "build/planted.txt", "content": "x"}))
        assert_symlink_escape(await host.call("fs_edit_file", {"path": "build/secret.txt", "old_string": "OUTSIDE",
                                                              "new_string": "x"}))
        for tool, args in (("fs_list_dir", {"path": "build"}), ("fs_glob", {"pattern": "**", "path": "build"}),
                           ("fs_grep", {"pattern": "SECRET", "path": "build"})):
            assert_symlink_escape(await host.call(tool, args))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == SECRET + "\n"


async def test_a_root_swapped_for_a_symlink_to_the_state_dir_does_not_show_the_audit_log(
        tmp_path: Path, state_home: Path) -> None:
    """The same swap, to the host's own ``state_dir``: the protected-path check saw ``build/...``,
    not the state directory the walk then entered."""
    work = tmp_path / "work"
    (work / "sub" / "build").mkdir(parents=True)
    async with host_for(work, allowed_read_paths=["sub/build"], allowed_write_paths=["sub/build"]) as host:
        assert host.state_dir is not None
        (host.state_dir / "audit.jsonl").write_text(f'{{"record": "{STATE_MARKER}"}}\n')
        before = (host.state_dir / "audit.jsonl").read_bytes()
        shutil.rmtree(work / "sub")  # an ancestor of the root, this time
        (work / "sub").mkdir()
        (work / "sub" / "build").symlink_to(host.state_dir)
        read = await host.call("fs_read_file", {"path": "sub/build/audit.jsonl"})
        assert_symlink_escape(read)
        assert STATE_MARKER not in str(read.error)
        assert_symlink_escape(await host.call("fs_write_file", {"path": "sub/build/audit.jsonl", "content": "{}\n"}))
        assert (host.state_dir / "audit.jsonl").read_bytes() == before


async def test_a_root_that_did_not_change_still_works_when_its_parent_is_only_searchable(tmp_path: Path) -> None:
    """The root's ancestors are opened for search only, as a walk by path needs."""
    work = tmp_path / "work"
    (work / "locked" / "root").mkdir(parents=True)
    (work / "locked" / "root" / "f.txt").write_text("hello\n")
    async with host_for(work, allowed_read_paths=["locked/root"], allowed_write_paths=["locked/root"]) as host:
        (work / "locked").chmod(0o111)
        try:
            read = await host.call("fs_read_file", {"path": "locked/root/f.txt"})
            wrote = await host.call("fs_write_file", {"path": "locked/root/g.txt", "content": "new\n"})
        finally:
            (work / "locked").chmod(0o755)
    assert read.success and "hello" in read.output["content"], read.error
    assert wrote.success, wrote.error


async def test_concurrent_edits_of_one_file_both_land(tmp_path: Path) -> None:
    """Two ``edit_file`` calls of one file at once (a model's parallel tool calls) both read the old
    content; the second rename dropped the first edit, and both reported success (every time)."""
    target = tmp_path / "two.txt"
    async with host_for(tmp_path) as host:
        for _ in range(20):
            target.write_text("A\nB\nC\n")
            results = await asyncio.gather(*(
                host.call("fs_edit_file", {"path": "two.txt", "old_string": old, "new_string": old.lower()})
                for old in ("A", "B", "C")))
            assert all(r.success for r in results), [r.error for r in results]
            assert target.read_text() == "a\nb\nc\n"


async def test_a_write_landing_between_the_edits_read_and_its_rename_is_not_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process writes the file after the edit read it: the edit's rename replaced that write
    unseen. It is now refused as ``file_changed`` and the other write is kept."""
    target = tmp_path / "notes.txt"
    target.write_text("alpha\n")
    real = tools.atomic_replace

    def other_writer_first(*args: Any, **kwargs: Any) -> Any:
        target.write_text("alpha\nwritten by someone else\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(tools, "atomic_replace", other_writer_first)
    async with host_for(tmp_path) as host:
        result = await host.call("fs_edit_file", {"path": "notes.txt", "old_string": "alpha", "new_string": "beta"})
    assert not result.success
    assert (result.error["type"], result.error["code"]) == ("ExecutionError", "file_changed"), result.error
    assert target.read_text() == "alpha\nwritten by someone else\n"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]  # the temp file was removed


async def test_a_file_that_grew_after_the_edit_checked_it_is_not_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process appends after the edit's ``stat``: the edit read the old size plus one byte
    and wrote the file back cut there (``beta\\na``), losing the appended lines."""
    target = tmp_path / "notes.txt"
    target.write_text("alpha\n")
    real = paths.PathRules.check_replace

    def then_append(self: paths.PathRules, dir_fd: int, name: str, path: str) -> Any:
        checked = real(self, dir_fd, name, path)
        with target.open("a") as out:
            out.write("appended by another writer\n")
        return checked

    monkeypatch.setattr(paths.PathRules, "check_replace", then_append)
    async with host_for(tmp_path) as host:
        result = await host.call("fs_edit_file", {"path": "notes.txt", "old_string": "alpha", "new_string": "beta"})
    assert not result.success and result.error["code"] == "file_changed", result.error
    assert target.read_text() == "alpha\nappended by another writer\n"


async def test_a_write_after_the_read_before_write_check_is_not_overwritten_unseen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``require_read_before_write``: the check passed, then another process wrote the file before
    the rename; ``write_file`` replaced that content it had never read."""
    target = tmp_path / "notes.txt"
    target.write_text("v1\n")
    real = tools.atomic_replace

    def other_writer_first(*args: Any, **kwargs: Any) -> Any:
        target.write_text("v2 by someone else\n")
        return real(*args, **kwargs)

    async with host_for(tmp_path, require_read_before_write=True) as host:
        assert (await host.call("fs_read_file", {"path": "notes.txt"})).success
        monkeypatch.setattr(tools, "atomic_replace", other_writer_first)
        result = await host.call("fs_write_file", {"path": "notes.txt", "content": "v3\n"})
    assert not result.success and result.error["code"] == "file_changed", result.error
    assert target.read_text() == "v2 by someone else\n"


@pytest.mark.parametrize("name", ["x" * 250, "é" * 125, "x" * 199 + "é" * 28])
async def test_a_name_the_filesystem_holds_can_be_written_and_edited(tmp_path: Path, name: str) -> None:
    """A 250-byte name is legal (the limit is 255) but ``write_file`` refused it as ``invalid_path``
    "too long for the filesystem": its temp file's name added 18 bytes."""
    async with host_for(tmp_path) as host:
        created = await host.call("fs_write_file", {"path": name, "content": "one\n"})
        assert created.success, created.error
        replaced = await host.call("fs_write_file", {"path": name, "content": "two\n"})
        assert replaced.success, replaced.error
        edited = await host.call("fs_edit_file", {"path": name, "old_string": "two", "new_string": "three"})
        assert edited.success, edited.error
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert (tmp_path / name).read_text() == "three\n"


async def test_glob_and_grep_find_files_with_a_newline_in_their_path(tmp_path: Path) -> None:
    """A hostile workspace names a directory ``a\\nb``: ``**`` (a ``.`` in the regex) did not match the
    newline, so ``glob("**")`` and ``grep(glob="**/*.py")`` silently left the file out."""
    (tmp_path / "a\nb").mkdir()
    (tmp_path / "a\nb" / "hidden\n.py").write_text("MARKER\n")
    (tmp_path / "plain.py").write_text("MARKER\n")
    async with host_for(tmp_path) as host:
        everything = await host.call("fs_glob", {"pattern": "**"})
        python = await host.call("fs_glob", {"pattern": "**/*.py"})
        searched = await host.call("fs_grep", {"pattern": "MARKER", "glob": "**/*.py"})
    assert everything.output["matches"] == ["a\nb/hidden\n.py", "plain.py"], everything.output
    assert python.output["matches"] == ["a\nb/hidden\n.py", "plain.py"], python.output
    assert sorted(m["file"] for m in searched.output["matches"]) == ["a\nb/hidden\n.py", "plain.py"]


async def test_an_edit_whose_new_string_has_a_lone_surrogate_is_the_callers_contract_error(tmp_path: Path) -> None:
    """JSON allows ``"\\ud800"``; ``edit_file`` failed as ``tool_raised`` ``UnicodeEncodeError`` (not
    naming the argument), where ``write_file`` says ``invalid_input`` at ``/content``."""
    (tmp_path / "f.txt").write_text("anchor\n")
    async with host_for(tmp_path) as host:
        result = await host.call("fs_edit_file", {"path": "f.txt", "old_string": "anchor", "new_string": "x\ud800"})
    assert (result.error["type"], result.error["code"], result.error["pointer"]) == (
        "ContractError", "invalid_input", "/new_string"), result.error
    assert (tmp_path / "f.txt").read_text() == "anchor\n"


@pytest.mark.parametrize(("tool", "arguments"), [
    ("fs_read_file", {"path": "a\ud800"}),
    ("fs_write_file", {"path": "dir\ud800/new.txt", "content": "x"}),
    ("fs_edit_file", {"path": "a\ud800", "old_string": "x", "new_string": "y"}),
    ("fs_list_dir", {"path": "a\ud800"}),
    ("fs_glob", {"pattern": "*", "path": "a\ud800"}),
    ("fs_grep", {"pattern": "x", "path": "a\ud800"}),
])
async def test_a_path_with_a_lone_surrogate_is_invalid_path_from_every_tool(
        tmp_path: Path, tool: str, arguments: dict[str, Any]) -> None:
    """JSON allows ``"\\ud800"``, which no file name can hold (``surrogateescape`` covers only
    ``\\udc80``-``\\udcff``): every tool failed as ``tool_raised`` ``UnicodeEncodeError``."""
    async with host_for(tmp_path) as host:
        result = await host.call(tool, arguments)
    assert (result.error["type"], result.error["code"], result.error["pointer"]) == (
        "ContractError", "invalid_path", "/path"), result.error
    assert list(tmp_path.iterdir()) == []


async def test_a_lone_surrogate_path_given_to_another_plugins_tool_does_not_crash_the_guard(tmp_path: Path) -> None:
    """The filesystem plugin's guard resolves other tools' path arguments: a lone surrogate failed
    the call as ``SystemError`` ``hook_failed`` naming the filesystem plugin, for the caller's argument."""
    echo = EchoTool()
    async with ToolHost(builtins=["filesystem"], plugins=[ToolsPlugin(echo)], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        result = await host.call("echo", {"path": "a\ud800"})
    assert result.success, result.error
    assert echo.calls == [{"path": "a\ud800"}]


READ_ONLY_SCRIPT = """
import asyncio, json, sys
from amplifier_tools import ToolHost

async def main(work):
    host = ToolHost(config={"state_dir": work + "/state"}, builtins=["filesystem"], entry_points=False,
                    working_dir=work + "/w", discover=False)
    async with host:
        read = await host.call("fs_read_file", {"path": "ro.txt"})
        write = await host.call("fs_write_file", {"path": "ro.txt", "content": "replaced\\n"})
        edit = await host.call("fs_edit_file", {"path": "ro.txt", "old_string": "kept", "new_string": "x"})
        fresh = await host.call("fs_write_file", {"path": "new.txt", "content": "fine\\n"})
    print(json.dumps([read.success, write.error, edit.error, fresh.success]))

asyncio.run(main(sys.argv[1]))
"""


def test_a_read_only_file_is_not_replaced(tmp_path: Path) -> None:
    """A file its owner made read-only (``chmod a-w``): ``>`` in a shell and an editor are refused,
    but ``write_file`` and ``edit_file`` replaced it, as a rename needs only the directory's
    permission. They are now ``permission_denied`` naming the file, and the file is unchanged. Run
    as root, the host runs without the capability to override file permissions (root may otherwise
    write any file, and so may a host run as root)."""
    import json
    import os
    import subprocess
    import sys

    command = [sys.executable, "-c", READ_ONLY_SCRIPT, str(tmp_path)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("run as root, and util-linux's setpriv is missing")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", *command]
    (tmp_path / "w").mkdir()
    target = tmp_path / "w" / "ro.txt"
    target.write_text("kept\n")
    target.chmod(0o444)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "XDG_STATE_HOME": str(tmp_path / "xdg")}
    done = subprocess.run(command, capture_output=True, text=True, env=environ, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    read, write, edit, fresh = json.loads(done.stdout.splitlines()[-1])
    assert read and fresh
    for error in (write, edit):
        assert (error["type"], error["code"]) == ("ExecutionError", "permission_denied"), error
        assert "'ro.txt': the file is not writable (its permission bits: 0444)" in error["message"]
        assert "chmod u+w" in error["hint"]
    assert target.read_text() == "kept\n" and (target.stat().st_mode & 0o777) == 0o444
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["new.txt", "ro.txt"]  # no temp file left
