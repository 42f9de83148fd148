"""The host's own files are out of the filesystem tools' reach (issue 13, finding 2: config takeover).

Every kind of protected path — the config file in use, the config location that does not exist
yet, ``state_dir``, a symlink to each, a protected path behind a symlinked parent or ``..`` — is
refused by every tool with ``AuthError`` ``path_protected`` naming the path and why, never shown
by a listing or a search, and never changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ToolHost

CONFIG_MARKER = "CONFIG-MARKER-5c1d"
STATE_MARKER = "STATE-MARKER-9e2a"


def make_layout(base: Path, state_home: Path, *, with_config: bool) -> dict[str, Path]:
    work = base / "work"
    (work / "sub").mkdir(parents=True)
    (work / "notes.txt").write_text("ordinary notes\n")
    config = work / "amplifier-tools.toml"
    if with_config:
        # Reads may reach state_home, so state_dir is refused for being protected, not for being outside.
        config.write_text(f'# {CONFIG_MARKER}\n[plugins.filesystem]\nallowed_read_paths = [".", "{state_home}"]\n')
    return {"work": work, "config": config}


async def start(layout: dict[str, Path], state_home: Path, *, with_config: bool) -> ToolHost:
    config: Any = str(layout["config"]) if with_config else {
        "plugins": {"filesystem": {"allowed_read_paths": [".", str(state_home)]}}}
    host = ToolHost(config=config, builtins=["filesystem"], entry_points=False, working_dir=layout["work"],
                    discover=False)
    await host.start()
    state_dir = host.state_dir
    (state_dir / "audit.jsonl").write_text(f'{{"record": "{STATE_MARKER}"}}\n')
    (state_dir / "inner").mkdir()
    (state_dir / "inner" / "lock").write_text(STATE_MARKER)
    work = layout["work"]
    (work / "cfg_link").symlink_to(layout["config"])
    (work / "state_link").symlink_to(state_dir)
    (work / "self_link").symlink_to(work)  # a symlinked parent of the config
    (work / "ws_link").symlink_to(state_dir.parent)  # a symlinked parent of state_dir
    layout["state_dir"] = state_dir
    return host


@pytest.fixture
async def hosts(tmp_path: Path, state_home: Path) -> AsyncIterator[Any]:
    """``await hosts(with_config=...)`` -> (a started host, its layout); closed afterwards."""
    made: list[ToolHost] = []

    async def make(*, with_config: bool) -> tuple[ToolHost, dict[str, Path]]:
        layout = make_layout(tmp_path, state_home, with_config=with_config)
        made.append(await start(layout, state_home, with_config=with_config))
        return made[-1], layout

    yield make
    for host in made:
        await host.close()


@pytest.fixture
async def with_config(hosts: Any) -> tuple[ToolHost, dict[str, Path]]:
    return await hosts(with_config=True)


@pytest.fixture
async def no_config(hosts: Any) -> tuple[ToolHost, dict[str, Path]]:
    return await hosts(with_config=False)


def snapshot(layout: dict[str, Path]) -> dict[str, bytes | None]:
    paths = [layout["config"], *sorted(layout["state_dir"].rglob("*"))]
    return {str(p): (p.read_bytes() if p.is_file() else None) for p in paths if p.exists() or p.is_symlink()}


# (case, path relative to the working dir or {state_dir}, what it protects)
FILES = [
    ("config_in_use", "amplifier-tools.toml", "the host's configuration file"),
    ("config_absolute", "{work}/amplifier-tools.toml", "the host's configuration file"),
    ("config_dotdot", "sub/../amplifier-tools.toml", "the host's configuration file"),
    ("config_via_symlink", "cfg_link", "the host's configuration file"),
    ("config_via_symlinked_parent", "self_link/amplifier-tools.toml", "the host's configuration file"),
    ("state_file", "{state_dir}/audit.jsonl", "the host's state directory"),
    ("state_file_deep", "{state_dir}/inner/lock", "the host's state directory"),
    ("state_file_via_symlinked_dir", "state_link/audit.jsonl", "the host's state directory"),
    ("state_file_via_symlinked_parent", "ws_link/{state_name}/audit.jsonl", "the host's state directory"),
    ("state_file_dotdot", "{state_dir}/inner/../audit.jsonl", "the host's state directory"),
]
DIRS = [
    ("state_dir", "{state_dir}"),
    ("state_dir_via_symlink", "state_link"),
    ("state_subdir_via_symlink", "state_link/inner"),
    ("state_dir_via_symlinked_parent", "ws_link/{state_name}"),
]


def fill(template: str, layout: dict[str, Path]) -> str:
    return template.format(work=layout["work"], state_dir=layout["state_dir"], state_name=layout["state_dir"].name)


def assert_protected(result: Any, tool: str, path: str) -> None:
    assert not result.success, (tool, path)
    assert (result.error["type"], result.error["code"]) == ("AuthError", "path_protected"), (tool, result.error)
    assert result.error["path"] == path and repr(path) in result.error["message"], result.error
    assert "protected" in result.error["message"] and result.error["reason"] in result.error["message"]
    assert result.error["hint"]
    assert result.output is None
    assert CONFIG_MARKER not in repr(result) and STATE_MARKER not in repr(result)


@pytest.mark.parametrize(("case", "path", "reason"), FILES, ids=[c for c, _, _ in FILES])
async def test_every_tool_refuses_a_protected_file(with_config: tuple[ToolHost, dict[str, Path]], case: str,
                                                    path: str, reason: str) -> None:
    host, layout = with_config
    path = fill(path, layout)
    before = snapshot(layout)
    for tool, args in (("fs_read_file", {"path": path}),
                       ("fs_write_file", {"path": path, "content": "[plugins.bash]\nsandbox = 'none'\n"}),
                       ("fs_edit_file", {"path": path, "old_string": "#", "new_string": "PWNED"}),
                       ("fs_grep", {"pattern": "MARKER", "path": path}),
                       ("fs_list_dir", {"path": path}),
                       ("fs_glob", {"pattern": "*", "path": path})):
        result = await host.call(tool, args)
        assert_protected(result, tool, path)
        assert result.error["reason"] == reason
        assert result.error["protected"] in result.error["message"]
    assert snapshot(layout) == before


@pytest.mark.parametrize(("case", "path"), DIRS, ids=[c for c, _ in DIRS])
async def test_every_tool_refuses_a_protected_directory(with_config: tuple[ToolHost, dict[str, Path]], case: str,
                                                         path: str) -> None:
    host, layout = with_config
    path = fill(path, layout)
    before = snapshot(layout)
    for tool, args in (("fs_list_dir", {"path": path}), ("fs_glob", {"pattern": "**", "path": path}),
                       ("fs_grep", {"pattern": "MARKER", "path": path}), ("fs_read_file", {"path": path}),
                       ("fs_write_file", {"path": f"{path}/planted.txt", "content": "x"}),
                       ("fs_write_file", {"path": f"{path}/new/deeper/planted.txt", "content": "x"}),
                       ("fs_edit_file", {"path": f"{path}/audit.jsonl", "old_string": "{", "new_string": "["})):
        assert_protected(await host.call(tool, args), tool, args["path"])
    assert snapshot(layout) == before
    assert not (layout["state_dir"] / "new").exists()


async def test_listings_and_searches_never_show_protected_entries(
        with_config: tuple[ToolHost, dict[str, Path]]) -> None:
    host, layout = with_config
    listing = await host.call("fs_list_dir", {"path": "."})
    names = {e["name"] for e in listing.output["entries"]}
    assert "amplifier-tools.toml" not in names and {"notes.txt", "sub", "cfg_link"} <= names
    found = await host.call("fs_glob", {"pattern": "**"})
    assert found.output["matches"] == ["notes.txt"]
    grep = await host.call("fs_grep", {"pattern": "MARKER|notes"})
    assert [m["file"] for m in grep.output["matches"]] == ["notes.txt"]
    # Rooted above state_dir (the read roots reach it): state_dir is skipped, not searched.
    state_home = str(layout["state_dir"].parent.parent.parent)
    for tool, args in (("fs_glob", {"pattern": "**", "path": state_home}),
                       ("fs_grep", {"pattern": "MARKER", "path": state_home})):
        result = await host.call(tool, args)
        assert result.success, result.error
        assert STATE_MARKER not in repr(result.output) and "audit.jsonl" not in repr(result.output)
    # Every workspace's state is protected, not only this host's: the whole state root is hidden.
    above = await host.call("fs_list_dir", {"path": state_home})
    assert "amplifier-tools" not in {e["name"] for e in above.output["entries"]}
    other = await host.call("fs_list_dir", {"path": str(layout["state_dir"].parent)})
    assert other.error["code"] == "path_protected"


async def test_the_config_location_that_does_not_exist_yet_cannot_be_planted(
        no_config: tuple[ToolHost, dict[str, Path]]) -> None:
    host, layout = no_config
    assert not layout["config"].exists()
    for path in ("amplifier-tools.toml", "sub/../amplifier-tools.toml", "self_link/amplifier-tools.toml",
                 str(layout["config"])):
        write = await host.call("fs_write_file", {"path": path, "content": "[plugins.bash]\nsandbox = 'none'\n"})
        assert_protected(write, "fs_write_file", path)
        assert write.error["reason"] == "a configuration file location"
        read = await host.call("fs_read_file", {"path": path})
        assert_protected(read, "fs_read_file", path)  # not "not_found": same answer whether it exists or not
    assert not layout["config"].exists() and not layout["config"].is_symlink()
    # A dangling symlink to the missing config is no way in either.
    (layout["work"] / "dangling").symlink_to(layout["config"])
    for tool, args in (("fs_write_file", {"path": "dangling", "content": "x"}), ("fs_read_file", {"path": "dangling"})):
        assert_protected(await host.call(tool, args), tool, "dangling")
    assert not layout["config"].exists()


async def test_a_config_file_outside_the_working_directory_is_protected_too(tmp_path: Path) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "etc"
    work.mkdir()
    elsewhere.mkdir()
    config = elsewhere / "tools.toml"
    config.write_text(f'# {CONFIG_MARKER}\n[plugins.filesystem]\nallowed_read_paths = [".", "{elsewhere}"]\n'
                      f'allowed_write_paths = [".", "{elsewhere}"]\n')
    async with ToolHost(config=str(config), builtins=["filesystem"], entry_points=False, working_dir=work,
                        discover=False) as host:
        before = config.read_bytes()
        for tool, args in (("fs_read_file", {"path": str(config)}),
                           ("fs_write_file", {"path": str(config), "content": "x"}),
                           ("fs_edit_file", {"path": str(config), "old_string": "#", "new_string": "x"})):
            assert_protected(await host.call(tool, args), tool, str(config))
        listing = await host.call("fs_list_dir", {"path": str(elsewhere)})
        assert listing.output["entries"] == []
        assert (await host.call("fs_write_file", {"path": str(elsewhere / "other.txt"), "content": "ok"})).success
        assert config.read_bytes() == before


async def test_ordinary_files_beside_protected_ones_still_work(with_config: tuple[ToolHost, dict[str, Path]]) -> None:
    host, _ = with_config
    assert (await host.call("fs_write_file", {"path": "amplifier-tools.toml.bak", "content": "x"})).success
    assert (await host.call("fs_edit_file", {"path": "notes.txt", "old_string": "ordinary",
                                             "new_string": "plain"})).success
    assert (await host.call("fs_read_file", {"path": "self_link/notes.txt"})).success
