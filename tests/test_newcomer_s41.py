"""A newcomer's first hour (session 41): what a new user ran into, each pinned by a test."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli, cli_environ


@pytest.mark.parametrize("words", [["list"], ["audit", "verify", "--json"], ["policy", "status"], ["trust"]])
def test_a_removed_current_directory_is_named_not_a_bug(tmp_path: Path, words: list[str]) -> None:
    """Found by a newcomer's trial: run in a directory removed under the shell, every command said
    "FileNotFoundError: [Errno 2] No such file or directory" and that it was a bug (exit 1)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    command = (f"cd {shlex.quote(str(gone))} && rmdir {shlex.quote(str(gone))} && "
               f"exec {shlex.quote(sys.executable)} -m amplifier_tools {shlex.join(words)}")
    done = subprocess.run(["sh", "-c", command], env=cli_environ(tmp_path, env={"XDG_STATE_HOME": str(tmp_path)}),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "error: working_dir: the current directory no longer exists" in done.stderr
    assert "hint: cd to an existing directory" in done.stderr and "bug" not in done.stderr
    if "--json" in words:
        assert json.loads(done.stdout)["error"]["type"] == "ConfigError"


@pytest.mark.parametrize("words", [["audit", "verify", "--json"], ["audit", "tail", "--json"],
                                   ["audit", "stats", "--json"]])
def test_audit_json_is_json_on_a_configuration_error(tmp_path: Path, words: list[str]) -> None:
    """Found by a newcomer's trial: with a configuration error, ``audit verify --json`` printed nothing
    on stdout, where every other command prints the error as JSON (docs/cli.md)."""
    config = tmp_path / "bad.toml"
    config.write_text("default_timout_ms = 5\n")
    done = cli(tmp_path, "--config", str(config), *words, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 2, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["type"] == "ConfigError" and "default_timout_ms" in error["message"]
    assert error["hint"] == "did you mean 'default_timeout_ms'?" and error["exit_status"] == 2
    text = cli(tmp_path, "--config", str(config), *words[:-1], env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert text.returncode == 2 and text.stdout == ""


@pytest.mark.parametrize("words", [["list"], ["call", "fs_list_dir", "{}"], ["trust"]])
def test_a_state_directory_that_cannot_be_made_names_xdg_state_home(tmp_path: Path, words: list[str]) -> None:
    """Found by a newcomer's trial: with ``$XDG_STATE_HOME`` read-only (here: a file), ``list`` hinted
    "check the configuration" though none named the directory, and ``trust`` said
    "OSError: [Errno 30] Read-only file system" and that it was a bug (exit 1)."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    work = tmp_path / "work"
    work.mkdir()
    done = cli(work, *words, env={"XDG_STATE_HOME": str(blocked)})
    assert done.returncode == 2, done.stderr
    assert f"error: state_dir: cannot create the state directory {blocked}/" in done.stderr
    assert ("hint: it lies under $XDG_STATE_HOME (~/.local/state when unset): set XDG_STATE_HOME to a "
            "directory this user can write") in done.stderr


def test_a_configured_state_directory_that_cannot_be_made_names_state_dir(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    config = tmp_path / "outside.toml"
    config.write_text(f'state_dir = "{blocked}/state"\n')
    work = tmp_path / "work"
    work.mkdir()
    done = cli(work, "--config", str(config), "list", env={"XDG_STATE_HOME": str(tmp_path / "xdg")})
    assert done.returncode == 2, done.stderr
    assert f"error: {config}: state_dir: cannot create the state directory {blocked}/state" in done.stderr
    assert "hint: set state_dir to a directory this user can create and write" in done.stderr
