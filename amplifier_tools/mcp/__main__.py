"""``python -m amplifier_tools.mcp serve [--config FILE] [--working-dir DIR]``: serve-mcp over stdio."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from . import sdk_available

SERVE_MISSING_SDK_MESSAGE = "serve-mcp needs the 'mcp' extra, which is not installed (pip install amplifier-tools[mcp])"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and serve; exit status 2 on a configuration error."""
    parser = argparse.ArgumentParser(prog="python -m amplifier_tools.mcp",
                                     description="Serve amplifier-tools tools to MCP clients over stdio.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("serve", help="serve the mounted tools over stdio")
    p.add_argument("--config", help="config file (TOML, pyproject.toml or mount-plan YAML)")
    p.add_argument("--working-dir", help="session working directory (default: current directory)")
    args = parser.parse_args(argv)
    return run_serve(args.config, args.working_dir)


def run_serve(config: str | None, working_dir: str | None = None) -> int:
    """Serve until the client closes stdin. Errors go to stderr (stdout is the protocol)."""
    import asyncio

    from ..errors import ConfigError, PluginLoadError

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    if not sdk_available():
        print(f"error: {SERVE_MISSING_SDK_MESSAGE}", file=sys.stderr)
        return 2
    from .server import serve_stdio

    try:
        asyncio.run(serve_stdio(config, working_dir=working_dir))
    except (ConfigError, PluginLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
