"""Host configuration: one mapping, validated against a published JSON Schema.

Sources: a mapping passed to ``ToolHost(config=...)``, or a file — TOML
(``amplifier-tools.toml``, or ``[tool.amplifier-tools]`` in ``pyproject.toml``)
or the seed's mount-plan YAML (``tools:``/``hooks:`` lists of
``{module, config}``; needs PyYAML). ``${VAR}`` in string values is replaced
from the environment when loading a file; an unset variable is an error. The
substituted values are handed back to the host, which treats each as a secret
(``${VAR}`` is how a credential reaches an MCP server's ``env``).

Unknown keys and wrong types are errors naming the file and key path; nothing
is silently ignored. Plugin sections are validated by their plugins, except
for the host's reserved keys (``enabled``, ``on_error``, ``hook_timeout_ms``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from .errors import ConfigError, did_you_mean, double_bracket_hint, shown_value
from .schema import CompiledSchema, Validator, schema_problems
from .spec import is_finite, shown_number

log = logging.getLogger("amplifier_tools.config")

RESERVED_PLUGIN_KEYS: Final = ("enabled", "on_error", "hook_timeout_ms")
#: The host's defaults for the top-level timeouts, in milliseconds (docs/amplifier-tools.example.toml
#: shows them; tests/test_docs_accuracy.py keeps the two in step).
DEFAULT_TIMEOUT_MS: Final = 60_000
DEFAULT_HOOK_TIMEOUT_MS: Final = 10_000
DEFAULT_SHUTDOWN_GRACE_MS: Final = 5_000

_MODULE_ENTRY: Final = {
    "type": "object",
    "properties": {
        "module": {"type": "string", "minLength": 1},
        "config": {"type": "object"},
        "source": {"type": "string"},
    },
    "required": ["module"],
    "additionalProperties": False,
}
#: The mount-plan form of ``tools``: a list of module entries.
_MOUNT_PLAN_LIST: Final = {"type": "array", "items": _MODULE_ENTRY}

#: The JSON Schema of the host configuration (published as ``docs/config.schema.json``).
CONFIG_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "amplifier-tools host configuration",
    "type": "object",
    "properties": {
        "working_dir": {
            "type": "string", "minLength": 1,
            "description": "Session working directory (default: cwd; a relative path is relative to the current "
                           "directory of the process, not to the file).",
        },
        "state_dir": {
            "type": "string", "minLength": 1,
            "description": "Where the host keeps its own state (audit log, anchor, locks, spill files, policy "
                           "store); default $XDG_STATE_HOME/amplifier-tools/workspaces/<hash of working_dir>. "
                           "Must lie outside every tool's writable roots.",
        },
        "shutdown_grace_ms": {
            "type": "number", "minimum": 0,
            "description": "How long close() lets in-flight calls finish before cancelling them (default "
                           f"{DEFAULT_SHUTDOWN_GRACE_MS}).",
        },
        "default_timeout_ms": {
            "type": "number", "exclusiveMinimum": 0,
            "description": f"Timeout of a tool without its own timeout_ms (default {DEFAULT_TIMEOUT_MS}).",
        },
        "hook_timeout_ms": {
            "type": "number", "exclusiveMinimum": 0,
            "description": f"Timeout of an async hook whose plugin sets none (default {DEFAULT_HOOK_TIMEOUT_MS}).",
        },
        "load_plugins": {
            "type": "array", "items": {"type": "string"},
            "description": "Allowlist of entry-point plugins and modules to load.",
        },
        "disable_plugins": {
            "type": "array", "items": {"type": "string"}, "description": "Plugins never to load.",
        },
        "context": {
            "type": "object",
            "description": "Defaults for calls made without a ToolContext.",
            "properties": {
                "principal": {"type": "string"},
                "role": {"type": "string"},
                "environment": {"type": "string"},
                "scopes": {"type": "array", "items": {"type": "string"}},
            },
            "additionalProperties": False,
        },
        "secrets": {
            "type": "object",
            "description": "Secret reference name -> environment variable that holds its value.",
            # a name no environment can hold ("", "A=B") would only fail each call that needs it
            "additionalProperties": {"type": "string", "minLength": 1, "pattern": "^[^=]+$"},
        },
        "plugins": {
            "type": "object",
            "description": "Per-plugin sections, passed to each plugin's mount.",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "enabled": {"type": "boolean"},
                    "on_error": {"enum": ["fail", "ignore"]},
                    "hook_timeout_ms": {"type": "number", "exclusiveMinimum": 0},
                },
            },
        },
        "tools": {
            "description": "Per-tool contract overrides (a table by tool name), "
                           "or a mount-plan list of {module, config}.",
            "oneOf": [
                {"type": "object", "additionalProperties": {"type": "object"}},
                _MOUNT_PLAN_LIST,
            ],
        },
        "modules": {"type": "array", "items": _MODULE_ENTRY, "description": "Seed-style modules to mount."},
        "hooks": {"type": "array", "items": _MODULE_ENTRY, "description": "Mount-plan hook modules."},
    },
    "additionalProperties": False,
}


@functools.cache
def _validator() -> Validator:
    """The validator of ``CONFIG_SCHEMA``: the compiled fast path, jsonschema for what it does not
    accept (imported then, with the messages), made when a configuration is first checked."""
    return CompiledSchema(CONFIG_SCHEMA)


_SECRETS_HINT: Final = ('each [secrets] value is the name of the environment variable that holds the secret, '
                        'e.g. deploy = "DEPLOY_KEY"')

_ENV_REF: Final = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _dotted(pointer: str) -> str:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.strip("/").split("/") if p]
    return ".".join(parts) or "(top level)"


def _allowed_keys(pointer: str) -> list[str]:
    """The keys ``CONFIG_SCHEMA`` allows beside the one at ``pointer`` (for did-you-mean hints)."""
    schema: Any = CONFIG_SCHEMA
    for segment in pointer.strip("/").split("/")[:-1]:
        if segment.isdigit():  # an item of a list: of the list branch where a table-or-list union has one
            branches = [schema, *schema.get("oneOf", ())]
            schema = next((b["items"] for b in branches if isinstance(b, dict) and "items" in b), None)
        else:
            properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
            schema = properties.get(segment, schema.get("additionalProperties") if isinstance(schema, dict) else None)
        if not isinstance(schema, dict):
            return []
    return list(schema.get("properties", {})) if isinstance(schema, dict) else []


def validate_config(raw: Any, *, file: str | None = None) -> dict[str, Any]:
    """A checked copy of ``data``; ``ConfigError`` naming the file and key path otherwise.

    The mount-plan form (``tools`` as a list) is folded into ``modules``.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"configuration must be a table/mapping, got {type(raw).__name__}", file=file)
    data: dict[str, Any] = dict(raw)
    if isinstance(data.get("tools"), list) or isinstance(data.get("hooks"), list):
        _fold_mount_plan(data, file)
    _reject_unusable(data, "", file)  # after the agent's sections are dropped: they are not read here
    validator = _validator()
    if not validator.is_valid(data):
        pointer, message = schema_problems(validator, data, limit=1, show=shown_value)[0]
        section = pointer.split("/")[1] if pointer.count("/") >= 1 else ""
        if section in ("tools", "hooks", "modules") and isinstance(data.get(section), list):
            # A mount plan's list: the list's own problems, not "not valid under any of the given schemas"
            # for the table-or-list union, and a misspelt key before the key it leaves missing (found by a
            # new-user trial: ``modul:`` said only the former).
            problems = schema_problems(CompiledSchema(_MOUNT_PLAN_LIST), data[section], limit=5, show=shown_value)
            if problems:
                inner, message = next((p for p in problems if p[1].endswith("is not an allowed property")),
                                      problems[0])
                pointer = f"/{section}{inner}"
        expected = _allowed_keys(pointer) if message.endswith("is not an allowed property") else None
        hint = _SECRETS_HINT if section == "secrets" and expected is None else None
        if pointer.count("/") == 1 and message.endswith("is not of type 'array'") \
                and isinstance(data.get(_dotted(pointer)), Mapping):
            hint = double_bracket_hint(_dotted(pointer))
        if expected is not None and pointer.count("/") == 1:
            hint = _top_level_hint(_dotted(pointer), data.get(_dotted(pointer)), expected)
        raise ConfigError(message, key=_dotted(pointer), file=file, expected=expected, hint=hint)
    if isinstance(data.get("tools"), list):
        data["modules"] = list(data.get("modules", [])) + data.pop("tools")
    if "hooks" in data:
        data["modules"] = list(data.get("modules", [])) + data.pop("hooks")
    return data


