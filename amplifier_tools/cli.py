"""The ``amplifier-tools`` command line (argparse).

Exit statuses fit scripts: 0 success; 1 a tool execution failure, a failed
``validate`` or an internal error; 2 usage or configuration error; 3 contract
error; 4 policy or auth failure; 130 interrupted; 141 stdout closed early (as
with ``| head``); 143 terminated (SIGTERM). Errors print one line and a hint line on stderr;
``--verbose`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import functools
import json
import os
import sys
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from . import __version__

if TYPE_CHECKING:  # imported where used: ``--help`` and usage errors need none of them (tests/test_cli.py)
    from pathlib import Path

    from .host import ToolHost
    from .loader import PluginInfo
    from .models import ToolResult

# The host reads these; repeated here so that parsing the command line imports no host code
# (tests/test_cli.py checks they agree).
ENV_CONFIG = "AMPLIFIER_TOOLS_CONFIG"
ENV_DISABLE = "AMPLIFIER_TOOLS_DISABLE_PLUGINS"
FORMATS = ("openai", "anthropic", "mcp")

EXIT_OK = 0
EXIT_EXECUTION = 1
EXIT_USAGE = 2
EXIT_CONTRACT = 3
EXIT_POLICY = 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process ended by it
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process killed by SIGPIPE
#: The built-in bash tool (``builtins/bash/tool.py``), named here so a hint needs no import of it.
BASH_TOOL = "local::bash"
VERBOSE_HINT = "run with --verbose for the traceback"

_EXIT_BY_CATEGORY = {
    "ContractError": EXIT_CONTRACT,
    "PolicyError": EXIT_POLICY,
    "AuthError": EXIT_POLICY,
    "ExecutionError": EXIT_EXECUTION,
    "SystemError": EXIT_EXECUTION,
}


class CommandError(Exception):
    """A user-facing failure: one line, a hint, an exit status."""

    def __init__(self, message: str, *, hint: str | None = None, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.hint = hint
        self.status = status


class UsageParser(argparse.ArgumentParser):
    """argparse, with usage errors in the CLI's shape: one line, then a hint."""

    #: Whether the command line asked for ``--json`` (``main`` sets it before parsing): a usage error then
    #: also prints ``{"error": ...}`` on stdout, as every other failure does (found by attack: ``call TOOL
    #: '{}' --json --bogus`` left stdout empty).
    json_requested = False

    def error(self, message: str) -> NoReturn:
        self.fail(message, f"see '{self.prog} --help'")

    def fail(self, message: str, hint: str) -> NoReturn:
        """A usage error with ``hint`` of the caller's (``error``'s: this parser's help)."""
        if UsageParser.json_requested:
            print(json.dumps({"error": {"type": "UsageError", "message": message, "hint": hint,
                                        "exit_status": EXIT_USAGE}}, ensure_ascii=False))
        self.exit(EXIT_USAGE, f"error: {printable(message)}\nhint: {hint}\n")


