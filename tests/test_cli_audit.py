"""``amplifier-tools audit tail|stats|verify`` run as commands over a log written by ``call``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from cli_helpers import cli

TOOLS_MODULE = '''
from amplifier_tools import ToolResult, ToolSpec

class Greet:
    spec = ToolSpec(
        name="local::demo.greet", version="1.0.0", description="Greet someone.", effect="Pure",
        input_schema={"type": "object", "properties": {"who": {"type": "string"}},
                      "required": ["who"], "additionalProperties": False},
    )
    name, description = spec.name, spec.description

    async def execute(self, input):
        if input["who"] == "crash":
            raise RuntimeError("backend exploded")
        return ToolResult(output="hello " + input["who"])

class Vault:
    spec = ToolSpec(name="local::demo.vault", version="1.0.0", description="Needs a scope.", effect="Pure",
                    input_schema={"type": "object"}, security={"required_scopes": ["vault:read"]})
    name, description = spec.name, spec.description

    async def execute(self, input):
        return ToolResult(output="opened")

async def mount(coordinator, config):
    await coordinator.mount("tools", Greet())
    await coordinator.mount("tools", Vault())
'''

# (arguments, expected exit status): 3 successes, then one contract, one execution and one auth failure.
CALLS = [
    (["demo_greet", '{"who": "Ada"}'], 0),
    (["demo_greet", '{"who": "Bo"}'], 0),
    (["demo_vault", "{}", "--scope", "vault:read"], 0),
    (["demo_greet", '{"who": 3}'], 3),
    (["demo_greet", '{"who": "crash"}'], 1),
    (["demo_vault", "{}"], 4),
]


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose audit log holds the records of ``CALLS``, made through the CLI."""
    project = tmp_path_factory.mktemp("audited")
    state = tmp_path_factory.mktemp("audited-state") / "state"
    (project / "demo_tools.py").write_text(TOOLS_MODULE)
    (project / "amplifier-tools.toml").write_text(textwrap.dedent(f'''
        state_dir = "{state}"
        [[modules]]
        module = "demo_tools"
    '''))
    for args, status in CALLS:
        out = cli(project, "call", *args)
        assert out.returncode == status, (args, out.stdout, out.stderr)
    return project


def log_of(project: Path) -> Path:
    """Where the host keeps the project's log: ``<state_dir>/audit.jsonl``, outside the project."""
    text = (project / "amplifier-tools.toml").read_text()
    return Path(text.split('state_dir = "', 1)[1].split('"', 1)[0]) / "audit.jsonl"


def test_the_host_puts_its_log_in_state_dir_not_in_the_project(logged: Path) -> None:
    assert log_of(logged).is_file() and (log_of(logged).parent / "audit.jsonl.anchor").is_file()
    assert not any(p.suffix in (".jsonl", ".anchor", ".lock") for p in logged.rglob("*"))


def test_audit_tail(logged: Path) -> None:
    everything = cli(logged, "audit", "tail", "-n", "100", "--json")
    assert everything.returncode == 0, everything.stderr
    records = [json.loads(line) for line in everything.stdout.splitlines()]
    assert [r["kind"] for r in records] == ["call"] * len(CALLS)
    assert [r["status"] for r in records] == ["ok", "ok", "ok", "error", "error", "error"]
    assert [(r["error"] or {}).get("type") for r in records[3:]] == ["ContractError", "ExecutionError", "AuthError"]
    assert records[2]["scopes"] == ["vault:read"]

    last_two = cli(logged, "audit", "tail", str(log_of(logged)), "-n", "2", "--json")
    assert last_two.returncode == 0
    assert [json.loads(line) for line in last_two.stdout.splitlines()] == records[-2:]


