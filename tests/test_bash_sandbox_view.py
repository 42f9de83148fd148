"""The default bash sandbox's view, attacked from inside (issue 14, finding 6 and the intro's leaks).

Every host here uses the *default* configuration (no ``sandbox`` key) unless the test is about
another setting: on the main branch before ``sandbox = "auto"`` these commands ran unconfined and
read the host's environment, sockets, home, ``/etc/shadow`` and state directory.
Working directories live outside /tmp, so that a host-/tmp listener is really outside the view.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bash_helpers import bash_host, needs_bwrap, processes_with, wait_until, work_dir_outside_tmp
from cli_helpers import cli

from amplifier_tools import ToolHost, sandbox
from amplifier_tools.errors import ConfigError, PluginLoadError
from amplifier_tools.sandbox import SYSTEM_PATHS

pytestmark = needs_bwrap
PYTHON_IN_VIEW = "/usr/bin/python3"


@pytest.fixture
def work() -> Iterator[Path]:
    with work_dir_outside_tmp("amp-view-") as path:
        yield path


async def test_the_hosts_environment_is_unreachable_through_proc(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "canary-" + os.urandom(8).hex()
    monkeypatch.setenv("AMP_VIEW_CANARY", canary)
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": "cat /proc/$PPID/environ; cat /proc/[0-9]*/environ; env; "
                                                     "cat /proc/1/cmdline; ls /proc"})
        assert canary not in repr(result)
        assert result.output["sandboxed"] is True
        assert str(os.getpid()) not in result.output["stdout"].split()  # the host's PID does not exist here
    finally:
        await host.close()


def _unix_listener(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.setblocking(False)
    return server


async def test_no_unix_socket_outside_the_working_directory_is_reachable(work: Path) -> None:
    if not os.access(PYTHON_IN_VIEW, os.X_OK):
        pytest.skip(f"{PYTHON_IN_VIEW} is needed inside the sandbox to try a connect")
    dirs = [Path(tempfile.mkdtemp(prefix="amp-sock-", dir="/var/tmp")),  # outside the roots
            Path(tempfile.mkdtemp(prefix="amp-sock-", dir="/tmp"))]  # the host's /tmp (replaced in the view)
    for run in ("/run", "/var/run"):
        if os.access(run, os.W_OK):
            dirs.append(Path(tempfile.mkdtemp(prefix="amp-sock-", dir=run)))  # the socket directories
    listeners = [_unix_listener(d / "agent.sock") for d in dirs]
    try:
        paths = [str(d / "agent.sock") for d in dirs]
        probe = ("import socket, sys\nfor p in sys.argv[1:]:\n s = socket.socket(socket.AF_UNIX)\n try:\n"
                 "  s.connect(p); print('CONNECTED', p)\n except OSError as e:\n  print('refused', p, e)\n")
        host = await bash_host(work)
        try:
            command = f"P={_quote(probe)}; {PYTHON_IN_VIEW} -c \"$P\" {' '.join(paths)}; ls -d /run /var/run"
            result = await host.call("bash", {"command": command, "timeout": 60})
        finally:
            await host.close()
        lines = result.output["stdout"].splitlines()
        assert [line.split()[0] for line in lines] == ["refused"] * len(paths), result.output
        assert "No such file" in result.output["stderr"]  # neither /run nor /var/run exists in the view
        for listener in listeners:
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody ever connected
    finally:
        for listener in listeners:
            listener.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


async def test_home_directories_and_host_secret_files_are_not_visible(work: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="amp-view-user-", dir="/home")) if os.access("/home", os.W_OK) else None
    if home is not None:
        (home / ".netrc").write_text("machine example.com password HOME-SECRET")
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": "ls -A /root /home; cat /root/.bash_history /etc/shadow "
                                                     "/etc/gshadow; cat /home/*/.netrc; ls /etc/ssh"})
        out = result.output["stdout"]
        assert "HOME-SECRET" not in out and "root:" not in out and "_key\n" not in out + "\n"
        assert result.output["sandboxed"] is True
        assert "/root" in result.output["stderr"] and "/home" in result.output["stderr"]
    finally:
        await host.close()
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)


@pytest.mark.skipif(not os.access("/opt", os.W_OK), reason="needs a writable /opt to plant a host key")
async def test_a_host_key_file_is_unreadable_though_its_directory_shows(
        work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file matching ``SENSITIVE`` (as ``/etc/ssh/ssh_host_*_key`` does) is masked, its siblings are not."""
    keys = Path(tempfile.mkdtemp(prefix="amp-view-ssh-", dir="/opt"))
    try:
        (keys / "ssh_host_ed25519_key").write_text("HOST-KEY-SECRET")
        (keys / "ssh_config").write_text("PUBLIC-CONFIG")
        monkeypatch.setattr(sandbox, "SENSITIVE", (*sandbox.SENSITIVE, f"{keys}/ssh_host_*_key"))
        host = await bash_host(work)
        try:
            result = await host.call("bash", {"command": f"cat {keys}/ssh_config; cat {keys}/ssh_host_ed25519_key"})
            assert result.output["sandboxed"] is True
            assert "PUBLIC-CONFIG" in result.output["stdout"]
            assert "HOST-KEY-SECRET" not in repr(result)
        finally:
            await host.close()
    finally:
        shutil.rmtree(keys, ignore_errors=True)


