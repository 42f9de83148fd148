"""The command line under hostile input (found by attack): arguments nested too deeply or naming a
key twice, usage errors and interruptions with ``--json``, an empty ``--config``, a plugin's text
carrying terminal escapes, SIGTERM during a running ``call``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import cli, cli_environ

ESCAPES = "\x1b]0;pwned\x07\x1b[2J"

EVIL_MODULE = f'''
from amplifier_tools import ToolResult, ToolSpec

class Evil:
    spec = ToolSpec(
        name="local::evil.tool", version="1.0.0", description="Evil " + {ESCAPES!r} + "\\nsecond line",
        effect="Pure",
        input_schema={{"type": "object"}},
    )
    name, description = spec.name, spec.description

    async def execute(self, input):
        return ToolResult(output="ok")

async def mount(coordinator, config):
    await coordinator.mount("tools", Evil())
'''

BAD_MOUNT_MODULE = f'''
async def mount(coordinator, config):
    raise RuntimeError("mount failed " + {ESCAPES!r})
'''


def test_deeply_nested_arguments_are_a_contract_error(tmp_path: Path) -> None:
    """5,000 nested arrays ended as ``RecursionError`` reported as an internal error, exit 1.
    Where the interpreter's parser takes them (CPython 3.13), the host refuses them instead."""
    deep = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"
    out = cli(tmp_path, "call", "local::fs.read_file", "-", "--json", stdin=deep)
    assert out.returncode == 3, out.stderr
    assert "RecursionError" not in out.stderr + out.stdout
    first = out.stderr.splitlines()[0]
    assert first == "error: arguments are nested too deeply to parse" or "nested deeper than 128 levels" in first, first
    result = json.loads(out.stdout)
    error = result["error"]
    assert error["type"] in ("CommandError", "ContractError"), error


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    """``{"path": "a", "path": "b"}`` silently read ``b``."""
    (tmp_path / "b").write_text("secret b\n")
    out = cli(tmp_path, "call", "local::fs.read_file", '{"path": "a", "path": "b"}')
    assert out.returncode == 3, out.stderr
    assert "secret b" not in out.stdout
    assert out.stderr.splitlines()[0] == (
        "error: arguments are ambiguous: the key 'path' appears more than once in an object")
    nested = cli(tmp_path, "call", "local::fs.read_file", '{"path": "b", "x": {"k": 1, "k": 2}}', "--json")
    assert nested.returncode == 3
    assert "'k'" in json.loads(nested.stdout)["error"]["message"]


@pytest.mark.parametrize("argv", [
    ["call", "local::fs.read_file", "{}", "--json", "--bogus"],
    ["list", "--json", "extra"],
    ["audit", "tail", "--json", "--bogus"],
    ["call", "local::fs.read_file", "{}", "--json", "--idempotency-key", ""],
])
def test_usage_errors_with_json_print_json(tmp_path: Path, argv: list[str]) -> None:
    """With ``--json``, a usage error left stdout empty."""
    out = cli(tmp_path, *argv)
    assert out.returncode == 2
    error = json.loads(out.stdout)["error"]
    assert (error["type"], error["exit_status"]) == ("UsageError", 2)
    assert out.stderr.splitlines()[0] == f"error: {error['message']}"
    assert out.stderr.splitlines()[1] == f"hint: {error['hint']}"


def test_empty_config_is_a_usage_error(tmp_path: Path) -> None:
    """``--config "$UNSET"`` silently used the configuration found in the working directory."""
    (tmp_path / "amplifier-tools.toml").write_text("[context]\nprincipal = \"from-discovery\"\n")
    out = cli(tmp_path, "--config", "", "list")
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.splitlines()[0].startswith("error: argument --config: an empty file name")
    as_json = cli(tmp_path, "--config=", "list", "--json")
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["error"]["exit_status"] == 2