def test_audit_tail_reads_as_one_line_per_call_without_json(logged: Path) -> None:
    out = cli(logged, "audit", "tail", "-n", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    assert "  error  local::demo.greet  " in lines[0] and "ContractError[invalid_input]" in lines[0]
    assert "ExecutionError" in lines[1] and "backend exploded" in lines[1]
    assert "  error  local::demo.vault  " in lines[2] and "AuthError[missing_scope]" in lines[2]
    ok = cli(logged, "audit", "tail", "-n", "4").stdout.splitlines()[0]
    assert "  ok     local::demo.vault  " in ok and "anonymous" in ok


def test_audit_stats(logged: Path) -> None:
    records = [json.loads(line) for line in log_of(logged).read_text().splitlines()]
    durations = sorted(r["duration_ms"] for r in records)

    as_json = cli(logged, "audit", "stats", "--json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert (data["calls"], data["errors"], data["error_rate"]) == (6, 3, 0.5)
    assert data["errors_by_category"] == {"ContractError": 1, "ExecutionError": 1, "AuthError": 1}
    assert data["by_tool"] == {
        "local::demo.greet": {"calls": 4, "errors": 2, "error_rate": 0.5},
        "local::demo.vault": {"calls": 2, "errors": 1, "error_rate": 0.5},
    }
    latency = data["latency_ms"]
    assert durations[0] <= latency["p50"] <= latency["p95"] <= latency["p99"] <= durations[-1]

    text = cli(logged, "audit", "stats")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == (f"calls 6, errors 3 (50.0%); latency p50 {latency['p50']:.2f} ms, "
                        f"p95 {latency['p95']:.2f} ms, p99 {latency['p99']:.2f} ms")
    assert lines[1:] == ["  AuthError: 1", "  ContractError: 1", "  ExecutionError: 1",
                         "  local::demo.greet: 4 calls, 50.0% errors", "  local::demo.vault: 2 calls, 50.0% errors"]

    directory = cli(logged, "audit", "stats", str(log_of(logged).parent), "--json")
    assert directory.returncode == 0 and json.loads(directory.stdout)["calls"] == 6


def test_audit_verify_and_a_missing_log(logged: Path) -> None:
    ok = cli(logged, "audit", "verify")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("OK: 6 records in 1 file(s)") and "anchor:" in ok.stdout
    elsewhere = cli(logged.parent, "--config", str(logged / "amplifier-tools.toml"), "audit", "verify")
    assert elsewhere.returncode == 0 and elsewhere.stdout == ok.stdout, elsewhere.stdout + elsewhere.stderr
    missing = cli(logged, "audit", "stats", "nope.jsonl")
    assert missing.returncode == 2
    assert missing.stderr.splitlines()[0] == "error: nope.jsonl: no such file or directory"
    assert "Traceback" not in missing.stderr


def test_failures_with_json_still_print_json_and_a_new_directory_is_told_it_has_no_log(tmp_path: Path) -> None:
    """Found by a newcomer: with --json, a failure before any result printed nothing on stdout (a
    script's json.loads failed), and a directory without calls got only a raw state-dir path."""
    (tmp_path / "work").mkdir()
    for argv, status in ((["audit", "verify", "/nonexistent.jsonl", "--json"], 2),
                         (["audit", "stats", "--json"], 2),
                         (["call", "local::bash", "notjson", "--json"], 3)):
        out = cli(tmp_path / "work", *argv, env={"XDG_STATE_HOME": str(tmp_path / "state")})
        assert out.returncode == status, out.stdout + out.stderr
        error = json.loads(out.stdout)["error"]
        assert error["exit_status"] == status and error["message"] and error["hint"]
        assert out.stderr.startswith(f"error: {error['message']}\nhint: {error['hint']}")
    fresh = cli(tmp_path / "work", "audit", "tail", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert fresh.returncode == 2
    assert fresh.stderr.startswith("error: no call has been recorded for this working directory yet")


def test_verify_mentions_records_after_the_anchor_only_when_there_are_some(logged: Path) -> None:
    ok = cli(logged, "audit", "verify")
    assert ok.returncode == 0
    assert "anchor: the log holds everything its anchor records\n" in ok.stdout
    assert "written after" not in ok.stdout


def test_audit_help_is_the_audit_commands_help(tmp_path: Path) -> None:
    out = cli(tmp_path, "audit", "-h")
    assert out.returncode == 0 and "amplifier-tools audit [-h] SUBCOMMAND" in out.stdout, out.stdout + out.stderr
    assert all(f"    {command}" in out.stdout for command in ("verify", "tail", "stats")), out.stdout
    bad = cli(tmp_path, "list", "--bogus")
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr


def test_a_mistyped_audit_command_is_a_usage_error_in_the_command_lines_shape(tmp_path: Path) -> None:
    """Found by a new-user trial: ``audit verfy`` printed argparse's usage block, where every other
    command prints one ``error:`` line and a ``hint:`` line."""
    out = cli(tmp_path, "audit", "verfy")
    assert out.returncode == 2
    error, hint = out.stderr.splitlines()  # (argparse quotes the choices differently across versions)
    assert error.startswith("error: argument SUBCOMMAND: invalid choice: 'verfy' (choose from ") and "stats" in error
    assert hint == "hint: see 'amplifier-tools audit --help'", out.stderr