async def test_the_host_state_directory_is_absent(work: Path) -> None:
    host = await bash_host(work)
    try:
        (host.state_dir / "marker").write_text("HOST-STATE")
        result = await host.call("bash", {"command": f"ls -A {host.state_dir}; cat {host.state_dir}/marker"})
        assert not result.success and "HOST-STATE" not in repr(result)
    finally:
        await host.close()


async def test_the_network_is_off_even_for_a_listener_on_loopback(work: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    port = server.getsockname()[1]
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"})
        assert not result.success and "connected" not in result.output["stdout"]
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        await host.close()
        server.close()


async def test_a_daemon_does_not_outlive_the_call(work: Path) -> None:
    seconds = f"1000.{random.randrange(10**8):08d}"  # a unique command line to find it by
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": f"setsid nohup sleep {seconds} >/dev/null 2>&1 & echo $!"})
        assert result.success and result.output["sandboxed"] is True
        assert wait_until(lambda: processes_with(f"sleep {seconds}") == [], timeout=10)
    finally:
        await host.close()


async def test_system_directories_are_read_only_and_merged_usr_symlinks_work(work: Path) -> None:
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": "/bin/sh -c 'echo via-bin-sh'; touch /usr/x /etc/x /x; "
                                                     "ls /"})
        assert "via-bin-sh" in result.output["stdout"]
        assert result.output["stderr"].count("Read-only file system") == 3
        visible = set(result.output["stdout"].split()) - {"via-bin-sh"}
        expected = {os.path.basename(p) for p in SYSTEM_PATHS if os.path.lexists(p)} | {"dev", "proc", "tmp"}
        assert visible == expected | {"var"}  # var: the parent of this test's /var/tmp working directory
    finally:
        await host.close()


async def test_sandbox_auto_without_bwrap_fails_every_call_naming_both_fixes(
        work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(work))  # no bwrap on PATH
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": "touch ran"})
        assert (result.error["type"], result.error["code"]) == ("SystemError", "sandbox_unavailable")
        assert "bubblewrap" in result.error["message"] and 'sandbox = "off"' in result.error["message"]
        assert "[plugins.bash]" in result.error["message"] and not (work / "ran").exists()
        assert "unavailable" in host.tools.resolve("local::bash").spec.description  # type: ignore[union-attr]
    finally:
        await host.close()


def _fake_bwrap(directory: Path, body: str) -> None:
    fake = directory / "bwrap"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)