def test_plugin_text_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """A description or a mount failure's message was printed raw: an OSC title, a screen clear."""
    (tmp_path / "evil_tools.py").write_text(EVIL_MODULE)
    (tmp_path / "bad_tools.py").write_text(BAD_MOUNT_MODULE)
    (tmp_path / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "evil_tools"\n')
    described = cli(tmp_path, "describe", "local::evil.tool")
    assert described.returncode == 0, described.stderr
    assert "\x1b" not in described.stdout and "\x07" not in described.stdout
    assert "description: Evil \\x1b]0;pwned\\x07\\x1b[2J\nsecond line" in described.stdout
    validated = cli(tmp_path, "validate", "bad_tools")
    assert validated.returncode == 1
    assert "\x1b" not in validated.stdout and "mount failed \\x1b]0;pwned" in validated.stdout
    other = tmp_path / "other"
    other.mkdir()
    (other / "bad_tools.py").write_text(BAD_MOUNT_MODULE)
    (other / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "bad_tools"\n')
    failed = cli(other, "list")
    assert failed.returncode == 2
    assert "\x1b" not in failed.stderr and "mount failed \\x1b]0;pwned\\x07" in failed.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(("signum", "status", "kind"), [
    (signal.SIGTERM, 143, "Terminated"),
    (signal.SIGINT, 130, "Interrupted"),
])
def test_a_signal_cancels_a_running_call(tmp_path: Path, signum: signal.Signals, status: int, kind: str) -> None:
    """SIGTERM killed the command outright: the bash command's processes (``sandbox = "off"``) outlived
    it and the audit log had no record of the call. With ``--json``, Ctrl-C left stdout empty."""
    (tmp_path / "amplifier-tools.toml").write_text('[plugins.bash]\nsandbox = "off"\n')
    command = 'sleep 120 & echo "$! $$" > pids; wait'
    process = subprocess.Popen(
        [sys.executable, "-m", "amplifier_tools", "call", "local::bash",
         json.dumps({"command": command, "timeout": 300}), "--json"],
        cwd=tmp_path, env=cli_environ(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Python ignores SIGINT for good when it starts with it ignored (a background job of a shell).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pid_file = tmp_path / "pids"
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().endswith("\n")):
            assert time.monotonic() < deadline and process.poll() is None, "the command did not start"
            time.sleep(0.05)
        pids = [int(pid) for pid in pid_file.read_text().split()]
        time.sleep(0.2)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    try:
        assert process.returncode == status, stderr
        assert json.loads(stdout)["error"]["type"] == kind
        deadline = time.monotonic() + 10
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, pids)), "the bash command's processes outlived the command line"
    finally:
        for pid in filter(_alive, pids):
            os.kill(pid, signal.SIGKILL)
    tail = cli(tmp_path, "audit", "tail", "--json")
    assert tail.returncode == 0, tail.stderr
    record = json.loads(tail.stdout.splitlines()[-1])
    assert (record["tool"], record["status"], record["error"]["code"]) == ("local::bash", "error", "cancelled")


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_serve_mcp_port_out_of_range_is_a_usage_error_with_a_hint(tmp_path: Path, port: str) -> None:
    """``--port 99999`` printed an ``error:`` line without a ``hint:`` line."""
    out = cli(tmp_path, "serve-mcp", "--port", port)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [f"error: argument --port: {port}: a TCP port is 0 to 65535 (0: any free port)",
                                       "hint: see 'amplifier-tools serve-mcp --help'"]


NOISY_MODULE = '''
print("noise at import")
from amplifier_tools import ToolResult, ToolSpec

class Noisy:
    spec = ToolSpec(name="local::noisy.tool", version="1.0.0", description="Prints.", effect="Pure",
                    input_schema={"type": "object"}, output_schema={"type": "object"},
                    examples=[{"input": {}, "output": {"a": 1}}])
    name, description = spec.name, spec.description

    async def execute(self, input):
        print("noise in execute")
        return ToolResult(output={"a": 1})

async def mount(coordinator, config):
    print("noise in mount")
    await coordinator.mount("tools", Noisy())
'''


@pytest.mark.parametrize("argv", [
    ["schema"], ["list", "--json"], ["describe", "local::noisy.tool", "--json"], ["plugins", "--json"],
    ["call", "local::noisy.tool", "{}", "--json"], ["validate", "noisy_tools", "--json"],
])
def test_a_plugins_prints_do_not_corrupt_json_output(tmp_path: Path, argv: list[str]) -> None:
    """A module's ``print`` at import, in ``mount`` or ``execute`` came before the JSON on stdout."""
    (tmp_path / "noisy_tools.py").write_text(NOISY_MODULE)
    (tmp_path / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "noisy_tools"\n')
    out = cli(tmp_path, *argv)
    assert out.returncode == 0, out.stderr
    json.loads(out.stdout)
    assert "noise in mount" in out.stderr


@pytest.mark.parametrize("option", ["--principal", "--role", "--environment", "--scope"])
def test_an_empty_context_option_is_a_usage_error(tmp_path: Path, option: str) -> None:
    """``--principal ''`` silently ran the call as the configured principal; ``--scope ''`` granted ``''``."""
    (tmp_path / "f").write_text("text\n")
    out = cli(tmp_path, "call", "local::fs.read_file", '{"path": "f"}', option, " ")
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.splitlines()[0].startswith(f"error: argument {option}: must not be empty")
    assert cli(tmp_path, "audit", "tail").returncode == 2  # nothing ran: no log yet


def test_arguments_from_a_closed_or_empty_stdin(tmp_path: Path) -> None:
    """``call TOOL - <&-`` ended in an ``AttributeError`` reported as an internal error (exit 1)."""
    closed = subprocess.run([sys.executable, "-m", "amplifier_tools", "call", "local::fs.read_file", "-", "--json"],
                            cwd=tmp_path, env=cli_environ(tmp_path), capture_output=True, text=True, timeout=120,
                            preexec_fn=lambda: os.close(0))
    assert closed.returncode == 2, closed.stderr
    assert closed.stderr.splitlines()[0] == "error: arguments '-' name stdin, which is closed"
    assert json.loads(closed.stdout)["error"]["exit_status"] == 2
    empty = cli(tmp_path, "call", "local::fs.read_file", "-", stdin="")
    assert empty.returncode == 3
    assert empty.stderr.splitlines()[0] == "error: arguments are empty (stdin gave nothing)"


def test_audit_error_paths_give_a_hint_and_json(tmp_path: Path) -> None:
    """``audit tail -n 99999999999999999999`` was an OverflowError reported as an internal error;
    ``verify --key-env`` naming an unset variable and ``stats`` of a device printed an ``error:`` line
    with no ``hint:`` line, and nothing on stdout with ``--json``."""
    (tmp_path / "f").write_text("text\n")
    assert cli(tmp_path, "call", "local::fs.read_file", '{"path": "f"}').returncode == 0
    huge = cli(tmp_path, "audit", "tail", "-n", "99999999999999999999", "--json")
    assert huge.returncode == 2, huge.stderr
    assert huge.stderr.splitlines()[0].startswith("error: argument -n: 99999999999999999999: more records than")
    assert json.loads(huge.stdout)["error"]["exit_status"] == 2
    unset = cli(tmp_path, "audit", "verify", "--key-env", "AMPLIFIER_TOOLS_ATTACK_UNSET_KEY", "--json")
    assert unset.returncode == 2
    assert unset.stderr.splitlines() == [
        "error: --key-env 'AMPLIFIER_TOOLS_ATTACK_UNSET_KEY': the variable is not set (or empty)",
        "hint: set it to the checkpoint HMAC key, or leave --key-env out to check the chain only"]
    assert json.loads(unset.stdout)["error"]["exit_status"] == 2
    device = cli(tmp_path, "audit", "stats", os.devnull, "--json")
    assert device.returncode == 2
    assert device.stderr.splitlines() == [f"error: {os.devnull}: not a regular file or directory",
                                          "hint: give the path of an audit log file, or of the directory that holds it"]
    assert json.loads(device.stdout)["error"]["exit_status"] == 2
