"""Attack tests for the one path engine (issue 14, findings 1 and 8): directory walks never name or
search denied entries, and rewritten files never keep setuid, setgid or sticky bits."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import PluginLoadError, ToolHost
from amplifier_tools.builtins.filesystem import tools as fs_tools

ROOT = Path(__file__).resolve().parent.parent

SECRET = "TOKEN-8c1f"


async def start(root: Path, **plugin_config: Any) -> ToolHost:
    host = ToolHost(config={"plugins": {"filesystem": plugin_config}} if plugin_config else None,
                    builtins=["filesystem"], entry_points=False, working_dir=root, discover=False)
    await host.start()
    return host


def hostile_workspace(root: Path) -> None:
    """A workspace whose secrets sit in every kind of denied place, plus one visible file."""
    (root / "visible.txt").write_text(f"public {SECRET}\n")
    (root / "secrets").mkdir()
    (root / "secrets" / "key.txt").write_text(f"{SECRET}\n")
    (root / "secrets-old.txt").write_text(f"{SECRET}\n")
    (root / ".env").write_text(f"API={SECRET}\n")
    (root / "sub").mkdir()
    (root / "sub" / ".env.local").write_text(f"API={SECRET}\n")
    (root / "build").mkdir()
    (root / "build" / "out.txt").write_text(f"{SECRET}\n")
    (root / "private").mkdir()
    (root / "private" / "notes.txt").write_text(f"{SECRET}\n")


@pytest.fixture
async def denied_host(tmp_path: Path) -> AsyncIterator[ToolHost]:
    hostile_workspace(tmp_path)
    host = await start(tmp_path, denied_paths=["secrets*", ".env*", "build/*", str(tmp_path / "private")])
    yield host
    await host.close()


DENIED_NAMES = ("secrets", "key.txt", "secrets-old.txt", ".env", ".env.local", "out.txt", "private", "notes.txt")


async def test_grep_never_searches_or_names_denied_entries(denied_host: ToolHost) -> None:
    result = await denied_host.call("fs_grep", {"pattern": SECRET})
    assert result.success, result.error
    assert [m["file"] for m in result.output["matches"]] == ["visible.txt"]
    assert result.output["files_searched"] == 1


async def test_glob_never_names_denied_entries(denied_host: ToolHost) -> None:
    result = await denied_host.call("fs_glob", {"pattern": "**"})
    assert result.success, result.error
    assert result.output["matches"] == ["visible.txt"]
    assert not any(name in str(result.output) for name in DENIED_NAMES)


async def test_list_dir_never_names_denied_entries(denied_host: ToolHost) -> None:
    top = await denied_host.call("fs_list_dir", {"path": "."})
    names = {entry["name"] for entry in top.output["entries"]}
    assert names == {"visible.txt", "sub", "build"}  # 'build' itself is not denied by 'build/*'; its entries are
    assert (await denied_host.call("fs_list_dir", {"path": "build"})).output["entries"] == []
    assert (await denied_host.call("fs_list_dir", {"path": "sub"})).output["entries"] == []


@pytest.mark.parametrize("start", ["secrets", "private", "sub/.env.local", "build/out.txt"])
async def test_a_walk_rooted_at_a_denied_path_is_refused(denied_host: ToolHost, start: str) -> None:
    for tool, args in (("fs_grep", {"pattern": "."}), ("fs_glob", {"pattern": "**"}), ("fs_list_dir", {})):
        result = await denied_host.call(tool, {**args, "path": start})
        assert result.error is not None and result.error["code"] == "path_denied", (tool, result)
        assert SECRET not in str(result.error)


async def test_a_symlink_inside_the_root_to_a_denied_dir_is_refused(tmp_path: Path) -> None:
    hostile_workspace(tmp_path)
    (tmp_path / "innocent").symlink_to("secrets")
    host = await start(tmp_path, denied_paths=["secrets*", ".env*", "build/*", str(tmp_path / "private")])
    try:
        for tool, args in (("fs_read_file", {"path": "innocent/key.txt"}),
                           ("fs_grep", {"pattern": ".", "path": "innocent"}),
                           ("fs_glob", {"pattern": "**", "path": "innocent"}),
                           ("fs_list_dir", {"path": "innocent"})):
            result = await host.call(tool, args)
            assert result.error is not None and result.error["rule"] == "denied:secrets*", (tool, result)
        walk = await host.call("fs_grep", {"pattern": SECRET})  # the walk lists the link, never follows it
        assert [m["file"] for m in walk.output["matches"]] == ["visible.txt"]
    finally:
        await host.close()


async def test_a_fifo_in_a_grep_walk_does_not_block(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(f"{SECRET}\n")
    os.mkfifo(tmp_path / "pipe")
    host = await start(tmp_path)
    try:
        result = await host.call("fs_grep", {"pattern": SECRET})
        assert [m["file"] for m in result.output["matches"]] == ["a.txt"]
        single = await host.call("fs_grep", {"pattern": SECRET, "path": "pipe"})
        assert single.error["rule"] == "special_file"
    finally:
        await host.close()


# -- finding 8: modes ---------------------------------------------------------------------------


@pytest.mark.parametrize("before", [0o4755, 0o2755, 0o6755, 0o1644])
async def test_a_replaced_file_keeps_its_permission_bits_but_never_setuid_setgid_or_sticky(
        tmp_path: Path, before: int) -> None:
    host = await start(tmp_path)
    try:
        for tool, args in (("fs_write_file", {"content": "x = 1\n"}),
                           ("fs_edit_file", {"old_string": "1", "new_string": "2"})):
            target = tmp_path / f"{tool}.sh"
            target.write_text("x = 1\n")
            os.chmod(target, before)
            result = await host.call(tool, {"path": target.name, **args})
            assert result.success, result.error
            assert stat.S_IMODE(target.stat().st_mode) == before & 0o777, tool
    finally:
        await host.close()


async def test_a_new_file_is_0644_minus_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fs_tools, "UMASK", 0o002)  # a group-writable umask must not make new files 0664
    host = await start(tmp_path)
    try:
        assert (await host.call("fs_write_file", {"path": "new.txt", "content": "x"})).success
        assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o644
    finally:
        await host.close()


@pytest.mark.parametrize("configured", [0o600, "0640", "0o640"])
async def test_new_file_mode_is_configurable(tmp_path: Path, configured: Any) -> None:
    host = await start(tmp_path, new_file_mode=configured)
    try:
        assert (await host.call("fs_write_file", {"path": "new.txt", "content": "x"})).success
        expected = configured if isinstance(configured, int) else 0o640
        assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == expected
    finally:
        await host.close()


@pytest.mark.parametrize("bad", [0o4755, 0o1000, -1, "rw-r--r--", True, 1.5])
async def test_a_bad_new_file_mode_fails_start_naming_the_key(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(PluginLoadError, match=r"plugins\.filesystem\.new_file_mode: .*e\.g\. new_file_mode = 0o640"):
        await start(tmp_path, new_file_mode=bad)


class _SwapOnOpen:
    """``os`` for the tools module, except that opening ``pub`` first swaps it for a symlink to ``secrets``:
    a denied directory swapped in between the walk's listing and its open of the entry."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self.swapped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "pub" and not self.swapped:
            self.swapped = True
            (self._root / "pub").rename(self._root / "pub-was")
            (self._root / "pub").symlink_to("secrets")
        return os.open(path, flags, *args, **kwargs)


