"""What the documentation states about settings, defaults and hints is what the code does.

tests/test_docs_snippets.py runs the fenced examples and tests/test_docs.py checks the hook
reference, the published schema and that the example configuration loads; these check what those
do not: the defaults the configuration tables state (against the settings classes), the keys the
commented example configuration shows (each accepted by its plugin's settings class), the host
defaults the example sets, and the command line's hints for the bash tool's refusals.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from amplifier_tools.builtins.audit.settings import AuditSettings
from amplifier_tools.builtins.bash.settings import BashSettings
from amplifier_tools.builtins.filesystem.settings import FilesystemSettings
from amplifier_tools.mcp.settings import ServeClient, ServerSettings, ServeSettings
from amplifier_tools.plugin_settings import structure_settings

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLE = DOCS / "amplifier-tools.example.toml"

#: The scope a configuration table documents (from its heading or its header row) -> the settings class.
TABLE_CLASSES: dict[str, type[Any]] = {
    "[plugins.bash]": BashSettings,
    "[plugins.filesystem]": FilesystemSettings,
    "[plugins.audit]": AuditSettings,
    "[plugins.mcp.servers.<name>]": ServerSettings,
    "[plugins.mcp.serve]": ServeSettings,
    "[[plugins.mcp.serve.clients]]": ServeClient,
}
_SCOPE = re.compile(r"`(\[\[?plugins\.[^`]+\]\]?)`")
#: A default the tables write in words, not as a value: not compared.
_WORDS = object()


def config_tables() -> list[tuple[str, str, list[tuple[list[str], str]]]]:
    """``(file, scope, rows)`` of every ``| key | default | ...`` table of a plugin's settings; each
    row is (the keys of its first cell, its default cell)."""
    tables = []
    for path in sorted(DOCS.glob("*.md")):
        heading_scope = None
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.startswith("#"):
                found = _SCOPE.search(line)
                heading_scope = found.group(1) if found else None
            if not line.startswith("| key"):
                continue
            found = _SCOPE.search(line.split("|")[1])
            scope = found.group(1) if found else heading_scope
            if scope not in TABLE_CLASSES:
                continue
            rows = []
            for row in lines[number + 2:]:
                if not row.startswith("|"):
                    break
                cells = [cell.strip() for cell in row.strip("|").split(" | ")]
                keys = [re.match(r"\w+", key).group(0) for key in re.findall(r"`([^`]+)`", cells[0])]  # type: ignore[union-attr]
                rows.append((keys, cells[1]))
            tables.append((path.name, scope, rows))
    return tables


def documented_value(text: str) -> Any:
    """One default as a table writes it: a TOML value in backticks, ``none``, ``N MiB`` or a number."""
    text = text.strip()
    quoted = re.fullmatch(r"`([^`]+)`", text)
    if quoted:
        try:
            return tomllib.loads(f"v = {quoted.group(1)}")["v"]
        except tomllib.TOMLDecodeError:
            return _WORDS  # `0644 & ~umask`
    if text == "none":
        return None
    size = re.fullmatch(r"(\d+) MiB", text)
    if size:
        return int(size.group(1)) * 1024 * 1024
    number = re.fullmatch(r"(\d+)( records)?", text)
    return int(number.group(1)) if number else _WORDS


def documented_defaults(keys: list[str], cell: str) -> list[Any]:
    """The defaults a row states for its keys, in order (``100, 1000`` for two keys)."""
    head = re.split(r";| \(", cell, maxsplit=1)[0]
    parts = head.split(", ") if len(keys) > 1 else [head]
    if len(parts) != len(keys):
        return [_WORDS] * len(keys)
    return [documented_value(part) for part in parts]


def class_default(cls: type[Any], name: str) -> Any:
    default = attrs.fields_dict(cls)[name].default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()  # type: ignore[call-arg]
    return default


def _same(documented: Any, actual: Any) -> bool:
    """``none`` is an unset setting or an empty list or table (``clients``: none); a list is a tuple
    in the classes; ``false`` is never ``0``."""
    if documented is None:
        return actual is None or actual in ((), {})
    if isinstance(documented, list):
        return isinstance(actual, (list, tuple)) and tuple(documented) == tuple(actual)
    if isinstance(documented, bool) or isinstance(actual, bool):
        return documented is actual
    return bool(documented == actual)


TABLES = config_tables()


def test_every_plugin_settings_table_is_found() -> None:
    assert {scope for _, scope, _ in TABLES} == set(TABLE_CLASSES)


@pytest.mark.parametrize(("name", "scope", "rows"), TABLES, ids=[f"{n}:{s}" for n, s, _ in TABLES])
def test_a_settings_table_lists_exactly_the_settings_classs_keys(name: str, scope: str,
                                                                  rows: list[tuple[list[str], str]]) -> None:
    documented = {key for keys, _ in rows for key in keys}
    fields = set(attrs.fields_dict(TABLE_CLASSES[scope]))
    assert documented - fields == set(), f"{name} documents keys {scope} does not have"
    assert fields - documented == set(), f"{name} leaves keys of {scope} undocumented"


@pytest.mark.parametrize(("name", "scope", "rows"), TABLES, ids=[f"{n}:{s}" for n, s, _ in TABLES])
def test_the_defaults_a_settings_table_states_are_the_settings_classs(name: str, scope: str,
                                                                      rows: list[tuple[list[str], str]]) -> None:
    cls = TABLE_CLASSES[scope]
    compared = 0
    for keys, cell in rows:
        for key, documented in zip(keys, documented_defaults(keys, cell), strict=True):
            if documented is _WORDS:
                continue
            compared += 1
            actual = class_default(cls, key)
            assert _same(documented, actual), f"{name}: {scope} {key}: documented {documented!r}, default {actual!r}"
    # The clients table states its defaults in words (they fall back to [plugins.mcp.serve]'s).
    assert compared or scope == "[[plugins.mcp.serve.clients]]", f"{name}: no default of {scope} could be read"


def _uncommented_example() -> dict[str, Any]:
    """docs/amplifier-tools.example.toml with every commented-out ``key = value`` and table header
    taken in: what a reader gets by uncommenting the lines the file shows."""
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        shown = re.fullmatch(r"# (\[.*\]|[\w\"]+ = .*)", line)
        if shown:
            try:
                tomllib.loads(shown.group(1))
            except tomllib.TOMLDecodeError:
                pass
            else:
                line = shown.group(1)
        lines.append(line)
    return tomllib.loads("\n".join(lines))


def test_every_key_the_example_configuration_shows_is_accepted() -> None:
    """Uncommented, the example's bash and serve-mcp settings are valid: each key exists and each
    value has its type (test_docs.py loads the file as it is, where they are comments)."""
    from amplifier_tools.config import RESERVED_PLUGIN_KEYS, validate_config
    from amplifier_tools.mcp.settings import McpSettings

    example = _uncommented_example()
    validate_config(example, file=EXAMPLE.name)
    sections = example["plugins"]
    bash = {key: value for key, value in sections["bash"].items() if key not in RESERVED_PLUGIN_KEYS}
    assert len(bash) > 10, "the example's commented bash settings were not read"
    structure_settings(bash, BashSettings, "plugins.bash")
    structure_settings(sections["mcp"], McpSettings, "plugins.mcp")


def test_the_example_configurations_timeouts_are_the_hosts_defaults(tmp_path: Path) -> None:
    """The example sets the top-level timeouts as the defaults (it showed 30000 and 5000, half of
    them, with nothing saying they were not the defaults)."""
    from amplifier_tools import ToolHost
    from amplifier_tools.config import DEFAULT_HOOK_TIMEOUT_MS, DEFAULT_SHUTDOWN_GRACE_MS, DEFAULT_TIMEOUT_MS

    example = tomllib.loads(EXAMPLE.read_text())
    assert example["default_timeout_ms"] == DEFAULT_TIMEOUT_MS
    assert example["hook_timeout_ms"] == DEFAULT_HOOK_TIMEOUT_MS
    assert example["shutdown_grace_ms"] == DEFAULT_SHUTDOWN_GRACE_MS
    host = ToolHost(config={"state_dir": str(tmp_path / "state")}, working_dir=tmp_path, entry_points=False,
                    discover=False)
    assert host.capabilities["session.default_timeout_ms"] == DEFAULT_TIMEOUT_MS
    assert host.dispatcher.default_timeout == DEFAULT_HOOK_TIMEOUT_MS / 1000


async def _failed_call(tmp_path: Path, bash: dict[str, Any], tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    from amplifier_tools import ToolHost

    (tmp_path / "work" / "sub").mkdir(parents=True)
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"bash": {"sandbox": "off", **bash}}}
    async with ToolHost(config=config, working_dir=tmp_path / "work", entry_points=False, discover=False) as host:
        result = await host.call(tool, arguments)
    assert result.error is not None
    return result.error


async def test_the_hint_for_a_bash_cwd_outside_its_roots_names_bashs_setting(tmp_path: Path) -> None:
    """bash's cwd must lie in [plugins.bash] allowed_paths (docs/bash.md); the hint named only the
    filesystem plugin's allowed_write_paths, which do not apply once allowed_paths is set."""
    from amplifier_tools.cli import _call_hint

    error = await _failed_call(tmp_path, {"allowed_paths": ["sub"]}, "bash", {"command": "pwd", "cwd": "."})
    assert (error["code"], error["rule"]) == ("path_denied", "outside_write_roots")
    assert "[plugins.bash] allowed_paths" in _call_hint(error, "bash")


