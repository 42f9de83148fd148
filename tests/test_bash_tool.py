"""What users of the bash tool see: results, failures, environment, secrets, working directory, config."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from bash_helpers import bash_host, needs_bwrap
from helpers import EVENT_LOOPS, run_on

from amplifier_tools import ToolContext, ToolHost
from amplifier_tools.builtins.bash.tool import MAX_ARGUMENT_BYTES
from amplifier_tools.errors import ConfigError, PluginLoadError


@pytest.fixture
async def host(tmp_path: Path):  # type: ignore[no-untyped-def]
    h = await bash_host(tmp_path)
    yield h
    await h.close()


async def test_echo_returns_stdout_stderr_exit_code_and_totals(host: ToolHost) -> None:
    result = await host.call("bash", {"command": "echo hi; echo oops >&2"})
    assert result.success, result.error
    out = result.output
    assert out["stdout"] == "hi\n" and out["stderr"] == "oops\n"
    assert out["exit_code"] == 0 and out["signal"] is None and out["timed_out"] is False
    assert out["stdout_bytes"] == 3 and out["stderr_bytes"] == 5
    assert out["stdout_truncated"] is False and out["duration_ms"] >= 0 and out["sandboxed"] is True


async def test_non_zero_exit_is_an_execution_error_carrying_both_streams(host: ToolHost) -> None:
    result = await host.call("bash", {"command": "echo partial; echo 'no such thing' >&2; exit 3"})
    assert not result.success
    assert result.error["type"] == "ExecutionError" and result.error["code"] == "nonzero_exit"
    assert result.error["exit_code"] == 3
    assert result.error["stdout"] == "partial\n" and result.error["stderr"] == "no such thing\n"
    assert "exited with code 3" in result.error["message"] and "no such thing" in result.error["message"]
    assert result.output["exit_code"] == 3  # the full output is kept on the failed result


async def test_killed_by_a_signal_reports_the_signal(host: ToolHost) -> None:
    result = await host.call("bash", {"command": "kill -KILL $$"})
    assert not result.success and result.output["signal"] == "SIGKILL" and result.output["exit_code"] is None


async def test_stdin_is_closed(host: ToolHost) -> None:
    result = await host.call("bash", {"command": "cat; echo after-cat", "timeout": 30})
    assert result.success and result.output["stdout"] == "after-cat\n"


async def test_timeout_reports_timed_out_with_the_output_so_far(host: ToolHost) -> None:
    result = await host.call("bash", {"command": "echo before; sleep 600", "timeout": 1})
    assert not result.success
    assert result.error["type"] == "PolicyError" and result.error["code"] == "timeout"
    assert result.output["timed_out"] is True and result.output["stdout"] == "before\n"


async def test_timeout_is_capped_by_max_timeout(tmp_path: Path) -> None:
    host = await bash_host(tmp_path, max_timeout=2, default_timeout=1)
    try:
        result = await host.call("bash", {"command": "true", "timeout": 9999})
        assert result.success and result.output["timeout_s"] == 2
    finally:
        await host.close()


async def test_environment_is_an_allowlist_and_a_canary_secret_is_not_visible(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "canary-" + os.urandom(8).hex()
    monkeypatch.setenv("AMP_CANARY_SECRET", canary)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canary)
    monkeypatch.setenv("KEPT_NAME", "kept")
    host = await bash_host(tmp_path, env_allowlist=["KEPT_NAME"], env={"FIXED": "fixed-value"})
    try:
        result = await host.call("bash", {"command": "env; cat /proc/self/environ; echo; set"})
        assert result.success
        text = result.output["stdout"]
        assert canary not in text and "AMP_CANARY_SECRET" not in text and "AWS_SECRET" not in text
        names = {line.split("=", 1)[0] for line in result.output["stdout"].splitlines()[:40] if "=" in line}
        assert {"PATH", "KEPT_NAME", "FIXED"} <= names
        assert "KEPT_NAME=kept" in text and "FIXED=fixed-value" in text
    finally:
        await host.close()


async def test_secret_refs_are_exported_under_configured_names_and_redacted(tmp_path: Path) -> None:
    host = await bash_host(tmp_path, secrets={"API_TOKEN": "api"})
    try:
        spec = next(s for s in host.specs if s.name == "local::bash")
        assert spec.security.secret_refs == ("api",)
        ctx = ToolContext(secrets={"api": "s3cr3t-token-value"})
        result = await host.call("bash", {"command": 'test "$API_TOKEN" = s3cr3t-token-value && echo "$API_TOKEN"'},
                                 context=ctx)
        assert result.success and result.output["stdout"] == "[REDACTED]\n"
        failed = await host.call("bash", {"command": 'echo "$API_TOKEN" >&2; exit 1'}, context=ctx)
        assert "s3cr3t-token-value" not in repr(failed)
        missing = await host.call("bash", {"command": "true"})
        assert missing.error["type"] == "AuthError" and missing.error["code"] == "missing_secret"
    finally:
        await host.close()


async def test_cwd_inside_the_roots_is_used_and_outside_is_denied(host: ToolHost, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    inside = await host.call("bash", {"command": "pwd", "cwd": "sub"})
    assert inside.success and inside.output["stdout"].strip() == str((tmp_path / "sub").resolve())
    for cwd in ("/etc", "..", "sub/../.."):
        denied = await host.call("bash", {"command": "pwd", "cwd": cwd})
        assert denied.error["type"] == "AuthError" and denied.error["code"] == "path_denied", cwd
        assert denied.error["path"] == cwd
    (tmp_path / "link").symlink_to("/etc")
    escaped = await host.call("bash", {"command": "pwd", "cwd": "link"})
    assert escaped.error["type"] == "AuthError"
    missing = await host.call("bash", {"command": "pwd", "cwd": "nope"})
    assert missing.error["type"] == "ExecutionError" and missing.error["code"] == "not_found"


async def test_cwd_follows_the_filesystem_plugins_roots(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    config = {"plugins": {"filesystem": {"allowed_write_paths": [str(tmp_path / "a"), str(tmp_path / "b")]}}}
    async with ToolHost(config=config, builtins=["filesystem", "bash"], entry_points=False,
                        working_dir=tmp_path / "a", discover=False) as host:
        assert (await host.call("bash", {"command": "pwd", "cwd": str(tmp_path / "b")})).success
    async with ToolHost(builtins=["bash"], entry_points=False, working_dir=tmp_path / "a", discover=False) as host:
        assert not (await host.call("bash", {"command": "pwd", "cwd": str(tmp_path / "b")})).success
    async with ToolHost(config={"plugins": {"bash": {"allowed_paths": [str(tmp_path)]}}}, builtins=["bash"],
                        entry_points=False, working_dir=tmp_path / "a", discover=False) as host:
        assert (await host.call("bash", {"command": "pwd", "cwd": str(tmp_path / "b")})).success


async def test_long_output_keeps_head_and_tail_and_spills_the_whole(tmp_path: Path) -> None:
    host = await bash_host(tmp_path, max_output_bytes=1000, spill_dir="spill")
    try:
        result = await host.call("bash", {"command": "seq 1 100000"})
        out = result.output
        total = sum(len(f"{i}\n") for i in range(1, 100001))
        assert out["stdout_bytes"] == total and out["stdout_truncated"] is True
        assert out["stdout"].startswith("1\n2\n3\n") and out["stdout"].endswith("99999\n100000\n")
        marker = out["stdout"][out["stdout"].index("\n[..."):out["stdout"].index("...]\n") + 5]
        assert "bytes omitted" in marker
        assert len(out["stdout"]) - len(marker) <= 1000  # head and tail within max_output_bytes; the marker
        # names the spill file, whose path length depends on where the test's state lives
        spilled = Path(out["stdout_file"])
        assert spilled.parent == host.state_dir / "spill" and spilled.stat().st_size == total
        assert (host.state_dir / "spill").stat().st_mode & 0o777 == 0o700 and spilled.stat().st_mode & 0o777 == 0o600
    finally:
        await host.close()


@pytest.mark.parametrize(("config", "key"), [
    ({"bogus": 1}, "plugins.bash.bogus"),
    ({"max_timeout": -1}, "plugins.bash.max_timeout"),
    ({"sandbox": "docker"}, "plugins.bash.sandbox"),
    ({"allow": "rm"}, "plugins.bash.allow"),
    ({"env": {"BAD NAME": "x"}}, "plugins.bash.env"),
    ({"spill_dir": 5}, "plugins.bash.spill_dir"),
    ({"allowed_paths": ["."], "spill_dir": "{root}/spill"}, "plugins.bash.spill_dir"),
    ({"user": "no-such-user-here"}, "plugins.bash.user"),
    ({"default_timeout": 10, "max_timeout": 5}, "plugins.bash.default_timeout"),
])
async def test_bad_config_names_the_key(tmp_path: Path, config: dict[str, object], key: str) -> None:
    config = {k: v.format(root=tmp_path) if isinstance(v, str) else v for k, v in config.items()}
    with pytest.raises(PluginLoadError) as info:
        await bash_host(tmp_path, **config)
    assert key in str(info.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="running commands as another user needs a root host")
@pytest.mark.parametrize("where", ["sandbox_read_paths", "working_dir"])
async def test_a_path_the_commands_user_cannot_reach_stops_the_start(where: str) -> None:
    """Found by a new-user trial: the example configuration's ``sandbox_read_paths = ["~/.pyenv"]``
    with ``user = "nobody"`` on a root host started, and every command then failed with bwrap's
    "Can't find source path /root/.pyenv: Permission denied", naming neither setting."""
    base = Path(tempfile.mkdtemp(prefix="amp-reach-", dir="/var/tmp"))
    try:
        base.chmod(0o755)
        private = base / "private"
        (private / "tools").mkdir(parents=True)
        private.chmod(0o700)  # root's own, like /root
        open_dir = base / "work"
        open_dir.mkdir()
        if where == "working_dir":
            work, config = private / "tools", {"user": "nobody"}
        else:
            work, config = open_dir, {"user": "nobody", "sandbox_read_paths": [str(private / "tools")]}
        with pytest.raises(PluginLoadError) as info:
            await bash_host(work, **config)
        cause = info.value.__cause__
        assert isinstance(cause, ConfigError), info.value
        assert cause.key == ("working_dir" if where == "working_dir" else "plugins.bash.sandbox_read_paths")
        assert f"{private} (mode 0700" in str(cause) and "'nobody'" in str(cause)
        assert cause.hint is not None and "plugins.bash.user" in cause.hint
        # The same paths open to the user start, and the command runs as that user.
        private.chmod(0o711)
        host = await bash_host(work, **config)
        try:
            result = await host.call("bash", {"command": "id -un"})
            assert result.output["stdout"] == "nobody\n", result
        finally:
            await host.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_contract(host: ToolHost) -> None:
    spec = next(s for s in host.specs if s.name == "local::bash")
    assert spec.effect.value == "ExternalSideEffects" and spec.version == "1.0.0"
    assert spec.input_schema["required"] == ["command"]
    assert set(spec.input_schema["properties"]) == {"command", "timeout", "cwd"}
    assert spec.examples and spec.output_schema is not None
    assert spec.policies.timeout_ms is not None and spec.policies.timeout_ms > 600_000
    assert "'bash'" in repr(host.tool_definitions("openai"))  # the model-facing name


async def test_bash_is_mounted_by_default_and_confined_to_the_working_dir(tmp_path: Path) -> None:
    async with ToolHost(entry_points=False, working_dir=tmp_path, discover=False) as host:
        assert "local::bash" in {s.name for s in host.specs}
        result = await host.call("bash", {"command": "pwd", "cwd": "/"})
        assert result.error["code"] == "path_denied"


async def test_the_sandbox_probe_started_with_the_plugin_decides_at_mount(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe runs while the host loads its other plugins (CLI start-up); its answer still decides
    at mount: where the sandbox cannot work, every call fails and nothing runs unconfined."""
    import concurrent.futures

    from amplifier_tools import sandbox as engine

    answer: concurrent.futures.Future[tuple[str | None, str | None]] = concurrent.futures.Future()
    answer.set_result(("/usr/bin/bwrap", "bwrap failed to set up a sandbox (as told by the test)"))
    monkeypatch.setattr(engine, "start_find_bwrap", lambda: answer)

    async def probe_again() -> tuple[str | None, str | None]:
        raise AssertionError("the mount probed again")

    monkeypatch.setattr(engine, "find_bwrap", probe_again)
    async with ToolHost(builtins=["bash"], entry_points=False, working_dir=tmp_path, discover=False) as host:
        mounted = host.tools.resolve("bash")
        assert mounted is not None and "as told by the test" in mounted.spec.description
        result = await host.call("bash", {"command": f"touch {tmp_path / 'ran'}"})
        assert result.error["code"] == "sandbox_unavailable"
        assert not (tmp_path / "ran").exists()