async def test_a_bwrap_that_cannot_make_namespaces_fails_the_calls_with_its_reason(
        work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = work.parent / "bin"
    bin_dir.mkdir()
    _fake_bwrap(bin_dir, 'echo "bwrap: No permissions to creating new namespace" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": "touch ran"})
        assert result.error["code"] == "sandbox_unavailable" and "No permissions" in result.error["message"]
        assert not (work / "ran").exists()
    finally:
        await host.close()


async def test_the_probe_runs_once_not_per_call(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir, log = work.parent / "bin", work.parent / "bwrap.log"
    bin_dir.mkdir()
    _fake_bwrap(bin_dir, f'echo run >> {log}\nexec {shutil.which("bwrap")} "$@"')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for _ in range(2):  # a second host in the same process reuses the probe
        host = await bash_host(work)
        try:
            for _ in range(3):
                assert (await host.call("bash", {"command": "true"})).success
        finally:
            await host.close()
    assert log.read_text().count("run") == 1 + 6


async def test_sandbox_off_runs_unconfined_says_so_and_logs_a_warning(
        work: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        host = await bash_host(work, sandbox="off")
    try:
        assert any("UNCONFINED" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
        spec = host.tools.resolve("local::bash").spec  # type: ignore[union-attr]
        assert "UNCONFINED" in spec.description and "unconfined" in spec.tags
        result = await host.call("bash", {"command": "ls -d /root"})
        assert result.success and result.output["sandboxed"] is False
    finally:
        await host.close()


def test_describe_shows_an_unconfined_bash(work: Path) -> None:
    (work / "amplifier-tools.toml").write_text(f'state_dir = "{work.parent / "state"}"\n'
                                               '[plugins.bash]\nsandbox = "off"\n')
    done = cli(work, "describe", "local::bash")
    assert done.returncode == 0, done.stderr
    assert "UNCONFINED" in done.stdout and "unconfined" in done.stdout
    assert "UNCONFINED" in done.stderr  # the start-up warning
    other = work.parent / "other"
    other.mkdir()
    (other / "amplifier-tools.toml").write_text(f'state_dir = "{work.parent / "state2"}"\n')
    assert "bubblewrap sandbox" in cli(other, "describe", "local::bash").stdout


async def test_none_is_a_deprecated_alias_of_off(work: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        host = await bash_host(work, sandbox="none")
    try:
        assert any("deprecated" in r.getMessage() for r in caplog.records)
        assert (await host.call("bash", {"command": "true"})).output["sandboxed"] is False
    finally:
        await host.close()


async def test_extra_read_and_write_paths(work: Path) -> None:
    shared, tools = work.parent / "shared", work.parent / "tools"
    shared.mkdir()
    tools.mkdir()
    (tools / "readme").write_text("tool files")
    host = await bash_host(work, sandbox_read_paths=[str(tools), str(work.parent / "no-such-dir")],
                           sandbox_write_paths=["../shared"])
    try:
        result = await host.call("bash", {"command": f"cat {tools}/readme; echo out > {shared}/f; touch {tools}/x"})
        assert "tool files" in result.output["stdout"] and "Read-only file system" in result.output["stderr"]
        assert (shared / "f").read_text() == "out\n" and not (tools / "x").exists()
        assert not (work.parent / "no-such-dir").exists()  # a missing path is skipped, never created
    finally:
        await host.close()


async def test_host_state_inside_a_sandbox_write_path_is_refused_at_start(work: Path) -> None:
    state = work.parent / "outside" / "state"
    config = {"state_dir": str(state), "plugins": {"bash": {"sandbox_write_paths": [str(work.parent / "outside")]}}}
    host = ToolHost(config=config, builtins=["bash"], entry_points=False, working_dir=work, discover=False)
    with pytest.raises(ConfigError, match="inside"):
        await host.start()
    await host.close()
    config = {"state_dir": str(state), "plugins": {"bash": {"sandbox_write_paths": [str(state / "sub")]}}}
    host = ToolHost(config=config, builtins=["bash"], entry_points=False, working_dir=work, discover=False)
    with pytest.raises(PluginLoadError, match="plugins.bash.sandbox_write_paths: .* lies inside"):
        await host.start()
    await host.close()


@pytest.mark.parametrize("bad", [{"sandbox": "docker"}, {"sandbox_read_paths": "/opt"},
                                 {"sandbox_write_paths": [""]}])
async def test_bad_sandbox_settings_name_the_key(work: Path, bad: dict[str, object]) -> None:
    with pytest.raises(PluginLoadError) as info:
        await bash_host(work, **bad)
    assert f"plugins.bash.{next(iter(bad))}" in str(info.value)


async def test_a_read_path_under_the_hosts_tmp_is_bound_over_the_private_tmp(work: Path, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("from the host's /tmp")
    host = await bash_host(work, sandbox_read_paths=[str(tmp_path)])
    try:
        result = await host.call("bash", {"command": f"cat {tmp_path}/data.txt; touch {tmp_path}/x; ls /tmp"})
        assert "from the host's /tmp" in result.output["stdout"] and not (tmp_path / "x").exists()
        assert "Read-only file system" in result.output["stderr"]
    finally:
        await host.close()


async def test_root_in_the_sandbox_cannot_change_the_kernel_through_proc_sys(work: Path) -> None:
    """uid 0 writes sysctls without any capability: a writable /proc/sys/kernel/core_pattern let a
    sandboxed command have the kernel run its program as root on the host (found by attack). Each
    write puts back the value that is there, so a failure of this test changes nothing."""
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": (
            "for f in /proc/sys/kernel/core_pattern /proc/sys/kernel/panic /proc/sys/vm/overcommit_memory; do "
            "v=$(cat $f); if (echo \"$v\" > $f) 2>/dev/null; then echo \"WRITABLE $f\"; else echo \"refused $f\"; fi; "
            "done; if [ -e /proc/sysrq-trigger ] && (: > /proc/sysrq-trigger) 2>/dev/null; "
            "then echo WRITABLE-sysrq; fi")})
        out = result.output["stdout"]
        assert result.output["sandboxed"] is True and "WRITABLE" not in out, out
        assert out.count("refused") == 3
    finally:
        await host.close()


@pytest.mark.parametrize("existing", [True, False], ids=["write-path-existing", "write-path-missing-at-start"])
async def test_a_write_path_swapped_for_a_symlink_binds_nothing_outside(work: Path, existing: bool) -> None:
    """Found by attack: a ``sandbox_write_paths`` entry inside the working directory was bound again
    by name on every call, and bwrap followed the symlink a command had put there: the next
    command got the host's /proc (and through /proc/<pid>/root the host's whole filesystem). Here
    the symlink names a host directory outside the view instead, holding a marker."""
    outside = work.parent / "outside"
    outside.mkdir()
    (outside / "marker").write_text("host file")
    if existing:
        (work / "out" / "cache").mkdir(parents=True)
    host = await bash_host(work, sandbox_write_paths=["out/cache" if existing else "build"])
    try:
        target = "out/cache" if existing else "build"
        plant = (f"mv out out.old && mkdir out && ln -s {outside} {target}" if existing
                 else f"ln -s {outside} {target}")
        assert (await host.call("bash", {"command": plant})).output["exit_code"] == 0
        result = await host.call("bash", {"command": f"cat {target}/marker; echo written > {target}/new"})
        assert "host file" not in result.output["stdout"], result.output
        assert not (outside / "new").exists()
    finally:
        await host.close()


@pytest.mark.parametrize("read_path", ["vendor", "out/cache"])
async def test_a_read_path_inside_a_writable_root_is_refused_at_start(work: Path, read_path: str) -> None:
    """Found by attack, twice: bound before the working directory, ``sandbox_read_paths =
    ["vendor"]`` was writable; bound after it by name, a second call racing a component swap got the
    host's /proc. A path a command may swap cannot be made read-only: the start says so, naming
    the key."""
    (work / "vendor").mkdir()
    with pytest.raises(PluginLoadError, match=r"plugins.bash.sandbox_read_paths: the sandbox cannot bind "
                                              r".* lies inside .*which commands may write"):
        await bash_host(work, sandbox_read_paths=[read_path])


@pytest.mark.parametrize(("key", "path"), [
    ("sandbox_read_paths", "/proc"), ("sandbox_read_paths", "/proc/1"), ("sandbox_read_paths", "/dev"),
    ("sandbox_read_paths", "/"), ("sandbox_write_paths", "/usr"), ("sandbox_write_paths", "/dev/shm"),
    ("sandbox_write_paths", "/usr/bin"), ("sandbox_write_paths", "/usr/sbin/plugins")])
async def test_paths_that_would_show_the_host_are_refused_at_start(work: Path, key: str, path: str) -> None:
    """Found by attack: ``sandbox_read_paths = ["/proc"]`` was bound over the sandbox's own /proc,
    and /proc/<pid>/root was the host's whole filesystem, writable."""
    with pytest.raises(PluginLoadError, match=rf"plugins.bash.{key}: the sandbox cannot bind {path}"):
        await bash_host(work, **{key: [path]})


async def test_a_read_path_on_the_write_roots_of_the_filesystem_plugin_is_refused(work: Path) -> None:
    outside = work.parent / "shared"
    (outside / "docs").mkdir(parents=True)
    config = {"plugins": {"filesystem": {"allowed_write_paths": [str(work), str(outside)]},
                          "bash": {"sandbox_read_paths": [str(outside / "docs")]}}}
    host = ToolHost(config=config, builtins=["filesystem", "bash"], entry_points=False, working_dir=work,
                    discover=False)
    with pytest.raises(PluginLoadError, match="plugins.bash.sandbox_read_paths"):
        await host.start()
    await host.close()


def _unconfining_bwrap(path: Path, ran: Path) -> None:
    """A ``bwrap`` that runs the command unconfined and leaves ``ran`` behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\ntouch {ran}\nwhile [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done; shift\n'
                    'exec "$@"\n')
    path.chmod(0o755)


async def _confined(host: ToolHost, ran: Path) -> None:
    result = await host.call("bash", {"command": "test -d /root || echo no-root"})
    assert result.output["sandboxed"] is True and result.output["stdout"] == "no-root\n", result.output
    assert not ran.exists()


async def test_a_bwrap_symlink_in_the_workspace_runs_its_target_not_what_it_later_names(
        work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: ``.venv/bin/bwrap -> /usr/bin/bwrap`` passed the check (its target is a
    system file) but the host kept running the link: a command replaced it, and the next call ran
    unconfined. The resolved path is what runs."""
    real = shutil.which("bwrap")
    assert real is not None
    venv_bin = work / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "bwrap").symlink_to(os.path.realpath(real))
    monkeypatch.setenv("PATH", str(venv_bin) + os.pathsep + os.environ["PATH"])
    ran = work.parent / "fake-bwrap-ran"
    host = await bash_host(work)
    try:
        await _confined(host, ran)
        (venv_bin / "bwrap").unlink()
        _unconfining_bwrap(venv_bin / "bwrap", ran)
        await _confined(host, ran)
    finally:
        await host.close()


@pytest.mark.parametrize("where", ["link-into-workspace", "filesystem-write-root"])
async def test_a_bwrap_a_command_could_have_written_is_never_run(
        work: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Found by attack: a PATH directory outside the workspace holding ``bwrap -> <workspace>/...``
    was used, and so was one inside the filesystem plugin's write roots (bash binds them read-write,
    but they were not looked at)."""
    ran = work.parent / "fake-bwrap-ran"
    config: dict[str, object] = {}
    if where == "link-into-workspace":
        _unconfining_bwrap(work / "tools" / "bwrap", ran)
        (work.parent / "bin").mkdir()
        (work.parent / "bin" / "bwrap").symlink_to(work / "tools" / "bwrap")
        entry = work.parent / "bin"
    else:
        shared = work.parent / "shared"
        _unconfining_bwrap(shared / "bin" / "bwrap", ran)
        config = {"plugins": {"filesystem": {"allowed_write_paths": [str(work), str(shared)]}}}
        entry = shared / "bin"
    monkeypatch.setenv("PATH", str(entry) + os.pathsep + os.environ["PATH"])
    host = ToolHost(config=config, builtins=["filesystem", "bash"], entry_points=False, working_dir=work,
                    discover=False)
    await host.start()
    try:
        await _confined(host, ran)
    finally:
        await host.close()


@pytest.mark.parametrize("entry", ["absolute", "relative"])
async def test_a_bwrap_planted_on_path_inside_the_workspace_is_passed_over(
        work: Path, monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """Found by attack: with an in-project ``.venv/bin`` on PATH (an activated virtualenv), a command
    planted its own ``bwrap`` there, one that runs the command as it is; the next host ran every
    command unconfined while reporting it sandboxed. A bwrap inside a path commands may write is
    never used: the next one on PATH is."""
    venv_bin = work / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    ran = work.parent / "fake-bwrap-ran"
    fake = venv_bin / "bwrap"
    fake.write_text(f'#!/bin/sh\ntouch {ran}\nwhile [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done; shift\n'
                    'exec "$@"\n')
    fake.chmod(0o755)
    monkeypatch.chdir(work)
    first = str(venv_bin) if entry == "absolute" else ".venv/bin"
    monkeypatch.setenv("PATH", first + os.pathsep + os.environ["PATH"])
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": f"test -e {work.parent / 'fake-bwrap-ran'} || echo hidden; "
                                                     "test -d /root || echo no-root"})
        assert result.output["sandboxed"] is True and not ran.exists()
        assert result.output["stdout"].split() == ["hidden", "no-root"], result.output
    finally:
        await host.close()


async def test_the_hosts_kernel_keyrings_are_out_of_reach(work: Path) -> None:
    """Found by attack: a key in the host process's session keyring (and, on a root host, root's
    user keyring) was readable through keyctl(2) from the sandbox, ``user`` set or not; /proc/keys
    is hidden, the keys were not. The seccomp filter refuses the keyring calls (EPERM)."""
    import ctypes
    import platform

    numbers = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine())
    if numbers is None:
        pytest.skip("keyring system call numbers known here for x86-64 and AArch64 only")
    add_key, keyctl = numbers
    libc = ctypes.CDLL(None, use_errno=True)
    secret = b"host-keyring-secret-" + os.urandom(4).hex().encode()
    key = libc.syscall(add_key, b"user", b"amp-test-key", secret, len(secret), ctypes.c_int(-3))  # session
    if key < 0:
        pytest.skip(f"no session keyring to put a key in here (errno {ctypes.get_errno()})")
    reader = (f"import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
              f"kid = libc.syscall({keyctl}, 10, ctypes.c_int(-3), b'user', b'amp-test-key', 0); "
              f"buf = ctypes.create_string_buffer(200); "
              f"n = libc.syscall({keyctl}, 11, kid, buf, 200) if kid > 0 else -1; "
              f"print('READ', buf.raw[:n].decode() if n > 0 else 'refused', ctypes.get_errno())")
    host = await bash_host(work)
    try:
        result = await host.call("bash", {"command": f"{PYTHON_IN_VIEW} -c \"{reader}\"; echo still-runs"})
        out = result.output["stdout"]
        assert secret.decode() not in out and "READ refused 1" in out and "still-runs" in out, result.output
    finally:
        libc.syscall(keyctl, 3, ctypes.c_int(key))  # KEYCTL_REVOKE: leave nothing behind
        await host.close()


@pytest.mark.parametrize(("plugin", "key"), [("bash", "sandbox_write_paths"), ("bash", "sandbox_read_paths"),
                                             ("filesystem", "allowed_write_paths"),
                                             ("filesystem", "allowed_read_paths")])
async def test_a_configured_path_swapped_for_a_symlink_stops_the_next_start(work: Path, plugin: str, key: str) -> None:
    """Found by attack: a sandboxed command replaced ``sandbox_write_paths = ["build"]`` by
    ``build -> <a host directory>``; within the host nothing leaked, but the next start resolved the
    setting through the symlink and bound the host's directory read-write. A configured path that
    leads through a symlink inside a path tools may write stops the start, naming the key."""
    victim = work.parent / "victim"
    victim.mkdir()
    (work / "build").symlink_to(victim)  # what the command left behind
    config: dict[str, object] = {"plugins": {plugin: {key: ["build"]}}}
    if key == "sandbox_read_paths":  # a read path inside the working directory is refused anyway: use a root
        outside = work.parent / "shared"
        outside.mkdir()
        (outside / "docs").symlink_to(victim)
        config = {"plugins": {"bash": {"allowed_paths": [str(work), str(outside)],
                                       "sandbox_read_paths": [str(outside / "docs")]}}}
    host = ToolHost(config=config, builtins=["filesystem", "bash"], entry_points=False, working_dir=work,
                    discover=False)
    with pytest.raises(PluginLoadError, match=rf"plugins.{plugin}.{key}: .* leads through the symbolic link"):
        await host.start()
    await host.close()


async def test_a_bwrap_in_a_path_another_plugin_lets_processes_write_is_never_run(
        work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: the MCP plugin mounts after bash and adds its servers' write paths to
    ``session.writable_roots``; a bwrap there was run by every bash call, and a server could
    replace it. Each call checks the bwrap against every such path: the call fails closed."""
    tools = work.parent / "tools-bin"
    tools.mkdir()
    shutil.copy2(os.path.realpath(shutil.which("bwrap") or "/usr/bin/bwrap"), tools / "bwrap")
    monkeypatch.setenv("PATH", str(tools) + os.pathsep + os.environ["PATH"])
    host = await bash_host(work)
    try:
        assert (await host.call("bash", {"command": "true"})).success
        host.capabilities["session.writable_roots"].append(str(tools))  # as an MCP server's write path is
        result = await host.call("bash", {"command": "touch ran"})
        assert result.error["code"] == "sandbox_failed" and str(tools) in result.error["message"]
        assert not (work / "ran").exists()
    finally:
        await host.close()


@pytest.mark.parametrize("case", ["read-root-in-bash-write-path", "later-entry-of-one-list", "chain-of-links",
                                  "working-dir-link"])
async def test_a_path_tools_could_retarget_is_refused_whatever_the_mount_order(work: Path, case: str) -> None:
    """Found by a third attack: the filesystem plugin mounts first and checked its roots only
    against what it knew (a read root inside bash's ``sandbox_write_paths`` was followed through the
    link a command left); a list was checked in order (``[".", "shared/out", "shared"]``); a link
    outside pointing at a link inside was followed in one step; and the working directory given as
    a link inside a write root moved with it."""
    shared, victim = work.parent / "shared", work.parent / "victim"
    shared.mkdir()
    victim.mkdir()
    working_dir: Path = work
    if case == "read-root-in-bash-write-path":
        (shared / "docs").symlink_to(victim)
        config: dict[str, object] = {"plugins": {
            "filesystem": {"allowed_read_paths": [".", str(shared / "docs")]},
            "bash": {"sandbox_write_paths": [str(shared)]}}}
        key = "plugins.filesystem.allowed_read_paths"
    elif case == "later-entry-of-one-list":
        (shared / "out").symlink_to(victim)
        config = {"plugins": {"filesystem": {"allowed_write_paths": [".", str(shared / "out"), str(shared)]}}}
        key = "plugins.filesystem.allowed_write_paths"
    elif case == "chain-of-links":
        (work / "data").symlink_to(victim)  # left by a command
        (work.parent / "outside-link").symlink_to(work / "data")
        config = {"plugins": {"filesystem": {"allowed_read_paths": [".", str(work.parent / "outside-link")]}}}
        key = "plugins.filesystem.allowed_read_paths"
    else:
        (shared / "current").symlink_to(work)  # a command may retarget it
        config = {"plugins": {"filesystem": {"allowed_write_paths": [".", str(shared)]}}}
        working_dir, key = shared / "current", "working_dir"
    host = ToolHost(config=config, builtins=["filesystem", "bash"], entry_points=False, working_dir=working_dir,
                    discover=False)
    with pytest.raises((ConfigError, PluginLoadError), match=rf"{key}: .*symbolic link"):
        await host.start()
    await host.close()


async def test_with_the_sandbox_off_its_paths_are_not_judged(work: Path) -> None:
    """Found by a new-user check: with ``sandbox = "off"`` the sandbox's paths are never bound, yet a
    ``sandbox_read_paths`` entry through a link inside the project stopped the start."""
    shared = work.parent / "shared" / "docs"
    shared.mkdir(parents=True)
    (work / "docs").symlink_to(shared)
    host = await bash_host(work, sandbox="off", sandbox_read_paths=["docs"], sandbox_write_paths=["docs"])
    try:
        assert (await host.call("bash", {"command": "true"})).success
    finally:
        await host.close()