def _top_level_hint(key: str, value: Any, expected: list[str]) -> str | None:
    """The hint for a table at the top level that the configuration has no key for, where the
    generic one (did-you-mean, else the keys allowed) misleads (found by a newcomer's trial):
    ``[tool.amplifier-tools]`` pasted from a ``pyproject.toml`` was asked "did you mean 'tools'?",
    and ``[filesystem]``, a plugin's settings, was only told to be removed. None: the generic one."""
    if key == "tool" and isinstance(value, Mapping) and PYPROJECT_SECTION in value:
        return (f"[tool.{PYPROJECT_SECTION}] is the table of a pyproject.toml; in a file of its own, write its keys "
                f"at the top level ([tool.{PYPROJECT_SECTION}.plugins.bash] as [plugins.bash])")
    if isinstance(value, Mapping) and did_you_mean(key, expected) is None:
        return (f"if {key!r} is a plugin, its settings go in [plugins.{key}]; else remove or rename the table (the "
                f"keys allowed here: {', '.join(sorted(expected))})")
    return None


#: The sections of an Amplifier mount plan that configure the agent, not its tools: read by
#: amplifier-core, passed over here (with a warning naming them).
AGENT_PLAN_SECTIONS: Final = ("session", "providers", "agents", "context", "orchestrator", "ui", "spawn")


