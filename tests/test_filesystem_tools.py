"""What users of the filesystem tools see: paging, notices, atomic writes, edits, search."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amplifier_tools import Effect, ToolContext, ToolHost


async def start(root: Path, **plugin_config: Any) -> ToolHost:
    host = ToolHost(config={"plugins": {"filesystem": plugin_config}} if plugin_config else None,
                    builtins=["filesystem"], entry_points=False, working_dir=root, discover=False)
    await host.start()
    return host


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[ToolHost]:
    h = await start(tmp_path, max_size=1000)
    yield h
    await h.close()


async def test_read_file_pages_and_says_where_to_continue(host: ToolHost, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    first = (await host.call("fs_read_file", {"path": "f.txt", "limit": 3})).output
    assert first["content"] == "     1\tline 1\n     2\tline 2\n     3\tline 3"
    assert first["partial"] is True and first["total_lines"] is None
    assert first["notice"] == "more lines follow; continue with offset=4"
    last = (await host.call("fs_read_file", {"path": "f.txt", "offset": 9, "limit": 5})).output
    assert last["content"].splitlines()[0] == "     9\tline 9" and last["total_lines"] == 10
    past = (await host.call("fs_read_file", {"path": "f.txt", "offset": 50})).output
    assert past["lines_returned"] == 0 and "past the end of the file (10 lines)" in past["notice"]
    whole = (await host.call("fs_read_file", {"path": "f.txt"})).output
    assert whole["partial"] is False and whole["total_lines"] == 10


async def test_empty_binary_long_lines_and_size_cap(host: ToolHost, tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    assert (await host.call("fs_read_file", {"path": "empty.txt"})).output["notice"] == "the file is empty"
    (tmp_path / "bin.dat").write_bytes(b"\x7fELF\x00\x01\x02" * 10)
    binary = await host.call("fs_read_file", {"path": "bin.dat"})
    assert binary.error["code"] == "binary_file" and "\x00" not in binary.error["message"]
    (tmp_path / "long.txt").write_text("x" * 5000 + "\nshort\n")
    long = (await host.call("fs_read_file", {"path": "long.txt", "limit": 5})).output
    assert long["truncated_lines"] == 1 and "[line truncated]" in long["content"]
    assert long["content"].endswith("     2\tshort")
    (tmp_path / "big.txt").write_text("y\n" * 1000)
    refused = await host.call("fs_read_file", {"path": "big.txt"})
    assert refused.error["code"] == "file_too_large" and "offset and limit" in refused.error["message"]
    paged = await host.call("fs_read_file", {"path": "big.txt", "limit": 10})
    assert paged.output["lines_returned"] == 10


async def test_write_is_atomic_keeps_mode_and_creates_parents(host: ToolHost, tmp_path: Path) -> None:
    created = await host.call("fs_write_file", {"path": "a/b/c.txt", "content": "one\n"})
    assert created.output == {"path": str(tmp_path / "a/b/c.txt"), "bytes_written": 4, "created": True}
    target = tmp_path / "a/b/c.txt"
    target.chmod(0o640)
    replaced = await host.call("fs_write_file", {"path": "a/b/c.txt", "content": "two\n"})
    assert replaced.output["created"] is False and target.read_text() == "two\n"
    assert oct(target.stat().st_mode & 0o777) == oct(0o640)
    assert [p.name for p in (tmp_path / "a/b").iterdir()] == ["c.txt"]  # no temp files left


async def test_edit_file_rules(host: ToolHost, tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("DEBUG = True\nname = 'x'\nname = 'x'\n")
    ok = await host.call("fs_edit_file", {"path": "app.py", "old_string": "DEBUG = True", "new_string": "DEBUG = 0"})
    assert ok.output["replacements"] == 1
    absent = await host.call("fs_edit_file", {"path": "app.py", "old_string": "nope", "new_string": "x"})
    assert absent.error["code"] == "not_found_in_file"
    twice = await host.call("fs_edit_file", {"path": "app.py", "old_string": "name = 'x'", "new_string": "n"})
    assert twice.error["code"] == "not_unique" and twice.error["occurrences"] == 2
    same = await host.call("fs_edit_file", {"path": "app.py", "old_string": "x", "new_string": "x"})
    assert same.error["code"] == "no_change"
    every = await host.call("fs_edit_file", {"path": "app.py", "old_string": "name = 'x'", "new_string": "n = 1",
                                             "replace_all": True})
    assert every.output["replacements"] == 2
    assert (tmp_path / "app.py").read_text() == "DEBUG = 0\nn = 1\nn = 1\n"


async def test_edit_file_is_not_idempotent_so_it_is_never_retried(tmp_path: Path) -> None:
    host = await start(tmp_path)
    try:
        spec = {s.name: s for s in host.specs}
        assert spec["local::fs.edit_file"].effect is Effect.NonIdempotentWrite
        assert spec["local::fs.write_file"].effect is Effect.IdempotentWrite
        (tmp_path / "f.txt").write_text("a\n")
        edit = {"path": "f.txt", "old_string": "a", "new_string": "aa", "replace_all": True}
        assert (await host.call("fs_edit_file", edit)).success
        assert (await host.call("fs_edit_file", edit)).success
        assert (tmp_path / "f.txt").read_text() == "aaaa\n"  # the same call, run twice, changed the file twice
    finally:
        await host.close()
    retrying = ToolHost(config={"tools": {"local::fs.edit_file": {"policies": {"retry": {"max_attempts": 3}}}}},
                        builtins=["filesystem"], entry_points=False, working_dir=tmp_path, discover=False)
    with pytest.raises(Exception, match=r"tools\.local::fs\.edit_file\.policies\.retry.*never be retried"):
        await retrying.start()
    await retrying.close()


async def test_keyed_edit_is_replayed_not_repeated_with_the_policy_plugin(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("a\n")
    edit = {"path": "f.txt", "old_string": "a", "new_string": "aa", "replace_all": True}
    async with ToolHost(builtins=["filesystem", "policy"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        first = await host.call("fs_edit_file", edit, context=ToolContext(idempotency_key="edit-1"))
        again = await host.call("fs_edit_file", edit, context=ToolContext(idempotency_key="edit-1"))
    assert first.success and again.success and again.metadata.get("replayed") is True
    assert (tmp_path / "f.txt").read_text() == "aa\n"


async def test_require_read_before_write(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("v1\n")
    host = await start(tmp_path, require_read_before_write=True)
    try:
        unread = await host.call("fs_write_file", {"path": "f.txt", "content": "v2\n"})
        assert unread.error["code"] == "read_before_write"
        await host.call("fs_read_file", {"path": "f.txt"})
        time.sleep(0.01)
        (tmp_path / "f.txt").write_text("changed elsewhere\n")
        stale = await host.call("fs_edit_file", {"path": "f.txt", "old_string": "changed", "new_string": "c"})
        assert stale.error["code"] == "stale_read"
        await host.call("fs_read_file", {"path": "f.txt"})
        assert (await host.call("fs_write_file", {"path": "f.txt", "content": "v3\n"})).success
        assert (await host.call("fs_write_file", {"path": "new.txt", "content": "fresh"})).success
    finally:
        await host.close()


async def test_glob_grep_and_list(host: ToolHost, tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "a.py").write_text("import os\n# TODO: fix\nx = 1\n")
    (tmp_path / "src" / "b.py").write_text("todo later\n")
    (tmp_path / "notes.md").write_text("TODO in markdown\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("TODO in git\n")
    (tmp_path / "blob.bin").write_bytes(b"TODO\x00\x00")
    globbed = await host.call("fs_glob", {"pattern": "**/*.py"})
    assert globbed.output == {"matches": ["src/b.py", "src/pkg/a.py"], "omitted": 0}
    grep = await host.call("fs_grep", {"pattern": "TODO", "context": 1})
    assert [(m["file"], m["line"]) for m in grep.output["matches"]] == [("notes.md", 1), ("src/pkg/a.py", 2)]
    assert grep.output["matches"][1]["before"] == ["import os"] and grep.output["matches"][1]["after"] == ["x = 1"]
    nocase = await host.call("fs_grep", {"pattern": "todo", "ignore_case": True, "glob": "src/**"})
    assert {m["file"] for m in nocase.output["matches"]} == {"src/b.py", "src/pkg/a.py"}
    bad = await host.call("fs_grep", {"pattern": "(unclosed"})
    assert bad.error["type"] == "ContractError" and bad.error["code"] == "invalid_pattern"
    one = await host.call("fs_grep", {"pattern": "x =", "path": "src/pkg/a.py"})
    assert one.output["matches"][0]["line"] == 3
    listing = await host.call("fs_list_dir", {})
    assert [e["name"] for e in listing.output["entries"]] == [".git", "blob.bin", "notes.md", "src"]


async def test_grep_sees_no_empty_line_after_a_final_newline(host: ToolHost, tmp_path: Path) -> None:
    """A file ending with a newline has no empty line after it (as grep -n sees it): an empty
    match there is not reported, and the last line's context ends with the file."""
    (tmp_path / "three.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "open.txt").write_text("one\n\nlast")  # no final newline: line 2 is empty, line 3 is last
    empty = await host.call("fs_grep", {"pattern": "^$", "path": "three.txt"})
    assert empty.output["matches"] == []
    last = await host.call("fs_grep", {"pattern": "three", "path": "three.txt", "context": 1})
    assert last.output["matches"] == [{"file": "three.txt", "line": 3, "text": "three", "before": ["two"], "after": []}]
    ends = await host.call("fs_grep", {"pattern": "$", "path": "three.txt"})
    assert [m["line"] for m in ends.output["matches"]] == [1, 2, 3]
    unterminated = await host.call("fs_grep", {"pattern": "^$", "path": "open.txt"})
    assert [m["line"] for m in unterminated.output["matches"]] == [2]
    tail = await host.call("fs_grep", {"pattern": "^$|last", "path": "open.txt", "context": 1})
    assert [(m["line"], m["after"]) for m in tail.output["matches"]] == [(2, ["last"]), (3, [])]


async def test_bad_config_names_the_key(tmp_path: Path) -> None:
    from amplifier_tools import PluginLoadError

    for config, key in (({"max_size": -1}, "max_size"), ({"allowed_read_paths": "/"}, "allowed_read_paths"),
                        ({"colour": 1}, "colour")):
        with pytest.raises(PluginLoadError, match=rf"plugins\.filesystem\.{key}"):
            await start(tmp_path, **config)


def test_race_symlink_flip_never_reads_or_writes_outside(tmp_path: Path) -> None:
    """A thread flips a path component between a real directory and a symlink to outside."""
    import asyncio

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "f.txt").write_text("OUTSIDE-SECRET")
    real = tmp_path / "real"
    real.mkdir()
    (real / "f.txt").write_text("inside")
    stop = threading.Event()
    flips = [0]  # updated live by the flipper

    def flipper() -> None:
        d, parked, link = root / "d", tmp_path / "parked", tmp_path / "link"
        link.symlink_to(outside)
        os.rename(real, d)

        def restore() -> None:
            """Back to the start (d real, link a symlink, nothing parked) after a step failed: a
            write_file that ran while d was gone made a new d (inside the root, as it may)."""
            if d.is_symlink():
                if link.is_symlink():
                    os.unlink(d)
                else:
                    os.rename(d, link)
            elif d.is_dir() and parked.is_dir():
                shutil.rmtree(d, ignore_errors=True)
            if parked.is_dir() and not d.exists():
                os.rename(parked, d)
            if not link.is_symlink():
                link.symlink_to(outside)

        while not stop.is_set():
            try:
                os.rename(d, parked)  # d: real directory -> gone
                os.rename(link, d)  # d: symlink to outside
                os.rename(d, link)  # d: gone
                os.rename(parked, d)  # d: real directory again
                flips[0] += 1
            except OSError:
                try:
                    restore()
                except OSError:
                    pass

    async def hammer() -> list[Any]:
        async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir=root, discover=False) as h:
            results: list[Any] = []
            # Run until both sides have done enough (not for a fixed time: on a loaded machine the
            # flipper thread may get little of the GIL), with a generous bound.
            deadline = time.monotonic() + 120.0
            while time.monotonic() < deadline and not (
                    len(results) >= 200 and flips[0] >= 50 and any(r.success for r in results)):
                results.append(await h.call("fs_read_file", {"path": "d/f.txt"}))
                results.append(await h.call("fs_write_file", {"path": "d/f.txt", "content": "written"}))
                if len(results) % 4 == 0 or flips[0] < 50:
                    await asyncio.sleep(0.001)  # a real wait releases the GIL so the flipper runs
            return results

    thread = threading.Thread(target=flipper, daemon=True)
    thread.start()
    try:
        results = asyncio.run(hammer())
    finally:
        stop.set()
        thread.join()
    assert (outside / "f.txt").read_text() == "OUTSIDE-SECRET"
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]
    assert not any("OUTSIDE-SECRET" in repr(r.output) for r in results)
    assert len(results) >= 200 and flips[0] >= 50, (len(results), flips[0])
    assert any(r.success for r in results)  # the inside file was reachable between flips