def printable(text: object, keep: str = "") -> str:
    """``text`` for a terminal: control and other unprintable characters escaped, except those in
    ``keep`` (found by attack: a plugin's description, or its mount failure's message, printed raw by
    ``describe``, ``validate`` or an ``error:`` line, and a tool name a model chose printed by ``audit
    tail``, could retitle or clear the operator's terminal, or hide lines)."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii") for c in text)


def printable_block(text: object) -> str:
    """``text`` as ``printable`` gives it, but keeping each newline that starts a line indented by
    four spaces: an error's quoted block (an MCP server's stderr tail, ``its stderr ended with:``)
    reads as lines, as the docs show it, and an indented line cannot pass for an ``error:`` or
    ``hint:`` line. Any other newline is escaped (found by a newcomer's trial: the tail was printed
    as one line joined by literal ``\\n``)."""
    first, *rest = str(text).split("\n")
    return printable(first) + "".join(("\n" if line.startswith("    ") else "\\n") + printable(line)
                                      for line in rest)


def _config_file(value: str) -> str:
    """``--config``: a file name (found by attack: ``--config "$UNSET"`` silently used the discovered
    configuration instead, the workspace's own ``amplifier-tools.toml``)."""
    if not value:
        raise argparse.ArgumentTypeError("an empty file name; name the configuration file, or leave --config out")
    return value


def _parser(only: str | None = None) -> UsageParser:
    """The command line's parser; with ``only``, the top level and that one command: what parsing a
    line that names it needs (``_command_named``), without the other dozen commands' parsers
    (≈ 2 % of ``list``'s instructions, argparse's translations and formatters mostly)."""
    parser = UsageParser(
        prog="amplifier-tools", description="Run AI agents' tool calls under a contract."
    )
    parser.add_argument("--version", action="store_true", help="print versions of the package and its plugins")
    parser.add_argument("--config", type=_config_file, help="config file (TOML, pyproject.toml or mount-plan YAML)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details; show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    if only in (None, "list"):
        p = sub.add_parser("list", help="mounted tools")
        p.add_argument("--json", action="store_true")
    if only in (None, "plugins"):
        p = sub.add_parser("plugins", help="loaded and failed plugins")
        p.add_argument("--json", action="store_true")
    if only in (None, "describe"):
        p = sub.add_parser("describe", help="one tool's whole contract")
        p.add_argument("tool")
        p.add_argument("--json", action="store_true")
    if only in (None, "schema"):
        p = sub.add_parser("schema", help="tool definitions for a model API")
        p.add_argument("--format", choices=FORMATS, default="openai")
        p.add_argument("--json", action="store_true", help="the definitions are always JSON; accepted for uniformity")
    if only in (None, "validate"):
        p = sub.add_parser("validate", help="conformance check of a tool module, plugin or distribution")
        p.add_argument("target", help="import path of a module, or an entry-point / distribution name")
        p.add_argument("--json", action="store_true")
        p.add_argument("--no-run", action="store_true", help="do not run the examples of Pure tools")
    if only in (None, "trust"):
        sub.add_parser("trust", help="accept the configuration as it is now (after reviewing a change)")
    if only in (None, "audit"):
        p = sub.add_parser("audit", help="verify, tail or summarize an audit log", add_help=False)
        p.add_argument("audit_args", nargs=argparse.REMAINDER)
    if only in (None, "policy"):
        p = sub.add_parser("policy", help="the policy store's live state")
        policy = p.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", required=True)
        status = policy.add_parser("status", help="live counters, leases, records of the configured store")
        status.add_argument("--json", action="store_true")
    if only in (None, "call"):
        p = sub.add_parser("call", help="run one call through the whole pipeline")
        p.add_argument("tool")
        p.add_argument("arguments", nargs="?", default="{}", help="JSON object, or - to read it from stdin")
        p.add_argument("--principal", type=_named)
        p.add_argument("--role", type=_named)
        p.add_argument("--environment", type=_named)
        p.add_argument("--scope", type=_named, action="append", default=[], help="grant a scope (repeatable)")
        p.add_argument("--idempotency-key", type=_idempotency_key,
                       help="replay the stored result of an earlier call with this key and these arguments "
                            "(kept in <state_dir>/policy.sqlite3 unless [plugins.policy] store says otherwise)")
        p.add_argument("--json", action="store_true", help="print the whole ToolResult as JSON")
    if only in (None, "mcp"):
        p = sub.add_parser("mcp", help="imported MCP servers")
        mcp = p.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND", required=True)
        pin = mcp.add_parser("pin", help="write the current definition hashes of the configured servers into the "
                                         "config's pins (their tools are not called)")
        pin.add_argument("--print", action="store_true", dest="print_only",
                         help="print the pins as TOML instead of writing them")
        pin.add_argument("--server", action="append", default=[], help="only this server (repeatable)")
    if only in (None, "serve-mcp"):
        p = sub.add_parser("serve-mcp",
                           help="serve tools to MCP clients (stdio, or Streamable HTTP with bearer tokens)")
        p.add_argument("--working-dir", help="session working directory (default: current directory)")
        add_serve_options(p)
    return parser


#: The commands, as ``_parser`` adds them.
COMMANDS = ("list", "plugins", "describe", "schema", "validate", "trust", "audit", "policy", "call", "mcp",
            "serve-mcp")
_TOP_LONG_OPTIONS = ("--version", "--config", "--verbose", "--help")


def _command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, where that is certain before parsing: the first word after the
    top-level options (``-v``, ``--version``, ``--verbose``, ``--config FILE``, ``--config=FILE``, or
    an unambiguous abbreviation of these, as argparse takes them). None for anything else (help, an
    unknown command or option, a missing value): then the whole parser is built and decides."""
    words = iter(argv)
    for word in words:
        if word == "-v":
            continue
        if word.startswith("--") and len(word) > 2:
            name, has_value, _ = word.partition("=")
            matches = [option for option in _TOP_LONG_OPTIONS if option == name] or \
                [option for option in _TOP_LONG_OPTIONS if option.startswith(name)]
            if len(matches) != 1 or matches[0] == "--help" or (has_value and matches[0] != "--config"):
                return None
            if matches[0] == "--config" and not has_value:
                value = next(words, None)
                if value is None or value.startswith("-"):
                    return None
            continue
        return word if word in COMMANDS else None
    return None


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    """The options that override ``[plugins.mcp.serve]`` transport, host and port."""
    parser.add_argument("--transport", choices=("stdio", "streamable-http"),
                        help="stdio (default) or streamable-http (endpoint /mcp; clients need bearer tokens)")
    parser.add_argument("--host", help="address to listen on with streamable-http (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, help="port to listen on with streamable-http (default 8765; 0: any free)")


def _port(value: str) -> int:
    """``--port``: 0 to 65535, refused as a usage error with its hint (found by attack: ``--port 99999``
    printed an ``error:`` line without one)."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port}: a TCP port is 0 to 65535 (0: any free port)")
    return port


def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``[plugins.mcp.serve]`` fields the command line sets."""
    return {name: getattr(args, name) for name in ("transport", "host", "port") if getattr(args, name) is not None}


def _host(args: argparse.Namespace, *, runs_calls: bool = True) -> ToolHost:
    from .host import ToolHost

    host = ToolHost(config=args.config) if args.config else ToolHost()
    if runs_calls:
        # Every invocation is a new process: policy state (idempotency records, budgets, rate limits)
        # must outlive it, so the policy plugin uses <state_dir>/policy.sqlite3 unless a store is
        # configured. A command that runs no call (list, describe...) keeps the plugin's default: no
        # policy decision is made, and the store's module and sqlite3's import were ≈ 1 % of its start.
        host.capabilities.setdefault("policy.default_store", "sqlite")
    return host


def trusted_host(config: str | None) -> ToolHost:
    """A host that is never started, for a command that reads its settings (``audit verify``,
    ``policy status``): no built-ins, no entry points, and only from a configuration the host itself
    would start from (``config_trust.check``; found by attack: a file planted in the working
    directory naming another ``state_dir`` had ``audit verify`` pass a forged log and anchor there).
    ``ConfigError`` naming the file otherwise."""
    from . import config_trust
    from .host import ToolHost

    host = ToolHost(config=config, builtins=False, entry_points=False) if config else \
        ToolHost(builtins=False, entry_points=False)
    config_trust.check(host.trust_dir, host.config_file, host.trust_roots, discovered=host.discovered_config,
                       sha256=host.config_sha256)
    return host


def _data(obj: Any) -> Any:
    """``obj`` (an attrs object) as JSON data; cattrs is imported only by the commands that print some."""
    from ._converter import converter

    return converter.unstructure(obj)


class _NotPlain(Exception):
    """A value ``_plain`` does not unstructure itself: the converter does."""


def _plain(value: Any) -> Any:
    """``value`` as ``converter.unstructure`` gives it, for what a contract holds (attrs instances,
    str enums, JSON data in dicts, lists and tuples, frozensets), without importing cattrs (≈ 25 ms of
    ``describe``'s start-up); ``_NotPlain`` for anything else (an attrs class of another module may
    have a hook of its own). ``tests/test_cli.py`` checks both agree."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    fields = getattr(type(value), "__attrs_attrs__", None)
    if fields is not None and type(value).__module__ == "amplifier_tools.spec":  # no hooks of their own
        return {field.name: _plain(getattr(value, field.name)) for field in fields}
    if isinstance(value, enum.Enum) and isinstance(value.value, str):
        return value.value
    if type(value) is dict and all(type(key) is str for key in value):
        return {key: _plain(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return [_plain(item) for item in value]
    if type(value) is frozenset and all(type(item) is str for item in value):
        return sorted(value)
    raise _NotPlain(type(value).__name__)


def _spec_data(spec: Any) -> dict[str, Any]:
    """A contract (``ToolSpec``) as JSON data: ``_plain``'s, or the converter's where it gives up."""
    try:
        data: dict[str, Any] = _plain(spec)
    except _NotPlain:
        data = _data(spec)
    return data


@functools.lru_cache(maxsize=1)
def _packages_distributions() -> Mapping[str, list[str]]:
    import importlib.metadata

    return importlib.metadata.packages_distributions()


def _distribution(info: PluginInfo) -> tuple[str | None, str | None]:
    """The distribution (and its version) a plugin came from. Entry points know theirs; a module
    named in config is looked up by its top-level package (``None`` for a module that is not part
    of an installed distribution, such as a file next to the config)."""
    if info.distribution is not None or info.source != "module":
        return info.distribution, info.version
    names = _packages_distributions().get(info.name.partition(".")[0], [])
    if not names:
        return None, None
    import importlib.metadata

    try:
        return names[0], importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return names[0], None


def _table(rows: list[list[str]]) -> str:
    """Aligned columns; the last column is not padded; cells escaped for a terminal (``printable``)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join([*(row[i].ljust(width) for i, width in enumerate(widths)), row[-1]]).rstrip() for row in rows
    )


def _stdout_to_stderr() -> contextlib.redirect_stdout[TextIO]:
    """While plugins' and tools' code runs (import, mount, a call, shutdown), what it prints goes to
    stderr: stdout is the command's own output (found by attack: a module's ``print`` at import, in
    ``mount`` or ``execute`` came before the JSON of ``schema``, ``list --json``, ``call --json`` and
    ``validate --json``, so a script could not parse it)."""
    return contextlib.redirect_stdout(sys.stderr)


@contextlib.asynccontextmanager
async def _started(host: ToolHost) -> AsyncIterator[ToolHost]:
    """``async with host``, with what the plugins print at start and close sent to stderr."""
    with _stdout_to_stderr():
        await host.start()
    try:
        yield host
    finally:
        with _stdout_to_stderr():
            await host.close()


async def _run(args: argparse.Namespace) -> int:
    async with _started(_host(args, runs_calls=args.command == "call")) as host:
        infos = {info.name: info for info in host.plugins}
        if args.command == "list":
            rows: list[dict[str, Any]] = []
            for m in host.tools:
                info = infos.get(m.plugin)
                dist, dist_version = _distribution(info) if info is not None else (None, None)
                rows.append({"name": m.spec.name, "model_name": m.model_name, "version": m.spec.version,
                             "effect": m.spec.effect.value, "plugin": m.plugin,
                             "distribution": dist, "distribution_version": dist_version})
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                table = [["NAME", "VERSION", "EFFECT", "PLUGIN", "DISTRIBUTION"]]
                table += [[r["name"], r["version"], r["effect"], r["plugin"],
                           f"{r['distribution']} {r['distribution_version'] or ''}".rstrip()
                           if r["distribution"] else "-"] for r in rows]
                print(_table(table))
            return EXIT_OK
        if args.command == "plugins":
            from .coordinator import Coordinator

            loaded = []
            for info in host.plugins:
                data = _data(info)
                data["distribution"], data["version"] = _distribution(info)
                loaded.append(data)
            # Parts of loaded plugins that are not available (an MCP server left out at start).
            reported = await Coordinator(host, "cli").collect_contributions("plugins.unavailable")
            unavailable = [entry for entries in reported for entry in entries]
            if args.json:
                print(json.dumps({"loaded": loaded, "failed": [_data(f) for f in host.failed_plugins],
                                  "unavailable": unavailable}, indent=2))
            else:
                table = [["PLUGIN", "SOURCE", "DISTRIBUTION", "HOOKS"]]
                table += [[d["name"], d["source"], f"{d['distribution']} {d['version'] or ''}".rstrip()
                           if d["distribution"] else "-", ", ".join(d["hooks"])] for d in loaded]
                table += [[f.name, f.source, "FAILED", f.reason] for f in host.failed_plugins]
                table += [[u["name"], u["plugin"], "UNAVAILABLE", u["reason"].splitlines()[0]] for u in unavailable]
                print(_table(table))
            return EXIT_OK
        if args.command == "describe":
            mounted = host.tools.resolve(args.tool)
            if mounted is None:
                close = host.tools.suggest(args.tool)
                raise CommandError(
                    f"unknown tool {args.tool!r}" + (f"; did you mean {', '.join(map(repr, close))}?" if close else ""),
                    hint="see 'amplifier-tools list' for the mounted tools", status=EXIT_CONTRACT,
                )
            data = _spec_data(mounted.spec)
            data["model_name"] = mounted.model_name
            data["plugin"] = mounted.plugin
            print(json.dumps(data, indent=2) if args.json else _readable(data))
            return EXIT_OK
        if args.command == "schema":
            print(json.dumps(host.tool_definitions(args.format), indent=2))
            return EXIT_OK
        return await _call(host, args)


def _readable(data: dict[str, Any], indent: str = "") -> str:
    """A contract as indented ``key: value`` lines; empty fields left out, schemas as compact JSON."""
    lines = []
    for key, value in data.items():
        if value in (None, [], {}, ""):
            continue
        if key.endswith("schema") or key == "examples":
            lines.append(f"{indent}{key}: {json.dumps(value)}")
        elif isinstance(value, dict):
            lines.append(f"{indent}{key}:")
            lines.append(_readable(value, indent + "  "))
        elif isinstance(value, list):
            items = ", ".join(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)
            lines.append(f"{indent}{key}: {printable(items)}")
        else:  # a description's lines stay lines; nothing else of a plugin's text reaches the terminal raw
            lines.append(f"{indent}{key}: {printable(value, keep=chr(10))}")
    return "\n".join(line for line in lines if line.strip())


async def _call(host: ToolHost, args: argparse.Namespace) -> int:
    from .models import ContextFieldError, ToolContext

    hint = 'pass a JSON object, e.g. \'{"path": "README.md"}\''
    raw = _read_stdin(hint) if args.arguments == "-" else args.arguments
    if not raw.strip():
        raise CommandError("arguments are empty" + (" (stdin gave nothing)" if args.arguments == "-" else ""),
                           hint=hint, status=EXIT_CONTRACT)
    try:
        arguments = json.loads(raw, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise CommandError(f"arguments are not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                           hint=hint, status=EXIT_CONTRACT) from None
    except _DuplicateKey as exc:
        raise CommandError(f"arguments are ambiguous: the key {exc.args[0]!r} appears more than once in an object",
                           hint=hint + ", each key once", status=EXIT_CONTRACT) from None
    except RecursionError:  # found by attack: 5,000 nested arrays ended as an internal error, exit 1
        raise CommandError("arguments are nested too deeply to parse",
                           hint=hint + ", nested at most a few hundred levels", status=EXIT_CONTRACT) from None
    base = host.default_context
    try:
        context = ToolContext(
            principal=args.principal or base.principal,
            role=args.role or base.role,
            environment=args.environment or base.environment,
            scopes=base.scopes | set(args.scope),
            secrets=base.secrets,
            idempotency_key=args.idempotency_key,
            session_id=base.session_id,
        )
    except ContextFieldError as wrong:  # --principal holding a token, --scope "a b" ...
        option = {"scopes": "scope", "idempotency_key": "idempotency-key"}.get(wrong.field, wrong.field)
        raise CommandError(str(wrong), hint=f"pass --{option} as a name or token of printable characters that "
                                            "holds no credential (docs/contract.md, 'Identifiers')",
                           status=EXIT_CONTRACT) from None
    with _stdout_to_stderr():
        result = await host.call(args.tool, arguments, context=context)
    _print_result(result, as_json=args.json, verbose=args.verbose, tool=args.tool)
    if result.success:
        return EXIT_OK
    return _EXIT_BY_CATEGORY.get((result.error or {}).get("type", ""), EXIT_EXECUTION)


def _read_stdin(hint: str) -> str:
    """The arguments ``-`` names (found by attack: with stdin closed, ``<&-``, the call ended in an
    ``AttributeError`` reported as an internal error)."""
    if sys.stdin is None:
        raise CommandError("arguments '-' name stdin, which is closed", hint=hint + ", on stdin or as ARGS_JSON",
                           status=EXIT_USAGE)
    try:
        return sys.stdin.read()
    except OSError as exc:
        raise CommandError(f"arguments '-': cannot read stdin: {exc.strerror or exc}", hint=hint,
                           status=EXIT_USAGE) from None


class _DuplicateKey(Exception):
    """A JSON object of the arguments names a key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' objects, refusing a repeated key (found by attack: ``{"path": "a", "path": "b"}``
    silently ran on ``b``; which one a reader keeps differs between parsers, so what a user reviewed
    need not be what runs)."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return data


def _named(value: str) -> str:
    """``--principal``, ``--role``, ``--environment``, ``--scope``: a name (found by attack: an empty
    ``--principal`` silently ran the call as the configured principal, an empty ``--scope`` granted
    the scope ``''``)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty; leave the option out to keep the configured value")
    return value


def _idempotency_key(value: str) -> str:
    """``--idempotency-key``: a key that names something (an empty one would be stored and replayed)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an idempotency key must not be empty")
    return value


def _call_hint(error: Mapping[str, Any], tool: str) -> str:
    """What to do about a failed call, as specific as the error allows."""
    code = error.get("code")
    if code == "unknown_tool":
        return "see 'amplifier-tools list' for the mounted tools"
    if code in ("invalid_input", "invalid_json"):
        return f"see 'amplifier-tools describe {tool}' for its input schema"
    if code == "missing_scope" and error.get("missing_scopes"):
        return "grant it: " + " ".join(f"--scope {scope}" for scope in error["missing_scopes"])
    if code == "idempotency_key_required":
        return "pass --idempotency-key KEY"
    if code == "idempotency_conflict":
        return "the key was used with other arguments: a new call needs a new --idempotency-key"
    if error.get("retry_after") is not None:
        return f"retry in {error['retry_after']} s"
    rule = str(error.get("rule") or "")
    if code == "path_denied" and rule.startswith("outside_") and error.get("tool") == BASH_TOOL:
        # bash's cwd: its roots are [plugins.bash] allowed_paths (docs/bash.md), which only default to
        # the filesystem plugin's write roots (found by a docs check: the hint named those alone).
        return ("the cwd is outside bash's roots; they are set by [plugins.bash] allowed_paths (default: the "
                "filesystem plugin's write roots, [plugins.filesystem] allowed_write_paths, else the working "
                "directory)")
    if code == "command_denied" and error.get("tool") == BASH_TOOL:  # bash's own rules, not the policy plugin's
        return ("refused by bash's command rules, [plugins.bash] allow / deny (docs/bash.md, command rules): "
                "the error says which rule and part")
    if code == "path_denied" and rule.startswith("outside_"):
        kind = "write" if "write" in rule else "read"
        return (f"the path is outside the filesystem plugin's {kind} roots; they are set by "
                f"[plugins.filesystem] allowed_{kind}_paths (default: the working directory)")
    if code == "path_denied" and rule == "symlink_escape":
        return ("the path is a symbolic link leading outside the filesystem plugin's roots; name its target "
                "if it lies inside them, or widen [plugins.filesystem] allowed_read_paths / allowed_write_paths")
    if code == "path_denied" and rule.startswith("denied:"):
        return "the path matches a denied pattern: [plugins.filesystem] denied_paths (or write_denied_paths)"
    if code == "path_protected":
        return "the path is the host's own state (config, state_dir, audit log); no tool may touch it"
    if code == "rule_denied" and error.get("rule"):
        return (f"denied by the policy rule {error['rule']!r} in [[plugins.policy.rules]]"
                if error["rule"] != "default" else
                "no [[plugins.policy.rules]] allow rule matches, and [plugins.policy] default_action = 'deny'")
    if code == "timeout" and error.get("timed_out") is True:  # bash: the command's own timeout
        return ("the command ran past its own timeout: pass a larger \"timeout\" argument (seconds, at most "
                "[plugins.bash] max_timeout; without one, [plugins.bash] default_timeout applies)")
    if code == "timeout":
        return (f"the call ran out of time; raise the tool's timeout_ms "
                f"([tools.\"{error.get('tool') or tool}\".policies] timeout_ms) "
                "or the host's default_timeout_ms; bash has its own: [plugins.bash] default_timeout / max_timeout")
    own = error.get("hint")
    if isinstance(own, str) and own:  # the error's own advice (a missing secret's: what to set) beats a guess
        return own
    if error.get("type") in ("PolicyError", "AuthError"):
        who = f"plugin {error['plugin']!r}" if error.get("plugin") else "the policy"
        return f"denied by {who}; 'amplifier-tools describe {tool}' shows the tool's scopes and policies"
    if error.get("retryable"):
        return "the error is retryable: the same call may succeed later"
    return "run with --json for the whole result (decision trail included), or --verbose for the error's fields"


def _print_result(result: ToolResult, *, as_json: bool, verbose: bool = False, tool: str = "TOOL") -> None:
    """One output contract for ``call``: ``--json`` prints the whole result (the same shape for
    success and failure); otherwise stdout gets the tool's output the same way whatever the
    outcome (a text-returning tool's text, else compact JSON), and a failure adds its error line
    and hint on stderr."""
    if as_json:
        import attrs

        from ._json import json_text

        # The fields as they are, not through cattrs: a tool's output and metadata are its own data
        # (found by attack: cattrs recursed without end into an output holding itself). Escaped to
        # ASCII, as it always was: a stdout that cannot encode the output (PYTHONIOENCODING=ascii, a
        # Latin-1 locale) failed the succeeded call as "a bug" (found by review).
        print(json_text(attrs.asdict(result, recurse=False), indent=2, ensure_ascii=True))
    elif result.success or result.output not in (None, "", {}, []):
        _print_output(result)
    if result.success:
        if not as_json and result.metadata.get("replayed") is True:
            print("(replayed: the stored result of the earlier call with this idempotency key; the tool did "
                  "not run again)", file=sys.stderr)
        return
    error = result.error or {}
    print(f"{error.get('type')}[{error.get('code')}]: {error.get('message')}", file=sys.stderr)
    if verbose:
        from ._json import json_text

        print(json_text(error, indent=2, ensure_ascii=True), file=sys.stderr)
    print(f"hint: {_call_hint(error, tool)}", file=sys.stderr)


def _print_output(result: ToolResult) -> None:
    output = result.output
    if isinstance(output, dict) and isinstance(output.get("content"), str):
        # Text-returning tools (read_file): the text itself; the paging notice goes to stderr.
        print(output["content"])
        if output.get("notice"):
            print(f"({output['notice']})", file=sys.stderr)
        return
    from .models import output_text

    print(output_text(output))


async def _loaded_plugins(args: argparse.Namespace) -> list[PluginInfo]:
    async with _started(_host(args, runs_calls=False)) as host:
        return list(host.plugins)


def _config_source(args: argparse.Namespace) -> str | None:
    """Where the configuration comes from, as a user would name it (``None``: no file)."""
    if args.config:
        return f"--config {args.config}"
    if os.environ.get(ENV_CONFIG):
        return f"${ENV_CONFIG}={os.environ[ENV_CONFIG]}"
    from .config import discover_config_file

    found = discover_config_file()
    return str(found) if found is not None else None


def _validate(args: argparse.Namespace) -> int:
    from .config import discover_config_file
    from .conformance import check_target

    # The same configuration as every other command, and only one the host itself would start
    # from: the plugin is mounted with its own section (found by attack: a pyproject.toml planted
    # by a tool had ``validate mcp`` start the MCP server command it named, with the secrets it
    # named, where every other command refused the file as untrusted).
    path: str | Path | None = args.config or discover_config_file()
    config = trusted_host(args.config).config if path is not None else None
    with _stdout_to_stderr():  # the target's own prints (at import, in mount, its examples)
        report = check_target(args.target, run_examples=not args.no_run, config=config)
    if args.json:
        print(json.dumps({"target": report.target, "ok": report.ok, "config": str(path) if path else None,
                          "checks": [_data(c) for c in report.checks]}, indent=2))
    else:
        print("\n".join(printable(line) for line in report.render().splitlines()))
    if report.ok:
        return EXIT_OK
    failed = [check for check in report.checks if not check.passed and not check.warning]
    if any(check.name == "importable" and not check.message.startswith("entry point") for check in failed):
        hint = ("TARGET is an import path (package.module or package.module:Class), "
                "an entry-point name or a distribution name")
        top = args.target.partition(":")[0].partition(".")[0]
        not_found = any(f"No module named {top!r}" in check.message for check in failed)
        misnamed = not_found or any(check.name == "importable" and check.message.startswith("AttributeError: module")
                                    for check in failed)
        if not misnamed:
            # The target was found, and importing or instantiating it raised (a tool its module
            # decorates refused, say): the TARGET syntax was not the problem (found by a newcomer's
            # trial: that hint followed "TypeError: f(p): type ... has no JSON Schema mapping").
            module = args.target.partition(":")[0]
            hint = (f"{args.target} was found, and loading it raised: fix what the FAIL line says "
                    f"(python -c 'import {module}' shows where)")
        if not_found and (os.path.isfile(f"{top}.py") or os.path.isfile(os.path.join(top, "__init__.py"))):
            # The console script does not import from the current directory (an agent may write
            # there): the module the user just wrote is beside them, yet "not found" (a newcomer's pass).
            # Not ``python -m amplifier_tools`` (found by attack: that imports from the directory for
            # the whole run, every module a tool wrote there too; __main__ warns of it).
            hint = (f"{top!r} is in the current directory, which amplifier-tools does not import from: run "
                    f"'PYTHONPATH=. amplifier-tools validate {args.target}' here (for a module of your own: "
                    "a module a tool wrote there would be imported too)")
        if os.path.isfile(args.target):
            hint = _file_target_hint(args.target)
    elif any("needs config key" in check.message for check in failed):
        hint = "pass a config with the plugin's section: --config FILE"
    else:
        hint = "each FAIL line says what to fix"
    print(f"hint: {hint}", file=sys.stderr)
    return EXIT_EXECUTION


def _file_target_hint(target: str) -> str:
    """The hint for ``validate FILE``: TARGET is a module or a plugin, not a file (found by a newcomer's
    trial: ``validate my_tools.py`` was told to run ``PYTHONPATH=. amplifier-tools validate my_tools.py``,
    which then said "was found, and loading it raised"; ``validate amplifier-tools.toml`` only what a
    TARGET may be)."""
    directory, name = os.path.split(target)
    module, suffix = os.path.splitext(name)
    if suffix == ".py":
        return (f"TARGET is an import path, not a file: run 'PYTHONPATH={directory or '.'} amplifier-tools "
                f"validate {module}' (or {module}:NAME for one of its tools)")
    return (f"TARGET is a module or plugin, not a file: a configuration file is checked by every command that "
            f"loads it ('amplifier-tools --config {target} list'), and a plugin it configures by "
            f"'amplifier-tools --config {target} validate PLUGIN'")


def _error_hint(exc: BaseException, args: argparse.Namespace) -> str:
    """A specific next step for a configuration or plugin failure."""
    from .errors import ConfigError, PluginLoadError

    tail = "" if args.verbose else f"; {VERBOSE_HINT}"
    own = exc.hint if isinstance(exc, (ConfigError, PluginLoadError)) else None
    if isinstance(exc, PluginLoadError) and isinstance(exc.__cause__, ConfigError):
        own = own or exc.__cause__.hint
    if own:
        return own
    if isinstance(exc, PluginLoadError):
        cause: BaseException | None = exc.__cause__
        if isinstance(cause, ConfigError) and cause.key:
            return (f"set {cause.key} in the configuration ({_config_source(args) or 'none found'}), "
                    f"or skip the plugin with {ENV_DISABLE}={exc.plugin}{tail}")
        if isinstance(cause, ModuleNotFoundError) and cause.name and exc.plugin.startswith(cause.name):
            return (f"the module {cause.name!r} is not importable: install it, or put its directory on "
                    "PYTHONPATH (the host never imports from the workspace by itself: a module there is "
                    f"found only when you put its directory on PYTHONPATH, and so is any a tool wrote){tail}")
        return f"fix or uninstall the plugin, or skip it with {ENV_DISABLE}={exc.plugin}{tail}"
    source = _config_source(args)
    return (f"fix the configuration ({source})" if source else "check the configuration") + tail


def _trust(args: argparse.Namespace) -> int:
    """Remember the configuration this command line would use as trusted (``config_trust``)."""
    from . import config_trust
    from .errors import ConfigError

    try:
        host = _host(args)
    except config_trust.UnloadableUntrusted as exc:
        cause = exc.load_error
        if cause is None:
            raise
        # Found by a newcomer's trial: ``trust`` on a file with a typo answered "... then accept it
        # with: amplifier-tools trust", the very command just run, which can never accept it.
        fault = f"{cause.key}: {cause.detail}" if cause.key else cause.detail
        also = f"; {cause.hint}" if cause.hint else ""
        raise ConfigError(f"not trusted: it cannot be loaded: {fault}", file=exc.file,
                          hint=f"review it (a tool may have written it) and fix or remove it{also}; "
                               "then run amplifier-tools trust again") from None
    state = config_trust.config_state(host.config_file, host.trust_roots, sha256=host.config_sha256)
    if state is None:
        print(f"{host.config_file} lies outside the working directory: it needs no trust")
        return EXIT_OK
    host._make_state_dir(host.trust_dir)
    config_trust.remember(host.trust_dir, state)
    print(f"trusted: {state['path'] or 'no configuration file'}"
          + (f" (sha256 {state['sha256'][:16]}…)" if state["sha256"] else ""))
    return EXIT_OK


def _version(args: argparse.Namespace) -> int:
    import asyncio

    from .errors import ConfigError, PluginLoadError

    print(f"amplifier-tools {__version__}")
    try:
        infos = asyncio.run(_loaded_plugins(args))
    except (ConfigError, PluginLoadError) as exc:
        print(f"  (plugins not loaded: {printable(exc)})")
        return EXIT_OK
    for info in infos:
        dist, version = _distribution(info)
        print(f"  {info.name} {version or ''} ({dist or info.source})".replace("  (", " (").rstrip())
    return EXIT_OK


def _dispatch(args: argparse.Namespace) -> int:
    if args.version:
        return _version(args)
    if args.command is None:
        _parser().print_help()
        return EXIT_USAGE
    _check_current_directory()
    if args.command == "validate":
        return _validate(args)
    if args.command == "trust":
        return _trust(args)
    if args.command == "audit":
        from .builtins.audit.commands import main as audit_main

        return audit_main(args.audit_args, config=args.config)
    if args.command in ("policy", "mcp"):
        return _settings_command(args)
    if args.command == "serve-mcp":
        from .mcp.__main__ import run_serve

        return run_serve(args.config, args.working_dir, serve_overrides(args), report=False)
    import asyncio

    return asyncio.run(_cancel_on_sigterm(_run(args)))


def _check_current_directory() -> None:
    """``ConfigError`` naming ``working_dir`` when the process has no current directory (it was
    removed under the shell): every command looks for its configuration, its working directory
    and its state there (found by a newcomer's trial: each command said only "FileNotFoundError:
    [Errno 2] No such file or directory", with the hint that it was a bug)."""
    from .errors import ConfigError

    try:
        os.getcwd()
    except FileNotFoundError:
        raise ConfigError("the current directory no longer exists (it was removed after this shell "
                          "entered it)", key="working_dir",
                          hint="cd to an existing directory: it is the default working directory, and where "
                               "the configuration and the host's state are found") from None


def _settings_command(args: argparse.Namespace) -> int:
    """``policy status`` and ``mcp pin``: commands that read a plugin's settings themselves, not
    through a started host. Their configuration errors name the file as the host's do, and their
    other failures' hints name it as ``list``'s do (``_config_source``; found by a newcomer's trial:
    with a discovered file, "plugins.policy.stor: unknown key" or an unreachable store's hint did
    not say which file to fix)."""
    from .errors import ConfigError

    host = trusted_host(args.config) if args.command == "policy" else _host(args)
    source = _config_source(args)
    try:
        if args.command == "policy":
            from .builtins.policy.commands import status

            return status(host, as_json=args.json, source=source)
        from .mcp.pin import run_pin

        return run_pin(host, only=args.server, print_only=args.print_only, source=source)
    except ConfigError as exc:
        if exc.file is not None or host.config_file is None:
            raise
        raise exc.located(host.config_file) from exc


class _Terminated(Exception):
    """SIGTERM arrived while the host ran: the command's task was cancelled (``_cancel_on_sigterm``)."""


async def _cancel_on_sigterm(command: Coroutine[Any, Any, int]) -> int:
    """Run ``command``; a SIGTERM cancels it, as Ctrl-C does, and ends in ``_Terminated`` (found by
    attack: SIGTERM during ``call`` killed the process outright, so a ``bash`` command's process group
    outlived it with ``sandbox = "off"``, and no audit record said the call had been cut)."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    terminated = False

    def on_sigterm() -> None:
        nonlocal terminated
        terminated = True
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except (NotImplementedError, RuntimeError, ValueError):  # no signal handlers here (Windows, a thread)
        return await command
    try:
        status = await command
    except asyncio.CancelledError:
        if terminated:
            raise _Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    if terminated:  # a cancellation the command finished despite
        raise _Terminated
    return status


def _main(args: argparse.Namespace) -> int:
    import traceback

    from .errors import ConfigError, PluginLoadError

    try:
        return _dispatch(args)
    except CommandError as exc:
        return _failed(args, "CommandError", str(exc), exc.hint or VERBOSE_HINT, exc.status)
    except _Terminated:
        return _failed(args, "Terminated", "terminated (SIGTERM)",
                       "a call that was running was cancelled: its processes ended and the audit log records it "
                       "('amplifier-tools audit tail')",
                       EXIT_TERMINATED)
    except (ConfigError, PluginLoadError) as exc:
        if args.verbose:
            traceback.print_exc()
        return _failed(args, type(exc).__name__, str(exc), _error_hint(exc, args), EXIT_USAGE)
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except Exception as exc:  # last resort: one line, never a traceback unless asked
        if args.verbose:
            traceback.print_exc()
        return _failed(args, type(exc).__name__, f"{type(exc).__name__}: {exc}",
                       "this is a bug or an environment problem; "
                       + ("report it with the traceback above" if args.verbose else VERBOSE_HINT), EXIT_EXECUTION)


def _failed(args: argparse.Namespace, kind: str, message: str, hint: str, status: int) -> int:
    """Report a command that failed before it had a result: ``error:`` and ``hint:`` on stderr,
    and with ``--json`` also ``{"error": {"type", "message", "hint", "exit_status"}}`` on stdout,
    so a script reading stdout always gets JSON. ``audit`` parses its own options (``--json`` among
    ``audit_args``): what fails before its parser has them is judged by the words given (found by a
    newcomer's trial: ``audit verify --json`` with a configuration error printed nothing on stdout)."""
    print(f"error: {printable_block(message)}", file=sys.stderr)
    print(f"hint: {printable(hint)}", file=sys.stderr)
    if getattr(args, "json", False) or (getattr(args, "command", None) == "audit" and UsageParser.json_requested):
        print(json.dumps({"error": {"type": kind, "message": message, "hint": hint, "exit_status": status}},
                         ensure_ascii=False))
    return status


#: Commands that start a host, print what it mounted and end, running no tool.
INSPECTION_COMMANDS = frozenset({"list", "describe", "schema", "plugins"})


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``amplifier-tools`` console script.

    Run as a program (``argv`` None: the console script, ``python -m amplifier_tools``), an
    inspection command (``INSPECTION_COMMANDS``, ``--version``) turns the cyclic garbage collector
    off, and freezes what it imported before the interpreter's exit: its passes over a heap made of
    the modules and classes just imported were ≈ 9 % of such a command's instructions, and the
    process ends at once. Objects freed by reference counting (nearly all) are still finalized at
    exit, ``atexit`` handlers run and the standard streams are flushed; only cyclic garbage left at
    exit is not collected (Python does not promise ``__del__`` for what still exists at exit either).
    Called with ``argv`` (in a process that goes on), the collector is left alone."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = _parser(_command_named(words))
    options = words[:words.index("--")] if "--" in words else words
    UsageParser.json_requested = any(word.startswith("--j") and "--json".startswith(word) for word in options)
    # ``audit`` hands the rest of the line to its own parser; argparse's REMAINDER does not take
    # a leading option (``audit -h``), so those come back as extras and are passed on first.
    args, extras = parser.parse_known_args(argv)
    if extras:
        if args.command != "audit":
            parser.fail(f"unrecognized arguments: {' '.join(extras)}", _unrecognized_hint(parser, args.command, extras))
        args.audit_args = [*extras, *args.audit_args]
    if argv is None and (args.version or args.command in INSPECTION_COMMANDS):
        import gc

        gc.disable()
        try:
            return _run_main(args)
        finally:
            gc.freeze()
    return _run_main(args)


def _unrecognized_hint(parser: argparse.ArgumentParser, command: str | None, extras: Sequence[str]) -> str:
    """The hint for words no parser took: the command's own help (the options are its, not the top
    level's), and a did-you-mean for an option spelled close to one of them (found by a newcomer's
    trial: ``call TOOL --principle bob`` said only "see 'amplifier-tools --help'", which lists no
    option of ``call``)."""
    import difflib

    commands = next((action.choices for action in parser._actions
                     if isinstance(action, argparse._SubParsersAction)), None)
    own = commands.get(command) if isinstance(commands, dict) and command else None
    where = own if isinstance(own, argparse.ArgumentParser) else parser
    options = [option for action in where._actions for option in action.option_strings
               if option.startswith("--")]
    # The top level's options are taken before the command only (found by a newcomer's trial:
    # 'list --verbose', as "run with --verbose" reads, was answered "did you mean '--verbose'?")
    top = [option for action in parser._actions for option in action.option_strings] if where is not parser else []
    see = f"see '{where.prog} --help'"
    # Words after '--' are not options (found by attack: 'list -- --verbose' was told to move it).
    words = list(extras[:extras.index("--")] if "--" in extras else extras)
    for at, word in enumerate(words):
        if not word.startswith("-"):
            continue
        name = word.partition("=")[0]
        close = difflib.get_close_matches(name, options, n=1, cutoff=0.7) if name not in top else []
        if close:
            return f"did you mean {close[0]!r}? {see}"
        option = name if name in top else next(iter(difflib.get_close_matches(name, top, n=1, cutoff=0.7)), None)
        if option is not None:
            return (f"{option} is an option of amplifier-tools itself: put it before the command "
                    f"('amplifier-tools {_with_value(parser, option, word, words[at + 1:at + 2])} {command} …')")
    return see


def _with_value(parser: argparse.ArgumentParser, option: str, word: str, following: Sequence[str]) -> str:
    """``option`` as the top level takes it, with the value given after the command: a flag alone,
    an option's value from ``word`` (``--config=x.toml``) or the next word, else its metavar (found
    by attack: 'list --config x.toml' was told 'amplifier-tools --config list …', which reads
    ``list`` as the config file)."""
    action = next(action for action in parser._actions if option in action.option_strings)
    if action.nargs == 0:
        return option
    _, equals, value = word.partition("=")
    if equals:
        return f"{option}={value}"
    value = following[0] if following and not following[0].startswith("-") else \
        str(action.metavar or action.dest.upper())
    return f"{option} {value}"


def _run_main(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        status = _main(args)
        sys.stdout.flush()  # a closed pipe shows up here rather than at interpreter exit
        return status
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as a well-behaved filter does. Point
        # stdout at /dev/null so the interpreter's final flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        if getattr(args, "json", False):  # stdout stays JSON, as on every failure (found by attack: empty)
            print(json.dumps({"error": {"type": "Interrupted", "message": "interrupted",
                                        "hint": "a call that was running was cancelled and the audit log records it",
                                        "exit_status": EXIT_INTERRUPTED}}))
        return EXIT_INTERRUPTED