def _fold_mount_plan(data: dict[str, Any], file: str | None) -> None:
    """An Amplifier mount plan: its agent sections are dropped, saying so (found by a new-user
    trial: a real plan failed with "'session' is not an allowed property"), and a module's
    ``source`` — where Amplifier installs it from — is said to be unused: this host mounts the
    module installed in its environment, whatever version that is."""
    where = f" in {file}" if file else ""
    dropped = [key for key in AGENT_PLAN_SECTIONS if key in data]
    for key in dropped:
        del data[key]
    if dropped:
        log.warning("mount plan%s: %s configure the agent, not its tools; amplifier-tools mounts only the "
                    "tools: and hooks: modules", where, ", ".join(repr(key) for key in dropped))
    for section in ("tools", "hooks"):
        for entry in data.get(section) or ():
            if isinstance(entry, Mapping) and isinstance(entry.get("source"), str):
                log.warning("mount plan%s: module %r: source %r is not installed by amplifier-tools; the module "
                            "installed in this environment is mounted (pip install it from that source to use "
                            "it)", where, entry.get("module"), entry["source"])


#: A module entry of a mount plan (``tools[0]``), whose ``config`` is that plugin's own settings.
_PLAN_ENTRY: Final = re.compile(r"(?:tools|hooks|modules)\[[0-9]+\]")


def _reject_unusable(value: Any, path: str, file: str | None, *, own: bool = False) -> None:
    """Values no setting can hold, wherever in the configuration they stand (plugin sections too):
    ``ConfigError`` naming the key. NaN and infinity (``window_ms = nan`` would silently disable a
    limit), an integer past a float's range; a NUL byte in a string or a key (no path, command, user
    or environment variable can hold one: found by attack, ``working_dir = "a\\u0000b"`` ended in a
    bare ``ValueError``); a key that is not a string (a YAML ``1:``, found by attack: it ended in a
    bare ``TypeError``), except in a plugin's own settings (``own``: below ``plugins.<name>``, a
    mount-plan module's ``config``), which are passed to the plugin as they are and judged by it
    (found by review: a plugin's ``codes: {429: 5}`` that it had always been given was refused)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"must be a finite number, got {value!r}", key=path or None, file=file)
    if type(value) is int and not is_finite(value):
        # found by attack: ``shutdown_grace_ms`` of 400 digits (YAML, or a dict) started, and close()
        # raised OverflowError; ``default_timeout_ms`` and ``hook_timeout_ms`` raised it at start
        raise ConfigError(f"must be a finite number, got {shown_number(value)}", key=path or None, file=file,
                          hint="write a smaller number: every time and count is computed as a float")
    if isinstance(value, str) and "\x00" in value:
        raise ConfigError("must not contain a NUL byte (\\u0000)", key=path or None, file=file,
                          hint="no path, command, name or environment variable can hold a NUL byte; remove it")
    if isinstance(value, Mapping):
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            if not isinstance(k, str) and not own:
                raise ConfigError(f"key {k!r} is not a string", key=where, file=file,
                                  hint="quote the key (YAML reads 1, true or a date as a value of that type)")
            if isinstance(k, str) and "\x00" in k:
                raise ConfigError("the key must not contain a NUL byte (\\u0000)", key=where.replace("\x00", "\\u0000"),
                                  file=file, hint="remove the NUL byte from the key")
            plugins_own = path == "plugins" or (k == "config" and _PLAN_ENTRY.fullmatch(path) is not None)
            _reject_unusable(v, where, file, own=own or plugins_own)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _reject_unusable(v, f"{path}[{i}]", file, own=own)


def plugin_section(config: Mapping[str, Any], plugin: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(own config, reserved settings)`` of one plugin's section."""
    section = dict(config.get("plugins", {}).get(plugin, {}))
    reserved = {key: section.pop(key) for key in RESERVED_PLUGIN_KEYS if key in section}
    return section, reserved


