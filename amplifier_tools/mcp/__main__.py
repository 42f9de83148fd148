"""``python -m amplifier_tools.mcp serve [--config FILE] [--working-dir DIR] [--transport T] [--host H]
[--port P]``: serve-mcp, over stdio or Streamable HTTP."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from ..cli import add_serve_options, serve_overrides
from . import sdk_available

SERVE_MISSING_SDK_MESSAGE = ("serve-mcp needs the 'mcp' extra, which is not installed "
                             "(pip install 'amplifier-tools[mcp]')")
#: Its hint line, as every other missing extra's error has (found by a newcomer's trial: serve-mcp's
#: was the one without).
SERVE_MISSING_SDK_HINT = "pip install 'amplifier-tools[mcp]' in this environment"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and serve; exit status 2 on a configuration error."""
    parser = argparse.ArgumentParser(prog="python -m amplifier_tools.mcp",
                                     description="Serve amplifier-tools tools to MCP clients.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("serve", help="serve the tools [plugins.mcp.serve] lists")
    p.add_argument("--config", help="config file (TOML, pyproject.toml or mount-plan YAML)")
    p.add_argument("--working-dir", help="session working directory (default: current directory)")
    add_serve_options(p)
    args = parser.parse_args(argv)
    return run_serve(args.config, args.working_dir, serve_overrides(args))


def run_serve(config: str | None, working_dir: str | None = None, overrides: dict[str, Any] | None = None,
              *, report: bool = True) -> int:
    """Serve until the client closes stdin or stdout (stdio) or the process gets SIGINT or SIGTERM. Errors go to
    stderr (stdout is the stdio protocol): with ``report``, a configuration or plugin error is
    printed here (``error:`` and its ``hint:``); without (``amplifier-tools serve-mcp``), it is
    raised for the CLI to report as every command's are (``-v`` adds the traceback)."""
    import asyncio

    from ..errors import ConfigError, PluginLoadError

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    if not sdk_available():
        print(f"error: {SERVE_MISSING_SDK_MESSAGE}\nhint: {SERVE_MISSING_SDK_HINT}", file=sys.stderr)
        return 2
    from .server import serve_configured

    if overrides and "port" in overrides and not 0 <= overrides["port"] <= 65535:
        print(f"error: --port {overrides['port']}: a TCP port is 0 to 65535", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve_configured(config, working_dir=working_dir, overrides=overrides, freeze_heap=True))
    except (ConfigError, PluginLoadError) as exc:
        if not report:
            raise
        print(f"error: {exc}", file=sys.stderr)
        cause = exc.__cause__ if isinstance(exc, PluginLoadError) else exc
        if isinstance(cause, ConfigError) and cause.hint:
            print(f"hint: {cause.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
