"""The host's own files are out of bash's reach (issue 13, findings 1, 2 and 5).

From inside the bubblewrap sandbox: the config file in use cannot be read, rewritten, removed
or renamed away; ``state_dir`` is an empty read-only directory, so the audit log there cannot
be read or swapped for a symlink to a host file. Spill files are host state: under
``state_dir``, created without following symlinks, and refused at start inside a writable root.
Sandbox tests run outside /tmp (the sandbox's /tmp is private, which would hide the files anyway)
and are skipped only when ``bwrap`` is not installed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bash_helpers import bash_host, needs_bwrap

from amplifier_tools import ToolHost
from amplifier_tools.builtins.bash.capture import open_spill_files
from amplifier_tools.errors import ConfigError, ToolSystemError
from amplifier_tools.sandbox import View, mask_argv

CONFIG_MARKER = "CONFIG-MARKER-77aa"
STATE_MARKER = "STATE-MARKER-31bd"


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="amp-protected-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tree(root: Path) -> dict[str, tuple[str, bytes | str | None]]:
    """Every path below ``root`` (and ``root``): its kind and content (symlink: target)."""
    out: dict[str, tuple[str, bytes | str | None]] = {}
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            out[str(path)] = ("symlink", os.readlink(path))
        elif path.is_file():
            out[str(path)] = ("file", path.read_bytes())
        else:
            out[str(path)] = ("dir", None)
    return out


async def sandboxed_host(base: Path, config_path: Path, **bash: object) -> ToolHost:
    state = base / "state"
    settings = "".join(f"{k} = {v!r}\n" for k, v in bash.items())
    (base / "work").mkdir(exist_ok=True)
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(f'# {CONFIG_MARKER}\nstate_dir = "{state}"\n[plugins.bash]\nsandbox = "bubblewrap"\n'
                           f"{settings}")
    host = ToolHost(config=str(config_path), builtins=["bash"], entry_points=False, working_dir=base / "work",
                    discover=False)
    await host.start()
    (host.state_dir / "audit.jsonl").write_text(f'{{"r": "{STATE_MARKER}"}}\n')
    (host.state_dir / "locks").mkdir()
    return host


@needs_bwrap
async def test_sandboxed_bash_cannot_read_or_take_over_the_config_file(base: Path) -> None:
    work = base / "work"
    config = work / "amplifier-tools.toml"
    host = await sandboxed_host(base, config)
    before = config.read_bytes()
    try:
        for command in ("cat amplifier-tools.toml", "grep -r MARKER .", "cp amplifier-tools.toml copy; cat copy",
                        "ln -s amplifier-tools.toml link; cat link", "ln -s . here; cat here/amplifier-tools.toml",
                        "cat sub/../amplifier-tools.toml", "tar c amplifier-tools.toml | strings"):
            result = await host.call("bash", {"command": command})
            assert CONFIG_MARKER not in repr(result), command
        for command in ("printf '[plugins.bash]\\nsandbox = \"none\"\\n' > amplifier-tools.toml",
                        "printf 'x' >> amplifier-tools.toml", "truncate -s 0 amplifier-tools.toml",
                        "rm -f amplifier-tools.toml", "mv amplifier-tools.toml gone.toml",
                        "mv -f copy amplifier-tools.toml", "ln -sf /etc/passwd amplifier-tools.toml",
                        "ln amplifier-tools.toml hard.toml && echo pwned >> hard.toml",
                        "echo pwned > here/amplifier-tools.toml",
                        "python3 -c \"import os; os.rename('copy', 'amplifier-tools.toml')\""):
            await host.call("bash", {"command": command})
            assert config.is_file() and not config.is_symlink(), command
            assert config.read_bytes() == before, command
    finally:
        await host.close()


@needs_bwrap
async def test_a_config_file_in_a_subdirectory_cannot_be_moved_aside_and_replaced(base: Path) -> None:
    work = base / "work"
    config = work / "conf" / "deep" / "tools.toml"
    host = await sandboxed_host(base, config)
    before = config.read_bytes()
    try:
        for command in ("mv conf conf2 && mkdir -p conf/deep && echo '# planted' > conf/deep/tools.toml",
                        "mv conf/deep conf/deep2 && mkdir conf/deep && echo '# planted' > conf/deep/tools.toml",
                        "rm -rf conf", "rmdir conf/deep"):
            await host.call("bash", {"command": command})
            assert config.read_bytes() == before, command
        assert (await host.call("bash", {"command": "echo ok > conf/deep/other.txt"})).success  # still usable
    finally:
        await host.close()


@needs_bwrap
async def test_sandboxed_bash_cannot_see_or_change_the_state_dir(base: Path) -> None:
    victim = base / "home" / ".bashrc"
    victim.parent.mkdir()
    victim.write_text("# the user's shell profile\n")
    # ``base`` read-only in the view: the state directory would be visible there, so it is masked.
    host = await sandboxed_host(base, base / "etc" / "tools.toml", sandbox_read_paths=[str(base)])
    state = host.state_dir
    before, victim_before = tree(state), victim.read_bytes()
    try:
        listing = await host.call("bash", {"command": f"ls -A {state}"})
        assert listing.success and listing.output["stdout"] == "", listing.output  # an empty directory
        for command in (f"cat {state}/audit.jsonl", f"grep -r MARKER {state.parent}",
                        f"ln -s {state} st; cat st/audit.jsonl; ls -A st",
                        f"ln -s {state.parent} ws; cat ws/{state.name}/audit.jsonl"):
            result = await host.call("bash", {"command": command})
            assert STATE_MARKER not in repr(result), command
        for command in (f"ln -sf {victim} {state}/audit.jsonl",  # finding 1: the log swapped for a symlink
                        f"rm -f {state}/audit.jsonl && ln -s {victim} {state}/audit.jsonl",
                        f"echo planted > {state}/planted", f"mkfifo {state}/audit.jsonl.lock",
                        f"rm -rf {state}/locks", f"mv {state} {state}.old", f"chmod 777 {state}",
                        f"umount {state}", f"mount -o remount,rw {state}"):
            await host.call("bash", {"command": command})
            assert tree(state) == before, command
        assert victim.read_bytes() == victim_before
    finally:
        await host.close()


@needs_bwrap
async def test_a_protected_path_replaced_by_a_symlink_stops_the_call(base: Path) -> None:
    work = base / "work"
    config = work / "amplifier-tools.toml"
    host = await sandboxed_host(base, config)
    try:
        config.rename(work / "real.toml")
        config.symlink_to(work / "real.toml")  # done behind the host's back, not from the sandbox
        result = await host.call("bash", {"command": "touch ran"})
        assert (result.error["type"], result.error["code"]) == ("SystemError", "sandbox_failed"), result.error
        assert str(config) in result.error["message"] and not (work / "ran").exists()
    finally:
        await host.close()


async def test_bash_cwd_in_the_state_dir_is_refused(tmp_path: Path) -> None:
    host = await bash_host(tmp_path)
    try:
        result = await host.call("bash", {"command": "touch ran", "cwd": str(host.state_dir)})
        assert (result.error["type"], result.error["code"]) == ("AuthError", "path_protected"), result.error
        assert not (host.state_dir / "ran").exists()
    finally:
        await host.close()


async def test_a_spill_dir_inside_the_working_directory_is_refused_at_start(tmp_path: Path) -> None:
    for spill_dir in (str(tmp_path / "spill"), str(tmp_path)):
        with pytest.raises(ConfigError) as info:
            await bash_host(tmp_path, spill_dir=spill_dir, max_output_bytes=10)
        assert info.value.key == "plugins.bash.spill_dir" and spill_dir in str(info.value)
    assert not (tmp_path / "spill").exists()  # refused before anything was created


async def test_spill_files_are_under_the_state_dir_and_protected(tmp_path: Path) -> None:
    async with ToolHost(config={"plugins": {"bash": {"spill_dir": "bash-spill", "max_output_bytes": 10}}},
                        builtins=["bash", "filesystem"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        result = await host.call("bash", {"command": "seq 1 1000"})
        spilled = Path(result.output["stdout_file"])
        assert spilled.parent == host.state_dir / "bash-spill" and not list(tmp_path.iterdir())
        read = await host.call("fs_read_file", {"path": str(spilled)})
        assert read.error["code"] in ("path_protected", "path_denied")


async def test_a_spill_dir_replaced_by_a_symlink_fails_closed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    host = await bash_host(work, spill_dir="bash-spill")
    try:
        (host.state_dir / "bash-spill").symlink_to(victim)  # finding 5
        result = await host.call("bash", {"command": "touch ran"})
        assert (result.error["type"], result.error["code"]) == ("SystemError", "spill_failed"), result.error
        assert str(host.state_dir / "bash-spill") in result.error["message"]
        assert list(victim.iterdir()) == [] and not (work / "ran").exists()
    finally:
        await host.close()


@pytest.mark.parametrize("plant", ["symlink", "fifo", "file"])
def test_a_planted_spill_file_is_never_followed_or_opened(tmp_path: Path, plant: str) -> None:
    spill, victim = tmp_path / "spill", tmp_path / "victim.txt"
    spill.mkdir(mode=0o700)
    victim.write_text("keep")
    name = spill / f"bash-call-{os.getpid()}.stderr"
    if plant == "symlink":
        name.symlink_to(victim)
    elif plant == "fifo":
        os.mkfifo(name)
    else:
        name.write_text("someone else's")
    with pytest.raises(ToolSystemError) as info:
        open_spill_files(str(spill), "call")
    assert info.value.code == "spill_failed" and str(name) in info.value.message
    assert victim.read_text() == "keep"
    assert [p.name for p in spill.iterdir()] == [name.name]  # the stdout file made first was removed again


@pytest.mark.parametrize("sandbox", [pytest.param("bubblewrap", marks=needs_bwrap), "none"])
async def test_planting_the_missing_config_file_fails_the_call_and_names_it(base: Path, sandbox: str) -> None:
    # The documented gap: a path that does not exist cannot be masked. The call that creates it is
    # reported (never silently successful), so the operator can remove it before the next start.
    work = base / "work"
    work.mkdir()
    host = await bash_host(work, sandbox=sandbox)
    try:
        assert (await host.call("bash", {"command": "touch other.toml"})).success  # no false alarm
        result = await host.call("bash", {"command": "printf '[plugins.bash]\\nsandbox = \"none\"\\n' > "
                                                     "amplifier-tools.toml"})
        assert (result.error["type"], result.error["code"]) == ("AuthError", "path_protected"), result.error
        config = str(work / "amplifier-tools.toml")
        assert result.error["path"] == config and config in result.error["message"]
        assert "a configuration file location" in result.error["message"]
    finally:
        await host.close()


@needs_bwrap
async def test_a_path_a_plugin_protects_after_start_is_masked_from_the_next_call(base: Path) -> None:
    host = await sandboxed_host(base, base / "etc" / "tools.toml", sandbox_read_paths=[str(base)])
    log = base / "logs" / "audit.jsonl"
    log.parent.mkdir()
    log.write_text(STATE_MARKER)
    try:
        assert STATE_MARKER in (await host.call("bash", {"command": f"cat {log}"})).output["stdout"]
        host.protected_paths.add(log, "the audit log", key="plugins.audit.path")
        result = await host.call("bash", {"command": f"cat {log}; echo x > {log}; cat {log.parent}/*"})
        assert STATE_MARKER not in repr(result) and log.read_text() == STATE_MARKER
    finally:
        await host.close()


def test_mask_arguments_hide_each_existing_protected_path_once(base: Path) -> None:
    work, state = base / "work", base / "state"
    (work / "conf" / "deep").mkdir(parents=True)
    (work / "conf" / "deep" / "tools.toml").write_text("x")
    (state / "locks").mkdir(parents=True)
    (state / "audit.jsonl").write_text("x")
    hidden_tmp = Path("/tmp/amp-not-visible-in-the-sandbox")
    protected = (str(work / "conf" / "deep" / "tools.toml"), str(state), str(state / "audit.jsonl"),
                 str(work / "amplifier-tools.toml"), str(hidden_tmp))
    # ``base`` read-only makes the state directory visible, so it must be masked; /tmp is replaced anyway.
    argv = mask_argv(View(cwd=str(work), writable=(str(work),), read_only=(str(base),), protected=protected))
    assert argv == ["--tmpfs", str(state), "--remount-ro", str(state),  # audit.jsonl: below a masked dir
                    "--bind", str(work / "conf"), str(work / "conf"),  # parents pinned, outermost first
                    "--bind", str(work / "conf" / "deep"), str(work / "conf" / "deep"),
                    "--ro-bind", "/dev/null", str(work / "conf" / "deep" / "tools.toml")]
    (work / "conf" / "deep" / "tools.toml").unlink()
    (work / "conf" / "deep" / "tools.toml").symlink_to(state / "audit.jsonl")
    with pytest.raises(ToolSystemError) as info:
        mask_argv(View(cwd=str(work), writable=(str(work),), protected=(str(work / "conf" / "deep" / "tools.toml"),)))
    assert info.value.code == "sandbox_failed" and "tools.toml" in info.value.message


def test_a_spill_dir_that_cannot_be_created_names_the_setting(tmp_path: Path) -> None:
    """Found by a newcomer's trial: ``spill_dir = "/proc/x"`` failed every bash call with the path
    alone, and the command line's hint was the generic one; the error names the setting now."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ToolSystemError) as info:
        open_spill_files(str(blocker / "spill"), "call")
    assert info.value.code == "spill_failed" and str(blocker / "spill") in info.value.message
    assert info.value.details["setting"] == "plugins.bash.spill_dir"
    assert "[plugins.bash] spill_dir" in info.value.details["hint"]

