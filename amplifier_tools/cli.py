"""The ``amplifier-tools`` command line (argparse).

Exit statuses fit scripts: 0 success; 1 a tool execution failure or internal
error; 2 usage or configuration error; 3 contract error; 4 policy or auth
failure. Errors print one line (and a hint) on stderr; ``--verbose`` adds the
traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from . import __version__
from .converter import converter
from .definitions import FORMATS, model_name
from .errors import ConfigError, PluginLoadError
from .host import ToolHost
from .models import ToolContext, ToolResult

EXIT_OK = 0
EXIT_EXECUTION = 1
EXIT_USAGE = 2
EXIT_CONTRACT = 3
EXIT_POLICY = 4

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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amplifier-tools", description="Run AI agents' tool calls under a contract."
    )
    parser.add_argument("--version", action="store_true", help="print versions of the package and its plugins")
    parser.add_argument("--config", help="config file (TOML, pyproject.toml or mount-plan YAML)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details; show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="mounted tools")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("plugins", help="loaded and failed plugins")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("describe", help="one tool's whole contract")
    p.add_argument("tool")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("schema", help="tool definitions for a model API")
    p.add_argument("--format", choices=FORMATS, default="openai")
    p = sub.add_parser("validate", help="conformance check of a tool module, plugin or distribution")
    p.add_argument("target", help="import path of a module, or an entry-point / distribution name")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-run", action="store_true", help="do not run the examples of Pure tools")
    p = sub.add_parser("audit", help="verify, tail or summarize an audit log", add_help=False)
    p.add_argument("audit_args", nargs=argparse.REMAINDER)
    p = sub.add_parser("call", help="run one call through the whole pipeline")
    p.add_argument("tool")
    p.add_argument("arguments", nargs="?", default="{}", help="JSON object, or - to read it from stdin")
    p.add_argument("--principal")
    p.add_argument("--role")
    p.add_argument("--environment")
    p.add_argument("--scope", action="append", default=[], help="grant a scope (repeatable)")
    p.add_argument("--idempotency-key")
    p.add_argument("--json", action="store_true", help="print the whole ToolResult as JSON")
    p = sub.add_parser("serve-mcp", help="serve the mounted tools to MCP clients over stdio")
    p.add_argument("--working-dir", help="session working directory (default: current directory)")
    return parser


def _host(args: argparse.Namespace) -> ToolHost:
    return ToolHost(config=args.config) if args.config else ToolHost()


async def _run(args: argparse.Namespace) -> int:
    async with _host(args) as host:
        if args.command == "list":
            rows = [
                {"name": m.spec.name, "model_name": m.model_name, "version": m.spec.version,
                 "effect": m.spec.effect.value, "plugin": m.plugin}
                for m in host.tools
            ]
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                for row in rows:
                    print(f"{row['name']:<32} {row['version']:<10} {row['effect']:<20} {row['plugin']}")
            return EXIT_OK
        if args.command == "plugins":
            data = {
                "loaded": [converter.unstructure(info) for info in host.plugins],
                "failed": [converter.unstructure(info) for info in host.failed_plugins],
            }
            if args.json:
                print(json.dumps(data, indent=2))
            else:
                for info in host.plugins:
                    dist = f"{info.distribution} {info.version}" if info.distribution else info.source
                    print(f"{info.name:<24} {dist:<32} {', '.join(info.hooks)}")
                for failed in host.failed_plugins:
                    print(f"{failed.name:<24} FAILED: {failed.reason}")
            return EXIT_OK
        if args.command == "describe":
            mounted = host.tools.resolve(args.tool)
            if mounted is None:
                raise CommandError(
                    f"unknown tool {args.tool!r}", hint="see 'amplifier-tools list'", status=EXIT_CONTRACT
                )
            data = converter.unstructure(mounted.spec)
            data["model_name"] = model_name(mounted.spec.name)
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
            lines.append(f"{indent}{key}: {', '.join(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)}")
        else:
            lines.append(f"{indent}{key}: {value}")
    return "\n".join(line for line in lines if line.strip())


async def _call(host: ToolHost, args: argparse.Namespace) -> int:
    raw = sys.stdin.read() if args.arguments == "-" else args.arguments
    try:
        arguments = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CommandError(f"arguments are not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                           hint='pass a JSON object, e.g. \'{"path": "README.md"}\'', status=EXIT_CONTRACT) from None
    base = host.default_context
    context = ToolContext(
        principal=args.principal or base.principal,
        role=args.role or base.role,
        environment=args.environment or base.environment,
        scopes=base.scopes | set(args.scope),
        secrets=base.secrets,
        idempotency_key=args.idempotency_key,
        session_id=base.session_id,
    )
    result = await host.call(args.tool, arguments, context=context)
    _print_result(result, as_json=args.json)
    if result.success:
        return EXIT_OK
    return _EXIT_BY_CATEGORY.get((result.error or {}).get("type", ""), EXIT_EXECUTION)


def _print_result(result: ToolResult, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(converter.unstructure(result), indent=2, default=str))
    elif result.success and isinstance(result.output, dict) and isinstance(result.output.get("content"), str):
        # Text-returning tools (read_file): the text itself; the paging notice goes to stderr.
        print(result.output["content"])
        if result.output.get("notice"):
            print(f"({result.output['notice']})", file=sys.stderr)
    elif result.success:
        print(result.get_serialized_output(max_chars=None))
    else:
        error = result.error or {}
        if result.output:
            print(result.get_serialized_output(max_chars=None) if isinstance(result.output, str)
                  else json.dumps(result.output, indent=2, default=str))
        print(f"{error.get('type')}[{error.get('code')}]: {error.get('message')}", file=sys.stderr)


async def _loaded_plugins(args: argparse.Namespace) -> list[Any]:
    async with _host(args) as host:
        return list(host.plugins)


def _validate(args: argparse.Namespace) -> int:
    from .conformance import check_target

    report = check_target(args.target, run_examples=not args.no_run)
    if args.json:
        print(json.dumps({"target": report.target, "ok": report.ok,
                          "checks": [converter.unstructure(c) for c in report.checks]}, indent=2))
    else:
        print(report.render())
    return EXIT_OK if report.ok else EXIT_EXECUTION


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``amplifier-tools`` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    if args.version:
        print(f"amplifier-tools {__version__}")
        try:
            for info in asyncio.run(_loaded_plugins(args)):
                print(f"  {info.name} {info.version or ''} ({info.distribution or info.source})".rstrip())
        except (ConfigError, PluginLoadError) as exc:
            print(f"  (plugins not loaded: {exc})")
        return EXIT_OK
    if args.command is None:
        _parser().print_help()
        return EXIT_USAGE
    try:
        if args.command == "validate":
            return _validate(args)
        if args.command == "audit":
            from .builtins.audit.commands import main as audit_main

            return audit_main(args.audit_args)
        if args.command == "serve-mcp":
            from .mcp.__main__ import run_serve

            return run_serve(args.config, args.working_dir)
        return asyncio.run(_run(args))
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.status
    except (ConfigError, PluginLoadError) as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        print("hint: check the configuration, or run with --verbose", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # last resort: one line, never a traceback unless asked
        if args.verbose:
            traceback.print_exc()
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_EXECUTION
