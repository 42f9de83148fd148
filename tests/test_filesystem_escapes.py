"""The path-rule engine under attack: every escape attempt is refused, names the rule,
and no byte outside the roots is read or written."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
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


READ_ATTEMPTS = [
    ("dotdot", "../outside/secret.txt", "outside_read_roots"),
    ("dotdot_deep", "sub/../../outside/secret.txt", "outside_read_roots"),
    ("dotdot_many", "../../../../../../etc/passwd", "outside_read_roots"),
    ("absolute_outside", "/etc/passwd", "outside_read_roots"),
    ("absolute_secret", "{outside}/secret.txt", "outside_read_roots"),
    ("sibling_prefix", "{root}-evil/secret.txt", "outside_read_roots"),
    ("sibling_prefix_dotdot", "../app-evil/secret.txt", "outside_read_roots"),
    ("symlink_file_out", "link_file", "symlink_escape"),
    ("symlink_dir_middle", "link_dir/secret.txt", "symlink_escape"),
    ("relative_symlink_middle", "sub/up/secret.txt", "symlink_escape"),
    ("symlink_loop", "loop_a", "symlink_loop"),
    ("fifo", "fifo", "special_file"),
    ("socket", "sock", "special_file"),
    ("dev_zero", "/dev/zero", "outside_read_roots"),
    ("dev_stdin", "/dev/stdin", "outside_read_roots"),
    ("proc_self", "/proc/self/environ", "outside_read_roots"),
    ("tilde", "~/.bashrc", "outside_read_roots"),
]


@pytest.mark.parametrize(("case", "path", "rule"), READ_ATTEMPTS, ids=[c for c, _, _ in READ_ATTEMPTS])
async def test_read_escape_is_refused(host: ToolHost, layout: dict[str, Any], case: str, path: str,
                                      rule: str) -> None:
    path = path.format(root=layout["root"], outside=layout["outside"])
    for tool, args in (("fs_read_file", {"path": path}), ("fs_grep", {"pattern": "SECRET", "path": path})):
        result = await host.call(tool, args)
        assert not result.success, (tool, path)
        assert result.error["type"] == "AuthError", result.error
        assert result.error["rule"] == rule
        assert SECRET not in repr(result)


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
    import asyncio

    result = await asyncio.wait_for(host.call("fs_read_file", {"path": "fifo"}), timeout=5)
    assert result.error["rule"] == "special_file"