def _substitute(value: Any, file: str, path: str, used: set[str]) -> Any:
    if isinstance(value, str):
        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                # A hint naming what to set (found by a new-user trial: the generic "fix the
                # configuration" hint left the user guessing whether the file or the shell was wrong).
                raise ConfigError(f"environment variable ${{{name}}} is not set", key=path or None, file=file,
                                  hint=f"export {name}=... in the host's environment, or write the value "
                                       "literally (${VAR} is for secrets: its value is redacted from every output)")
            used.add(os.environ[name])
            return os.environ[name]

        return _ENV_REF.sub(replace, value)
    if isinstance(value, dict):
        return {k: _substitute(v, file, f"{path}.{k}" if path else str(k), used) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, file, f"{path}[{i}]", used) for i, v in enumerate(value)]
    return value


def load_config_file(path: str | os.PathLike[str], *, substituted: set[str] | None = None,
                     sha256: list[str] | None = None) -> dict[str, Any]:
    """Read and validate a TOML, pyproject.toml or mount-plan YAML file.

    ``substituted``, when given, receives every value a ``${VAR}`` was replaced with (the host
    registers them as secrets); ``sha256`` the digest of the bytes read (the host's trust check
    judges the file it loaded, not what is at the path when it checks)."""
    file = str(path)
    p = Path(path)
    text = read_config_text(p, sha256=sha256)
    if p.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            # The hint: without one the command line said "fix the configuration", and the file is
            # fine (found by a new-user trial of the core install).
            raise ConfigError("YAML configuration needs PyYAML (pip install 'amplifier-tools[yaml]')",
                              file=file, hint="pip install 'amplifier-tools[yaml]' in this environment, or "
                                              "write the configuration as TOML") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"not valid YAML: {exc}", file=file) from None
    else:
        from ._toml import TOMLDecodeError, loads

        try:
            data = loads(text)
        except TOMLDecodeError as exc:
            # found by attack: a file saved with a byte-order mark said only "Invalid statement (at
            # line 1, column 1)", where nothing is to be seen
            bom = " (the file starts with a byte-order mark, U+FEFF, which TOML does not allow)" \
                if text.startswith("\ufeff") else ""
            raise ConfigError(f"not valid TOML: {exc}{bom}", file=file,
                              hint="save the file as UTF-8 without a byte-order mark" if bom else None) from None
        if p.name == "pyproject.toml":
            section = pyproject_section(data, file)
            if section is None:  # found by attack: --config pyproject.toml without one ran on the defaults
                raise ConfigError("has no [tool.amplifier-tools] table: nothing in it configures this host",
                                  file=file, hint="add a [tool.amplifier-tools] table to it, or name an "
                                  "amplifier-tools.toml (--config or AMPLIFIER_TOOLS_CONFIG)")
            data = section
    used: set[str] = set() if substituted is None else substituted
    checked: dict[str, Any] = validate_config(_substitute(data, file, "", used), file=file)
    return checked