def test_writer_killed_mid_write_leaves_old_or_new_content(tmp_path: Path) -> None:
    old, new = "A" * 2_000_000, "B" * 2_000_000
    (tmp_path / "data.txt").write_text(old)
    script = textwrap.dedent(f"""
        import asyncio
        from amplifier_tools import Effect, ToolContext, ToolHost
        async def main():
            async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir={str(tmp_path)!r},
                                discover=False) as h:
                print("ready", flush=True)
                while True:
                    await h.call("fs_write_file", {{"path": "data.txt", "content": "B" * 2_000_000}})
        asyncio.run(main())
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for delay in (0.05, 0.1, 0.17, 0.23, 0.3):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert (tmp_path / "data.txt").read_text() in (old, new)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["fs_read_file", "fs_write_file", "fs_edit_file", "fs_list_dir",
                                           "fs_glob", "fs_grep"]),
                          st.sampled_from(["a.txt", "d/b.txt", "../x", "/etc/hosts", "d", ".", "d/../a.txt",
                                           ".git/x", "", "a\x00"]),
                          st.text(max_size=20)), max_size=12))
def test_random_operation_sequences_never_raise(tmp_path_factory: pytest.TempPathFactory,
                                                ops: list[tuple[str, str, str]]) -> None:
    import asyncio

    root = tmp_path_factory.mktemp("prop")

    async def go() -> None:
        async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir=root, discover=False) as h:
            for tool, path, text in ops:
                args: dict[str, Any] = {"path": path}
                if tool == "fs_write_file":
                    args["content"] = text
                elif tool == "fs_edit_file":
                    args.update(old_string=text or "x", new_string=text + "!")
                elif tool in ("fs_glob", "fs_grep"):
                    args = {"pattern": text or "*", "path": path}
                result = await h.call(tool, args)
                assert result.success or result.error["type"] in (
                    "ContractError", "AuthError", "ExecutionError"), result.error

    asyncio.run(go())
    assert not (root.parent / "x").exists()


@pytest.mark.parametrize(("tool", "arguments", "code", "pointer"), [
    ("fs_glob", {"pattern": "[z-a]"}, "invalid_pattern", "/pattern"),
    ("fs_glob", {"pattern": "[]"}, "invalid_pattern", "/pattern"),
    ("fs_grep", {"pattern": "x", "glob": "[z-a]"}, "invalid_pattern", "/glob"),
    ("fs_read_file", {"path": "a.txt", "encoding": "idna"}, "invalid_encoding", "/encoding"),
    ("fs_read_file", {"path": "a.txt", "encoding": "rot13"}, "invalid_encoding", "/encoding"),
    ("fs_write_file", {"path": "w.txt", "content": "\udcff"}, "invalid_input", "/content"),
    ("fs_write_file", {"path": "w.txt", "content": "x", "encoding": "idna"}, "invalid_encoding", "/encoding"),
    ("fs_write_file", {"path": "w.txt", "content": "\u20ac", "encoding": "ascii"}, "invalid_input", "/content"),
])
async def test_bad_arguments_are_the_callers_contract_error_naming_the_argument(
        host: ToolHost, tmp_path: Path, tool: str, arguments: dict[str, Any], code: str, pointer: str) -> None:
    """Found by attack: these failed as ``ExecutionError`` ``tool_raised`` (an untyped exception)."""
    (tmp_path / "a.txt").write_text("text\n")
    result = await host.call(tool, arguments)
    assert result.error is not None and result.error["type"] == "ContractError", result.error
    assert (result.error["code"], result.error["pointer"]) == (code, pointer)
    assert not (tmp_path / "w.txt").exists()
