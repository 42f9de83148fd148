"""Found by attack on ``sandbox.closed_to``: it read mode bits only, so a POSIX ACL shutting the
commands' user out passed the start and every command failed with bwrap's "Can't find source
path ...: Permission denied" (and an ACL letting it in was refused); and a protected path the
sandbox masks, in a directory that user cannot enter, passed and failed every command too."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bash_helpers import bash_host, needs_bwrap

from amplifier_tools import ToolHost
from amplifier_tools.errors import ConfigError, PluginLoadError

pytestmark = [needs_bwrap, pytest.mark.skipif(os.geteuid() != 0, reason="needs a root host")]
NOBODY = 65534


def _acl(path: Path, named_user: int, perms: int, *, owner: int = 7, group: int = 0, other: int = 0) -> None:
    """A POSIX access ACL: owner, ``named_user`` with ``perms``, owning group, mask, other."""
    entries = sorted([(1, owner, 0xFFFFFFFF), (2, perms, named_user), (4, group, 0xFFFFFFFF),
                      (0x10, perms | group, 0xFFFFFFFF), (0x20, other, 0xFFFFFFFF)])
    try:
        os.setxattr(path, "system.posix_acl_access",
                    struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries))
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs here: {exc}")


@pytest.fixture
def base() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="amp-reach-", dir="/var/tmp"))
    where.chmod(0o755)
    (where / "work").mkdir()
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


async def _whoami(host: ToolHost) -> str:
    try:
        result = await host.call("bash", {"command": "id -un"})
        assert result.success, result.error
        return str(result.output["stdout"])
    finally:
        await host.close()


async def test_an_acl_shutting_the_user_out_stops_the_start(base: Path) -> None:
    closed = base / "closed"
    (closed / "tools").mkdir(parents=True)
    closed.chmod(0o755)
    _acl(closed, NOBODY, 0, group=5, other=5)  # mode still reads 0755
    with pytest.raises(PluginLoadError) as info:
        await bash_host(base / "work", user="nobody", sandbox_read_paths=[str(closed / "tools")])
    cause = info.value.__cause__
    assert isinstance(cause, ConfigError) and cause.key == "plugins.bash.sandbox_read_paths", info.value


async def test_an_acl_letting_the_user_in_starts(base: Path) -> None:
    opened = base / "opened"
    (opened / "tools").mkdir(parents=True)
    opened.chmod(0o700)
    _acl(opened, NOBODY, 5)
    host = await bash_host(base / "work", user="nobody", sandbox_read_paths=[str(opened / "tools")])
    assert await _whoami(host) == "nobody\n"


async def test_a_masked_path_the_user_cannot_reach_stops_the_start(base: Path) -> None:
    private = base / "work" / "private"
    private.mkdir()
    private.chmod(0o700)
    config = private / "amplifier-tools.toml"
    config.write_text('[plugins.bash]\nuser = "nobody"\n')
    host = ToolHost(config=config, builtins=["bash"], entry_points=False, working_dir=base / "work", discover=False)
    with pytest.raises(PluginLoadError) as info:
        await host.start()
    cause = info.value.__cause__
    assert isinstance(cause, ConfigError) and str(private) in str(cause), info.value
    private.chmod(0o711)
    host = ToolHost(config=config, builtins=["bash"], entry_points=False, working_dir=base / "work", discover=False)
    await host.start()
    assert await _whoami(host) == "nobody\n"