#: The largest configuration file read (a ``pyproject.toml`` too): a file a tool made huge (found by
#: attack: ``truncate -s 1G pyproject.toml``) stops the start at once, instead of reading it all.
MAX_CONFIG_BYTES: Final = 4 * 1024 * 1024


class ConfigTooLarge(ConfigError):
    """A configuration file over ``MAX_CONFIG_BYTES``."""


def read_config_text(path: Path, *, sha256: list[str] | None = None) -> str:
    """The text of a configuration file, at most ``MAX_CONFIG_BYTES``; ``ConfigError`` naming the
    file when it cannot be read, is no regular file (never read: found by attack, a FIFO named
    with ``--config`` hung the command), is larger, or is not UTF-8. ``sha256`` receives the
    digest of the bytes read."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ConfigError("not a regular file (a FIFO, device or directory): not read as a configuration",
                                  file=str(path), hint="name the configuration file itself")
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read configuration: {exc.strerror}", file=str(path)) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigTooLarge(f"the file is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB: not read as "
                          "a configuration", file=str(path),
                          hint="a configuration is small; check what wrote this file")
    if sha256 is not None:
        sha256.append(hashlib.sha256(data).hexdigest())
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", file=str(path)) from None


def discover_config_file(cwd: str | os.PathLike[str] | None = None) -> Path | None:
    """The config file to use when none is named: ``$AMPLIFIER_TOOLS_CONFIG``, then
    ``./amplifier-tools.toml``, then ``./pyproject.toml`` if it has ``[tool.amplifier-tools]``.

    (An explicit ``--config`` or ``ToolHost(config=...)`` comes before all of these.)
    """
    named = os.environ.get("AMPLIFIER_TOOLS_CONFIG")
    if named:
        return Path(named)
    base = Path(cwd) if cwd is not None else Path.cwd()
    local = base / "amplifier-tools.toml"
    if local.is_file():
        return local
    pyproject = base / "pyproject.toml"
    if pyproject.is_file():
        from ._toml import TOMLDecodeError, loads

        try:
            data = loads(read_config_text(pyproject))
        except ConfigTooLarge:
            raise  # too large to look for our section in: said, rather than starting without it
        except (ConfigError, TOMLDecodeError):
            return None  # not ours to complain about unless it holds our section
        if pyproject_section(data, str(pyproject)) is not None:
            return pyproject
    return None


#: The ``pyproject.toml`` table this host reads: ``[tool.amplifier-tools]``.
PYPROJECT_SECTION: Final = "amplifier-tools"


def pyproject_section(data: Any, file: str) -> Any:
    """``[tool.amplifier-tools]`` of a parsed ``pyproject.toml``, or None when it has none.

    ``ConfigError`` for a table that is meant to be ours but spelled otherwise
    (``[tool.amplifier_tools]``, ``[tool.Amplifier-Tools]``, a look-alike): found by a new-user trial, such a
    section, rules and all, was ignored without a word and the host ran on its defaults."""
    tools = data.get("tool") if isinstance(data, dict) else None
    if not isinstance(tools, dict):
        return None
    section = tools.get(PYPROJECT_SECTION)
    if section is not None:
        return section  # a table, or what the validation then refuses naming the file
    for key in tools:
        if not isinstance(key, str):
            continue
        # A look-alike too (a Cyrillic letter, a zero-width or trailing space; quoted in the file; found by
        # attack: a tool respelled the header, the host found no configuration, and the operator, told
        # the file they could see was "gone", accepted running on the defaults with amplifier-tools trust).
        if key.strip().lower().replace("_", "-").replace(".", "-") == PYPROJECT_SECTION or (
                not key.isascii() and did_you_mean(key, [PYPROJECT_SECTION]) is not None):
            odd = sorted({f"{char!r} (U+{ord(char):04X})" for char in key if not char.isascii() or char.isspace()})
            held = f" (its name holds {', '.join(odd)}: a look-alike, maybe a tool's)" if odd else ""
            raise ConfigError(f"[tool.{key}] is not read{held}: this host's section is [tool.{PYPROJECT_SECTION}]",
                              file=file, key=f"tool.{key}",
                              hint=f"rename the table to [tool.{PYPROJECT_SECTION}] "
                                   f"({'in ASCII' if odd else 'with a hyphen'})")
    return None
