"""The path-rule engine under attack: every escape attempt is refused, names the rule,
and no byte outside the roots is read or written."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ToolHost

SECRET = "TOP-SECRET-OUTSIDE-CONTENT"


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """root/ (the working dir), outside/ with a secret, root-evil/ (sibling prefix), links."""
    root = tmp_path / "app"
    outside = tmp_path / "outside"
    evil = tmp_path / "app-evil"
    for d in (root, outside, evil, root / "sub"):
        d.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (evil / "secret.txt").write_text(SECRET)
    (root / "ok.txt").write_text("fine\n")
    (root / "sub" / "inner.txt").write_text("inner\n")
    (root / "link_file").symlink_to(outside / "secret.txt")
    (root / "link_dir").symlink_to(outside)
    (root / "sub" / "up").symlink_to("../../outside")
    (root / "inside_link").symlink_to(root / "ok.txt")
    (root / "loop_a").symlink_to(root / "loop_b")
    (root / "loop_b").symlink_to(root / "loop_a")
    os.link(outside / "secret.txt", root / "hardlink.txt")
    os.mkfifo(root / "fifo")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / ".env").write_text("TOKEN=x\n")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock"))
    return {"root": root, "outside": outside, "evil": evil, "sock": sock}  # type: ignore[dict-item]


@pytest.fixture
async def host(layout: dict[str, Any]) -> AsyncIterator[ToolHost]:
    async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir=layout["root"],
                        discover=False) as h:
        yield h
    layout["sock"].close()


def outside_state(layout: dict[str, Any]) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for base in (layout["outside"], layout["evil"]) for p in base.rglob("*")
            if p.is_file()}


# (case, path, rule, the name of the outside file that must never be opened — None when the target is
# inside the root, e.g. a FIFO that is opened O_NONBLOCK and refused after fstat)
READ_ATTEMPTS = [
    ("dotdot", "../outside/secret.txt", "outside_read_roots", "secret.txt"),
    ("dotdot_deep", "sub/../../outside/secret.txt", "outside_read_roots", "secret.txt"),
    ("dotdot_many", "../../../../../../etc/passwd", "outside_read_roots", "passwd"),
    ("absolute_outside", "/etc/passwd", "outside_read_roots", "passwd"),
    ("absolute_secret", "{outside}/secret.txt", "outside_read_roots", "secret.txt"),
    ("sibling_prefix", "{root}-evil/secret.txt", "outside_read_roots", "secret.txt"),
    ("sibling_prefix_dotdot", "../app-evil/secret.txt", "outside_read_roots", "secret.txt"),
    ("symlink_file_out", "link_file", "symlink_escape", "secret.txt"),
    ("symlink_dir_middle", "link_dir/secret.txt", "symlink_escape", "secret.txt"),
    ("relative_symlink_middle", "sub/up/secret.txt", "symlink_escape", "secret.txt"),
    ("symlink_loop", "loop_a", "symlink_loop", None),
    ("fifo", "fifo", "special_file", None),
    ("socket", "sock", "special_file", None),
    ("dev_zero", "/dev/zero", "outside_read_roots", "zero"),
    ("dev_stdin", "/dev/stdin", "outside_read_roots", "stdin"),
    ("proc_self", "/proc/self/environ", "outside_read_roots", "environ"),
    ("tilde", "~/.bashrc", "outside_read_roots", ".bashrc"),
]

_opened: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, bytes)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # process-wide and permanent; records only while a test sets _opened


@contextmanager
def record_opens() -> Iterator[list[str]]:
    """Every path passed to open()/os.open() in any thread meanwhile (dir_fd-relative names as given)."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


@pytest.mark.parametrize(("case", "path", "rule", "never_opened"), READ_ATTEMPTS,
                         ids=[c for c, *_ in READ_ATTEMPTS])
