"""The filesystem tools in a hostile workspace (attack fs38): pathological glob patterns, grep
patterns that match everywhere, output amplification, very deep new paths, trailing slashes, a
directory where a file is expected, and a name flipped between a symlink and a file mid-call."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ToolHost
from amplifier_tools.builtins.filesystem import paths


def host_for(work: Path, **config: Any) -> ToolHost:
    return ToolHost(config={"default_timeout_ms": 30_000, **config}, builtins=["filesystem"], entry_points=False,
                    working_dir=work, discover=False)


async def test_a_catastrophic_glob_does_not_freeze_the_host(tmp_path: Path) -> None:
    """``fs_glob``'s pattern (and ``fs_grep``'s ``glob``) ran on Python's ``re``, which backtracks:
    ``*a*a*a*a*a*a*a*b`` against one file named with 50 ``a``s held the GIL for seconds (60 ``a``s:
    7.6 s, past a 1 s timeout, with the event loop frozen all along); every more ``*a`` multiplies
    it, so a model's glob could stop the host for good. ``fs_grep``'s regex is RE2 for this reason."""
    work = tmp_path / "work"
    work.mkdir()
    (work / ("a" * 50)).write_text("a\n")
    (work / "ab").write_text("a\n")
    pattern = "*a" * 7 + "b"
    async with host_for(work) as host:
        for tool, args in (("fs_glob", {"pattern": pattern}), ("fs_grep", {"pattern": "a", "glob": pattern})):
            started = time.monotonic()
            result = await host.call(tool, args)
            elapsed = time.monotonic() - started
            assert result.success, result.error
            assert elapsed < 0.5, f"{tool} with glob {pattern!r} took {elapsed:.1f} s"
        # the translation still means what it meant
        assert (await host.call("fs_glob", {"pattern": "*b"})).output["matches"] == ["ab"]
        assert (await host.call("fs_glob", {"pattern": "[!a]*"})).output["matches"] == []
        assert (await host.call("fs_glob", {"pattern": "a?"})).output["matches"] == ["ab"]
        bad = await host.call("fs_glob", {"pattern": "[z-a]"})
        assert (bad.error["code"], bad.error["pointer"]) == ("invalid_pattern", "/pattern")


async def test_glob_still_matches_a_name_that_is_not_utf8(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / os.fsdecode(b"x\xff.txt")).write_text("hit\n")
    async with host_for(work) as host:
        assert (await host.call("fs_glob", {"pattern": "x?.txt"})).output["matches"] == [os.fsdecode(b"x\xff.txt")]
        assert len((await host.call("fs_grep", {"pattern": "hit", "glob": "**"})).output["matches"]) == 1


async def test_a_pattern_that_matches_at_every_byte_of_a_long_line_is_searched_once_per_line(
        tmp_path: Path) -> None:
    """``fs_grep`` walked every match with ``finditer`` and kept one per line: ``x*`` matches (empty)
    at each byte, so one 4 MB line took about 5 s of the worker thread, which never looked whether
    its call had timed out meanwhile (a 10 MB file, ``max_size``, is 12 s per file)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "one-line.txt").write_bytes(b"y" * 4_000_000 + b"\n")
    async with host_for(work) as host:
        started = time.monotonic()
        result = await host.call("fs_grep", {"pattern": "x*"})
        elapsed = time.monotonic() - started
    assert result.success, result.error
    assert [m["line"] for m in result.output["matches"]] == [1]
    assert elapsed < 1.0, f"fs_grep of one 4 MB line took {elapsed:.1f} s"