async def test_a_probe_started_long_before_the_mount_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import concurrent.futures

    from amplifier_tools import sandbox as engine
    from amplifier_tools.builtins import bash as bash_plugin

    stale: concurrent.futures.Future[tuple[str | None, str | None]] = concurrent.futures.Future()
    stale.set_result((None, "a stale answer"))
    monkeypatch.setattr(engine, "start_find_bwrap", lambda: stale)
    plugin = bash_plugin.BashPlugin()
    plugin._probe_started -= bash_plugin.PROBE_FRESH_S + 1
    async with ToolHost(plugins=[plugin], builtins=False, entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        mounted = host.tools.resolve("bash")
        assert mounted is not None and "a stale answer" not in mounted.spec.description


async def test_a_nul_in_the_command_is_the_callers_contract_error(host: ToolHost) -> None:
    """Found by attack: it failed as ``ExecutionError`` ``tool_raised`` (exec's ``ValueError``)."""
    result = await host.call("bash", {"command": "echo \x00"})
    assert result.error is not None and (result.error["type"], result.error["pointer"]) == ("ContractError", "/command")


@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_a_command_longer_than_one_program_argument_can_be_is_the_callers_contract_error(
        tmp_path: Path, sandbox: str) -> None:
    """Linux passes at most 128 KiB in one argument (MAX_ARG_STRLEN). Found by attack: a longer
    command failed as ``sandbox_failed`` "could not start bwrap" (as ``spawn_failed`` unconfined),
    blaming the sandbox or the system for the caller's input."""
    host = await bash_host(tmp_path, sandbox=sandbox)
    try:
        most = MAX_ARGUMENT_BYTES - 1  # 32 pages (the page size of this kernel), less the NUL
        fits = await host.call("bash", {"command": "echo " + "x" * (most - 13) + " | wc -c"})  # `most` bytes
        assert fits.success and fits.output["stdout"].strip() == str(most - 12), fits.error
        too_long = "echo " + "é" * (most // 2)  # a few bytes more than fit, in UTF-8
        result = await host.call("bash", {"command": too_long})
        assert result.error is not None
        assert (result.error["type"], result.error["code"], result.error["pointer"]) == (
            "ContractError", "invalid_input", "/command")
        assert f"{len(too_long.encode()):,} bytes" in result.error["message"]
        assert "bash script.sh" in result.error["hint"]
    finally:
        await host.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="running commands as another user needs a root host")
@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_user_runs_commands_as_that_user_on_every_loop(loop_kind: str, sandbox: str) -> None:
    """Found by running the host on uvloop (``uvicorn[standard]``, ``uvloop.run``): its
    ``subprocess_exec`` refuses ``user``/``group``/``extra_groups`` (``ValueError: unexpected
    kwargs``), so with ``user`` set every bash call failed. The command runs as that user, in
    that user's group alone (not root's supplementary groups)."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    result = _as_nobody(loop_kind, 0o755, sandbox, "id -u; id -G")
    assert result.success, result.error
    assert result.output["stdout"] == f"{nobody.pw_uid}\n{nobody.pw_gid}\n"


@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
@pytest.mark.parametrize("sandbox", [pytest.param("auto", marks=needs_bwrap), "off"])
def test_a_command_inherits_no_descriptor_of_the_host_on_every_loop(tmp_path: Path, loop_kind: str,
                                                                     sandbox: str) -> None:
    """Found by running the host on uvloop, which closes no descriptor at a spawn (no ``close_fds``):
    the command inherited every inheritable descriptor of the host (here a file it opened) and
    copies of its own output sockets, so a background child with its output redirected kept the
    output open and the call waited 2 s (``DRAIN_AFTER_EXIT``) for an end that never came."""
    secret = tmp_path / "host-only.txt"
    secret.write_text("host state\n")
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)  # as one handed over by the host's parent (systemd, a process manager)

    async def scenario() -> tuple[Any, Any, float]:
        host = await bash_host(tmp_path, sandbox=sandbox)
        try:
            listing = await host.call("bash", {"command": "ls -l /proc/$$/fd/"})
            started = time.monotonic()
            background = await host.call("bash", {"command": "sleep 5 >/dev/null 2>&1 & echo started"})
            return listing, background, time.monotonic() - started
        finally:
            await host.close()

    try:
        listing, background, took = run_on(loop_kind, scenario())
    finally:
        os.close(fd)
    assert listing.success, listing.error
    assert str(secret) not in listing.output["stdout"]
    assert background.success and background.output["stdout"] == "started\n", background
    assert took < 1.5


@pytest.mark.skipif(os.geteuid() != 0, reason="running commands as another user needs a root host")
@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
def test_user_enters_the_working_directory_before_the_switch_on_every_loop(loop_kind: str) -> None:
    """Found by review: on asyncio's loops ``Popen`` enters the working directory as the host's
    user and then switches to ``user``; uvloop (libuv) switched first (``spawning.for_loop``'s
    ``preexec_fn``) and entered it as ``user``, so a working directory only the host may enter
    failed every call (``PermissionError``) on uvloop alone."""
    result = _as_nobody(loop_kind, 0o700, "off", "echo ran")
    assert result.success, result.error
    assert result.output["stdout"] == "ran\n"


def _as_nobody(loop_kind: str, mode: int, sandbox: str, command: str) -> Any:
    """The result of ``command`` run by a bash host with ``user = "nobody"`` on a loop of
    ``loop_kind``, in a working directory of its own with permissions ``mode``."""
    work = Path(tempfile.mkdtemp(prefix="amp-user-", dir="/var/tmp"))
    work.chmod(mode)

    async def scenario() -> Any:
        host = await bash_host(work, user="nobody", sandbox=sandbox)
        try:
            return await host.call("bash", {"command": command})
        finally:
            await host.close()

    try:
        return run_on(loop_kind, scenario())
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_a_lone_surrogate_in_the_command_is_the_callers_contract_error(tmp_path: Path, sandbox: str) -> None:
    """Found by review: JSON's ``"\\ud800"`` (no UTF-8 encoding) failed as ``tool_raised``
    UnicodeEncodeError, like the NUL above; ``\\udc80`` is a raw byte (surrogateescape) and runs."""
    host = await bash_host(tmp_path, sandbox=sandbox)
    try:
        result = await host.call("bash", {"command": "echo \ud800"})
        assert result.error is not None
        assert (result.error["type"], result.error["code"], result.error["pointer"]) == (
            "ContractError", "invalid_input", "/command"), result.error
        assert "U+D800" in result.error["message"]
        assert (await host.call("bash", {"command": "printf \udc80 | wc -c"})).output["stdout"].strip() == "1"
    finally:
        await host.close()


async def test_a_cwd_no_path_can_be_names_cwd_not_path(host: ToolHost) -> None:
    """Found by review: the path rules' ContractError pointed at ``/path``, which the bash tool has not."""
    for cwd in ("a\x00b", "a\ud800", "x" * 5000):
        result = await host.call("bash", {"command": "pwd", "cwd": cwd})
        assert result.error is not None
        assert (result.error["type"], result.error["pointer"]) == ("ContractError", "/cwd"), result.error