async def test_a_denied_dir_swapped_in_during_a_walk_is_not_entered(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    hostile_workspace(tmp_path)
    (tmp_path / "pub").mkdir()
    (tmp_path / "pub" / "p.txt").write_text(f"{SECRET}\n")
    host = await start(tmp_path, denied_paths=["secrets*"])
    try:
        swap = _SwapOnOpen(tmp_path)
        monkeypatch.setattr(fs_tools, "os", swap)
        result = await host.call("fs_grep", {"pattern": SECRET, "glob": "**/*.txt"})
        assert swap.swapped
        assert result.success and "key.txt" not in str(result.output), result.output
    finally:
        await host.close()


def _resolution(method: Any, current: str) -> str:
    try:
        return str(method(current, current))
    except Exception as exc:  # compared by kind
        return f"error:{getattr(exc, 'code', type(exc).__name__)}"


def test_the_kernels_resolution_agrees_with_the_component_walk(tmp_path: Path) -> None:
    """``resolve_real`` asks the kernel (an O_PATH open and its /proc/self/fd link) and falls back
    to a component walk; on a hostile tree both must give the same path for every spelling."""
    import itertools
    import random

    from amplifier_tools.builtins.filesystem.paths import PathRules

    root = tmp_path / "w"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    (root / "a" / "g").write_text("x")
    os.mkfifo(root / "a" / "fifo")
    links = {"up": "..", "abs": str(root / "a" / "b"), "rel": "a/b", "deep": "a/b/f", "dangling": "nowhere/x",
             "loop1": "loop2", "loop2": "loop1", "self": ".", "file_as_dir": "a/g", "to_fifo": "a/fifo",
             "chain": "rel", "root": "/", "proc": "/proc/self/root" + str(root)}
    for name, target in links.items():
        (root / name).symlink_to(target)
    (root / "a" / "back").symlink_to("../rel")
    parts = [*links, "a", "b", "f", "g", "back", "..", ".", "missing", "fifo"]
    rng = random.Random(14)
    spellings = {"/".join(combo) for combo in itertools.product(parts[:8], repeat=2)}
    spellings |= {"/".join(rng.choice(parts) for _ in range(rng.randint(1, 5))) for _ in range(1500)}
    rules = PathRules(str(root), read_roots=[str(root)], write_roots=[str(root)])
    checked = 0
    for spelling in sorted(spellings):
        for current in (rules.normalize(spelling), os.path.join(str(root), spelling)):
            assert _resolution(rules._followed, current) == _resolution(rules._readlinks, current), \
                spelling
            checked += 1
    assert checked > 2000


def test_one_name_in_the_working_directory_resolves_as_the_kernel_walk_does(tmp_path: Path) -> None:
    """A single name takes ``resolve_real``'s one-``lstat`` path; for every kind of entry of a
    hostile working directory (symlinks in, out, dangling, looping, to /proc, a FIFO, a socket,
    directories, missing names) its answer must be the kernel walk's."""
    import socket

    from amplifier_tools.builtins.filesystem.paths import PathRules

    root = tmp_path / "w"
    (root / "d").mkdir(parents=True)
    (root / "f").write_text("x")
    os.mkfifo(root / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock"))
    outside = tmp_path / "outside"
    outside.write_text("secret")
    links = {"out": str(outside), "rel": "d", "up": "..", "dangling": "nowhere", "loop1": "loop2",
             "loop2": "loop1", "self": ".", "proc": "/proc/self/root" + str(outside), "to_fifo": "fifo"}
    for name, target in links.items():
        (root / name).symlink_to(target)
    names = [*links, "d", "f", "fifo", "sock", "missing", "with space", "-", "x" * 300, ".hidden"]
    fast = PathRules(str(root), read_roots=[str(root)], write_roots=[str(root)])
    walked = PathRules(str(root), read_roots=[str(root)], write_roots=[str(root)])
    walked._one_name = lambda path: False  # type: ignore[method-assign]
    taken = 0
    try:
        for name in names:
            assert _resolution(lambda p, _: fast.resolve_real(p), name) == \
                _resolution(lambda p, _: walked.resolve_real(p), name), name
            taken += fast._one_name(name)
    finally:
        sock.close()
    assert taken == len(names)
    assert fast.resolve_real("out") == (str(outside),)
    assert fast.resolve_real("f") == (str(root / "f"),)


def test_one_name_follows_a_working_directory_swapped_for_a_symlink(tmp_path: Path) -> None:
    """The working directory renamed away and a symlink to the host's state put in its place: a
    single name must resolve where the kernel will open it (the state directory), not where the
    working directory used to be. Found by review of the one-``lstat`` path (it answered the old
    place, and the guard let a third-party tool write the audit log)."""
    from amplifier_tools.builtins.filesystem.paths import PathRules

    work, state = tmp_path / "proj", tmp_path / "state"
    work.mkdir()
    state.mkdir()
    (state / "audit.jsonl").write_text("{}\n")
    rules = PathRules(str(work), read_roots=[str(work)], write_roots=[str(work)])
    assert rules.resolve_real("audit.jsonl") == (str(work / "audit.jsonl"),)
    work.rename(tmp_path / "proj-moved")
    work.symlink_to(state)
    assert rules.resolve_real("audit.jsonl") == (str(state / "audit.jsonl"),)
    assert rules.resolve_real("new-file") == (str(state / "new-file"),)


_BIND_DELETED = """
import os, subprocess, sys, tempfile
from amplifier_tools.builtins.filesystem.paths import PathRules
from amplifier_tools.errors import ContractError
base = tempfile.mkdtemp()
work = os.path.join(base, "work"); os.mkdir(work)
open(os.path.join(work, "mp"), "w").close()
gone = os.path.join(base, "gone"); open(gone, "w").close()
subprocess.run(["mount", "--bind", gone, os.path.join(work, "mp")], check=True)
os.unlink(gone)
fast = PathRules(work, read_roots=[work], write_roots=[work])
walked = PathRules(work, read_roots=[work], write_roots=[work])
walked._one_name = lambda path: False
def answer(rules):
    try:
        return rules.resolve_real("mp")
    except ContractError as exc:
        return exc.code
print(answer(fast), answer(walked))
subprocess.run(["umount", os.path.join(work, "mp")], check=True)
import shutil; shutil.rmtree(base)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_one_name_bound_to_a_deleted_file_is_refused_as_the_walk_refuses_it() -> None:
    """A name in the working directory that is a bind mount of a deleted file leads to no path: the
    walk refuses it (``unresolvable_path``, which a policy deny rule counts as a match); the
    one-``lstat`` path must not answer the name instead. Found by attack. Run in a mount namespace
    of its own, so no mount is left behind."""
    run = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _BIND_DELETED],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if run.returncode != 0 and "unshare failed" in run.stderr:
        pytest.skip(f"no mount namespace here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["unresolvable_path", "unresolvable_path"]