async def test_grep_output_is_bounded_whatever_context_and_max_matches(tmp_path: Path) -> None:
    """``context`` 20 with ``max_matches`` 10,000 over a 6 MB file of 600-character lines returned
    207 million characters (each line repeated in the context of 40 matches; 681 MB of memory for
    one call), of which a model is shown 50,000."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text(("x" * 600 + "\n") * 10_000)
    async with host_for(work) as host:
        result = await host.call("fs_grep", {"pattern": "x", "context": 20, "max_matches": 10_000})
    assert result.success, result.error
    text = sum(len(m["text"]) + sum(map(len, m["before"])) + sum(map(len, m["after"]))
               for m in result.output["matches"])
    assert text <= 5_000_000, f"{text} characters of grep output"
    assert result.output["truncated"] is True


async def test_a_deep_new_path_does_not_run_the_host_out_of_descriptors(tmp_path: Path) -> None:
    """``write_file`` of a 3,000-byte path ``d/d/.../f`` (1,500 new directories, within the 4,096
    bytes a path may have) held one descriptor per directory it made and, under the common limit of
    1,024, failed as ``os_error`` "Too many open files" (as could any other call meanwhile)."""
    work = tmp_path / "work"
    work.mkdir()
    deep = "d/" * 1500 + "f.txt"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        async with host_for(work) as host:
            result = await host.call("fs_write_file", {"path": deep, "content": "x"})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not result.success
    assert "Too many open files" not in result.error["message"]
    assert (result.error["type"], result.error["code"]) == ("ContractError", "invalid_path"), result.error
    assert result.error["path"].startswith("d/d/d/")  # the path, cut by the host past 2,000 characters
    assert list(work.iterdir()) == []  # the directories it made were removed again


async def test_a_trailing_slash_names_a_directory_not_a_file(tmp_path: Path) -> None:
    """The lexical normalization dropped a trailing slash: ``write_file("new/")`` created a regular
    file named ``new``, and ``read_file``/``edit_file`` of ``f.txt/`` used ``f.txt`` (the kernel
    says ``ENOTDIR``, a shell's ``>`` says "Is a directory")."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "f.txt").write_text("hello\n")
    async with host_for(work) as host:
        write = await host.call("fs_write_file", {"path": "new/", "content": "x"})
        read = await host.call("fs_read_file", {"path": "f.txt/"})
        edit = await host.call("fs_edit_file", {"path": "f.txt/", "old_string": "hello", "new_string": "bye"})
        grep = await host.call("fs_grep", {"pattern": "hello", "path": "./"})  # a directory: still fine
    for result, path in ((write, "new/"), (read, "f.txt/"), (edit, "f.txt/")):
        assert not result.success, result.output
        assert (result.error["code"], result.error["path"]) == ("not_a_directory", path), result.error
    assert not (work / "new").exists()
    assert (work / "f.txt").read_text() == "hello\n"
    assert grep.success and len(grep.output["matches"]) == 1


async def test_a_directory_where_a_file_is_written_is_is_a_directory_not_a_special_file(tmp_path: Path) -> None:
    """``write_file``/``edit_file`` of an existing directory was refused as ``path_denied``
    ``special_file`` (an ``AuthError``, counted as a denial), where ``write_file(".")`` and
    ``read_file`` of a directory say ``is_a_directory``."""
    work = tmp_path / "work"
    (work / "dir").mkdir(parents=True)
    async with host_for(work) as host:
        write = await host.call("fs_write_file", {"path": "dir", "content": "x"})
        edit = await host.call("fs_edit_file", {"path": "dir", "old_string": "a", "new_string": "b"})
    for result in (write, edit):
        assert (result.error["type"], result.error["code"], result.error["path"]) == (
            "ExecutionError", "is_a_directory", "dir"), result.error
    assert (work / "dir").is_dir()


@pytest.mark.parametrize("tool", ["fs_read_file", "fs_write_file", "fs_edit_file", "fs_grep"])
async def test_a_symlink_flipped_back_to_a_file_mid_call_is_file_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str) -> None:
    """A workspace flipping ``f`` between a regular file and a symlink (to outside, or to the state
    dir) while calls ran: about one call in 300 failed with ``os_error`` "Invalid argument" (the
    name was a symlink when opened or ``lstat``-ed, a file again at its ``readlink``), naming no
    rule. Made deterministic here: the flip lands just before the ``readlink``."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("OUTSIDE-SECRET\n")
    (work / "f").symlink_to(outside / "secret")
    real = os.readlink

    def flip_then_readlink(name: Any, *args: Any, dir_fd: int | None = None) -> Any:
        if dir_fd is not None and name == "f":
            os.unlink("f", dir_fd=dir_fd)
            fd = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dir_fd)
            os.write(fd, b"inside\n")
            os.close(fd)
        return real(name, *args, dir_fd=dir_fd) if dir_fd is not None else real(name, *args)

    args = {"fs_read_file": {"path": "f"}, "fs_write_file": {"path": "f", "content": "new\n"},
            "fs_edit_file": {"path": "f", "old_string": "inside", "new_string": "x"},
            "fs_grep": {"pattern": "SECRET|inside", "path": "f"}}[tool]
    async with host_for(work) as host:
        monkeypatch.setattr(paths.os, "readlink", flip_then_readlink)
        result = await host.call(tool, args)
        monkeypatch.undo()
    assert not result.success, result.output
    assert (result.error["type"], result.error["code"], result.error["path"]) == (
        "ExecutionError", "file_changed", "f"), result.error
    assert (outside / "secret").read_text() == "OUTSIDE-SECRET\n"



@pytest.mark.parametrize(("pattern", "matched"), [
    ("[[:alpha:]x", [":x", "[x"]),  # a class of [ : a l p h, then x: as on ``re``, not RE2's POSIX class
    ("[[:alpha:]]", ["a]"]),
    ("[[:alpha:]*", [":x", "[x", "a]"]),  # RE2 took any letter: bx, e, f
    ("[[=e=]*", ["=", "[x", "e"]),  # the same names, without re's FutureWarning
])
async def test_a_bracket_inside_a_glob_class_is_the_character_as_it_was_on_re(
        tmp_path: Path, pattern: str, matched: list[str]) -> None:
    """Found by review: moving the glob's match from ``re`` to RE2 changed what ``[`` in a class
    means — RE2 reads ``[:alpha:]`` (``[=e=]``, ``[.a.]``) there as a POSIX class — so
    ``[[:alpha:]x`` and ``[[:alpha:]]`` were refused ("RE2 cannot run it") though ``re`` took them,
    and ``[[:alpha:]*`` matched other names (``bx``, ``e``, ``f``: any letter); ``re``, which still
    checks the pattern, also warned (``FutureWarning``, on the host's stderr) on each."""
    import warnings

    work = tmp_path / "work"
    work.mkdir()
    for name in (":x", "[x", "bx", "a]", "b]", "=", "e", "f"):
        (work / name).write_text("a\n")
    async with host_for(work) as host:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = await host.call("fs_glob", {"pattern": pattern})
    assert result.success, result.error
    assert result.output["matches"] == matched