async def test_the_hint_for_a_denied_bash_command_names_bashs_rules(tmp_path: Path) -> None:
    """A command rule's refusal is bash's, not the policy plugin's; `describe bash` (the hint before)
    does not show the rules."""
    from amplifier_tools.cli import _call_hint

    error = await _failed_call(tmp_path, {"deny": ["rm"]}, "bash", {"command": "rm -f x"})
    assert error["code"] == "command_denied"
    hint = _call_hint(error, "bash")
    assert "[plugins.bash] allow / deny" in hint and "describe" not in hint


async def test_the_hint_for_a_read_outside_the_roots_still_names_the_filesystem_setting(tmp_path: Path) -> None:
    from amplifier_tools.cli import _call_hint

    error = await _failed_call(tmp_path, {}, "fs_read_file", {"path": "/etc/hostname"})
    assert "[plugins.filesystem] allowed_read_paths" in _call_hint(error, "fs_read_file")


async def test_grep_refuses_a_file_over_max_size_and_does_not_count_one_it_skips(tmp_path: Path) -> None:
    """docs/filesystem.md: per-file grep above max_size is refused, and files_searched counts only
    what was searched; a file over it was reported searched, with no match, and nothing said."""
    from amplifier_tools import ToolHost

    work = tmp_path / "work"
    work.mkdir()
    (work / "big.txt").write_text("needle\n" * 100)
    (work / "small.txt").write_text("needle\n")
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"filesystem": {"max_size": 100}}}
    async with ToolHost(config=config, working_dir=work, builtins=["filesystem"], entry_points=False,
                        discover=False) as host:
        one = await host.call("fs_grep", {"pattern": "needle", "path": "big.txt"})
        walk = await host.call("fs_grep", {"pattern": "needle", "glob": "*.txt"})
    assert one.error is not None and one.error["code"] == "file_too_large", one
    assert "max_size" in one.error["message"]
    assert walk.output["files_searched"] == 1 and [m["file"] for m in walk.output["matches"]] == ["small.txt"]