async def test_read_escape_is_refused(host: ToolHost, layout: dict[str, Any], case: str, path: str,
                                      rule: str, never_opened: str | None) -> None:
    path = path.format(root=layout["root"], outside=layout["outside"])
    for tool, args in (("fs_read_file", {"path": path}), ("fs_grep", {"pattern": "SECRET", "path": path})):
        with record_opens() as opened:
            result = await host.call(tool, args)
        assert not result.success, (tool, path)
        assert (result.error["type"], result.error["code"], result.error["rule"]) == \
            ("AuthError", "path_denied", rule), result.error
        assert result.output is None  # nothing was returned, not even a partial page
        assert SECRET not in repr(result)
        if never_opened is not None:  # the target was never even opened
            assert not [p for p in opened if os.path.basename(p) == never_opened], opened


WRITE_ATTEMPTS = [
    ("dotdot", "../outside/new.txt", "outside_write_roots"),
    ("absolute", "{outside}/new.txt", "outside_write_roots"),
    ("sibling_prefix", "{root}-evil/new.txt", "outside_write_roots"),
    ("symlink_file_out", "link_file", "symlink_write"),
    ("symlink_dir_parent", "link_dir/new.txt", "symlink_escape"),
    ("symlink_parent_not_yet_existing", "link_dir/deeper/new.txt", "symlink_escape"),
    ("relative_symlink_parent", "sub/up/new.txt", "symlink_escape"),
    ("hardlink_to_outside", "hardlink.txt", "hardlink"),
    ("git_internals", ".git/config", "denied:.git"),
    ("git_hooks", ".git/hooks/pre-commit", "denied:.git"),
    ("env_file", ".env", "denied:.env*"),
    ("env_variant", "sub/.env.local", "denied:.env*"),
    ("fifo", "fifo", "special_file"),
    ("absolute_etc", "/etc/passwd", "outside_write_roots"),
]


@pytest.mark.parametrize(("case", "path", "rule"), WRITE_ATTEMPTS, ids=[c for c, _, _ in WRITE_ATTEMPTS])
async def test_write_escape_is_refused(host: ToolHost, layout: dict[str, Any], case: str, path: str,
                                       rule: str) -> None:
    before = outside_state(layout)
    path = path.format(root=layout["root"], outside=layout["outside"])
    for tool, args in (("fs_write_file", {"path": path, "content": "PWNED"}),
                       ("fs_edit_file", {"path": path, "old_string": "SECRET", "new_string": "PWNED"})):
        result = await host.call(tool, args)
        assert not result.success, (tool, path)
        assert result.error["type"] == "AuthError", result.error
        assert result.error["rule"] == rule
    assert outside_state(layout) == before
    assert not (layout["outside"] / "deeper").exists()


@pytest.mark.parametrize("path", ["a\x00b", "x" * 5000])
async def test_nul_and_overlong_paths_are_contract_errors(host: ToolHost, path: str) -> None:
    for tool in ("fs_read_file", "fs_list_dir"):
        result = await host.call(tool, {"path": path})
        assert result.error["type"] == "ContractError" and result.error["code"] == "invalid_path"


LONG_NAME = "n" * 300  # over NAME_MAX (255 bytes) for a component, well under the 4096-byte path cap


@pytest.mark.parametrize("path", [LONG_NAME, f"sub/{LONG_NAME}", f"{LONG_NAME}/x.txt", f"sub/{LONG_NAME}/deeper/x"])
async def test_an_over_long_path_component_is_a_contract_error_naming_the_path(host: ToolHost, layout: dict[str, Any],
                                                                               path: str) -> None:
    before = sorted(p.name for p in layout["root"].rglob("*"))
    for tool, args in (("fs_read_file", {"path": path}), ("fs_write_file", {"path": path, "content": "x"}),
                       ("fs_edit_file", {"path": path, "old_string": "a", "new_string": "b"}),
                       ("fs_list_dir", {"path": path}), ("fs_glob", {"pattern": "*", "path": path}),
                       ("fs_grep", {"pattern": "x", "path": path})):
        result = await host.call(tool, args)
        assert (result.error["type"], result.error["code"]) == ("ContractError", "invalid_path"), (tool, result.error)
        assert result.error["path"] == path and path in result.error["message"]
        assert "too long" in result.error["message"] and result.output is None
    assert sorted(p.name for p in layout["root"].rglob("*")) == before  # no parent directory was created


async def test_listing_and_search_do_not_follow_symlinks_out(host: ToolHost) -> None:
    listing = await host.call("fs_list_dir", {"path": "."})
    kinds = {e["name"]: e["type"] for e in listing.output["entries"]}
    assert kinds["link_dir"] == "symlink" and kinds["sub"] == "dir" and kinds["fifo"] == "other"
    found = await host.call("fs_glob", {"pattern": "**/*.txt"})
    # Symlinks are not followed; a hard link is an ordinary file to a reader (documented limit).
    assert found.output["matches"] == ["hardlink.txt", "ok.txt", "sub/inner.txt"]
    grep = await host.call("fs_grep", {"pattern": "SECRET"})
    assert {m["file"] for m in grep.output["matches"]} == {"hardlink.txt"}  # not link_file, link_dir/, sub/up/
    denied = await host.call("fs_list_dir", {"path": "link_dir"})
    assert denied.error["rule"] == "symlink_escape"


async def test_symlinks_inside_the_root_still_work(host: ToolHost) -> None:
    result = await host.call("fs_read_file", {"path": "inside_link"})
    assert result.success and "fine" in result.output["content"]


async def test_special_files_are_refused_without_blocking(host: ToolHost) -> None:
    for tool, args in (("fs_read_file", {"path": "fifo"}), ("fs_grep", {"pattern": "x", "path": "fifo"}),
                       ("fs_read_file", {"path": "sock"})):
        result = await asyncio.wait_for(host.call(tool, args), timeout=5)  # no writer: a blocking open would hang
        assert (result.error["type"], result.error["code"], result.error["rule"]) == \
            ("AuthError", "path_denied", "special_file"), result.error
        assert result.output is None


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom", "/dev/stdin"])
async def test_devices_inside_an_allowed_root_are_refused_without_blocking(tmp_path: Path, device: str) -> None:
    async with ToolHost(config={"plugins": {"filesystem": {"allowed_read_paths": ["/"]}}}, builtins=["filesystem"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        for tool, args in (("fs_read_file", {"path": device}), ("fs_read_file", {"path": device, "limit": 1}),
                           ("fs_grep", {"pattern": "x", "path": device})):
            result = await asyncio.wait_for(host.call(tool, args), timeout=5)
            if device == "/dev/stdin" and os.path.realpath(device).startswith("/proc/"):
                # stdin is a pipe or socket ("pipe:[123]"): its /proc link does not name a path at all
                assert result.error["type"] in ("AuthError", "ExecutionError"), result.error
            else:
                assert (result.error["type"], result.error["code"], result.error["rule"]) == \
                    ("AuthError", "path_denied", "special_file"), (tool, result.error)
            assert result.output is None


async def test_fifo_with_a_writer_inside_the_root_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a FIFO that has data waiting
    os.write(writer, SECRET.encode())
    try:
        async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir=tmp_path,
                            discover=False) as host:
            result = await asyncio.wait_for(host.call("fs_read_file", {"path": "pipe"}), timeout=5)
        assert (result.error["type"], result.error["code"], result.error["rule"]) == \
            ("AuthError", "path_denied", "special_file")
        assert result.output is None and SECRET not in repr(result)
        assert os.read(writer, 100) == SECRET.encode()  # nothing was consumed from the pipe
    finally:
        os.close(writer)


async def test_a_fifo_swapped_in_after_the_edit_check_is_refused_without_blocking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: ``fs_edit_file`` checked the file, then opened it by name without
    ``O_NONBLOCK``; a FIFO renamed over it in between blocked the open for good (the worker
    thread stuck, the process unable to exit). It is refused as ``file_changed``."""
    from amplifier_tools.builtins.filesystem.paths import PathRules

    work = tmp_path / "work"
    work.mkdir()
    (work / "t.txt").write_text("hello\n")
    checked = PathRules.check_replace

    def check_then_swap(self: PathRules, dir_fd: int, name: str, path: str) -> Any:
        found = checked(self, dir_fd, name, path)
        os.mkfifo(work / "fifo.tmp")
        os.rename(work / "fifo.tmp", work / "t.txt")  # what a process racing the call does
        return found

    monkeypatch.setattr(PathRules, "check_replace", check_then_swap)
    async with ToolHost(config={"plugins": {"filesystem": {"require_read_before_write": False}}},
                        builtins=["filesystem"], entry_points=False, working_dir=work, discover=False) as h:
        result = await asyncio.wait_for(
            h.call("fs_edit_file", {"path": "t.txt", "old_string": "hello", "new_string": "bye"}), 20)
    assert result.error is not None and result.error["code"] == "file_changed", result.error


async def test_glob_and_grep_over_more_directories_than_descriptors_miss_nothing(tmp_path: Path) -> None:
    """Found by attack: the walk opened every subdirectory of a level at once; with more of them
    than the process may open descriptors, the rest were skipped unsaid (and other code in the
    process got EMFILE meanwhile). It holds one descriptor per level now."""
    import resource

    work = tmp_path / "work"
    work.mkdir()
    for i in range(1500):
        (work / f"d{i:04d}").mkdir()
    for i in (0, 700, 1499):
        (work / f"d{i:04d}" / "needle.txt").write_text("needle\n")
    async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir=work, discover=False) as h:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        in_use = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 400, hard))
        try:
            found = await h.call("fs_glob", {"pattern": "**/needle.txt"})
            grepped = await h.call("fs_grep", {"pattern": "needle"})
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert found.output["matches"] == ["d0000/needle.txt", "d0700/needle.txt", "d1499/needle.txt"], found.error
    assert grepped.success and len(grepped.output["matches"]) == 3, grepped.output


async def test_a_catastrophic_grep_pattern_does_not_freeze_the_host(tmp_path: Path) -> None:
    """Found by attack: on Python's ``re``, ``(a|a)*b`` against a line of ``a``s held the GIL for
    seconds (doubling per ``a``), freezing every call and timer of the host past the call's own
    timeout. On RE2 it is linear: the search ends at once, with no match."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a" * 40 + "\n")  # about 18 minutes on re
    async with ToolHost(config={"default_timeout_ms": 20_000}, builtins=["filesystem"], entry_points=False,
                        working_dir=work, discover=False) as h:
        result = await asyncio.wait_for(h.call("fs_grep", {"pattern": "(a|a)*b"}), 20)
        assert result.success and result.output["matches"] == [], result.error
        refused = await h.call("fs_grep", {"pattern": "a(?=b)"})
    assert refused.error["code"] == "invalid_pattern" and refused.error["pointer"] == "/pattern"
    assert "lookaround" in refused.error["message"]


async def test_a_root_that_is_not_a_directory_is_named_at_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a new-user trial: ``allowed_read_paths = ["/nonexistent"]`` started without a word
    and every read then failed with ``path_denied``."""
    missing = tmp_path / "no-such-dir"
    config = {"plugins": {"filesystem": {"allowed_read_paths": [str(missing)]}}}
    with caplog.at_level("WARNING", logger="amplifier_tools.filesystem"):
        async with ToolHost(config=config, builtins=["filesystem"], entry_points=False, working_dir=tmp_path,
                            discover=False):
            pass
    assert f"[plugins.filesystem] allowed_read_paths: {missing} is not a directory here" in caplog.text
    assert "allowed_write_paths" not in caplog.text  # the working directory is one
