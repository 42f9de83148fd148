"""``amplifier-tools mcp pin``: the current definition hashes of every configured server, written
into the configuration file's ``pins`` (or printed as TOML to paste), so pinning is one command.

The servers are started as the host would start them (same environment, sandbox, headers) but
without checking their pins — the point is to read what they send now — and stopped again; their
tools are not mounted and nothing is called. A server with ``enabled = false`` tools gets no pin
for those.

The configuration file is the user's and, when it lives in the working directory, host state
under the trust check (``config_trust``): the command refuses to start servers from a file the
host would refuse, and after writing it records the written file as trusted — the operator's own
command made the change. There is no round-trip TOML writer among the dependencies, so the file
is edited as text and only where that is exact: in each server's ``[plugins.mcp.servers.<name>]``
table (``[tool.amplifier-tools.…]`` in ``pyproject.toml``) one ``pins = { … }`` line is replaced,
or added after the table's last key. Everything else (comments, order, formatting) is left as it
was, and the edit is checked by parsing both texts: they must differ in exactly those ``pins``,
or nothing is written and the TOML block is printed instead. The file is replaced atomically
(same directory, same mode), and not at all if it changed while the servers were asked.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from ..config import plugin_section
from ..errors import ConfigError
from ..hoststate import ProtectedPaths, open_host_file
from ..plugin_settings import structure_settings
from .settings import PLUGIN, McpSettings, ServerSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Where the servers' tables live in each kind of file.
SERVERS_TABLE: Final = f"plugins.{PLUGIN}.servers"
PYPROJECT_PREFIX: Final = "tool.amplifier-tools."


@attrs.frozen
class ServerPins:
    """What one server sends now: tool name -> ``sha256:<hex>``, or why it could not be asked."""

    name: str
    pins: Mapping[str, str] = attrs.field(factory=dict)
    error: str | None = None


async def current_pins(host: Any, only: Sequence[str] = ()) -> list[ServerPins]:
    """Start each configured server (all at once; ``only``: just these), read its tools' hashes
    and stop it. ``ConfigError`` naming ``plugins.mcp.servers`` for an unknown name in ``only``."""
    from .client import ServerConnection, start_error

    own, _ = plugin_section(host.config, PLUGIN)
    settings = structure_settings(own, McpSettings, f"plugins.{PLUGIN}")
    unknown = sorted(set(only) - set(settings.servers))
    if unknown:
        raise ConfigError(f"no MCP server {unknown[0]!r} is configured", key=SERVERS_TABLE,
                          hint=f"configured: {', '.join(sorted(settings.servers)) or 'none'}")
    chosen = {name: s for name, s in settings.servers.items() if not only or name in only}
    found = host.capabilities.get("session.protected_paths")
    protected = found if isinstance(found, ProtectedPaths) else ProtectedPaths()

    async def ask(name: str, server: ServerSettings) -> ServerPins:
        connection = ServerConnection(name, server, host.working_dir,
                                      lambda: [e.path for e in protected if not e.alias],
                                      _headers(host, name, server), host.secrets)
        try:
            await connection.start()
        except Exception as exc:
            return ServerPins(name, error=str(start_error(connection, exc)))
        finally:
            await connection.close()
        disabled = {tool for tool, override in server.tools.items() if not override.enabled}
        return ServerPins(name, {tool: digest for tool, digest in sorted(connection.hashes.items())
                                 if tool not in disabled})

    return list(await asyncio.gather(*(ask(name, server) for name, server in chosen.items())))


def _headers(host: Any, name: str, server: ServerSettings) -> dict[str, str]:
    from . import resolve_headers

    return resolve_headers(host.capabilities["session.secret"], name, server, host.capabilities["session.secrets"],
                           host.config.get("secrets") or {})


def _key(text: str) -> str:
    """A TOML key: bare when it may be, else a basic string (JSON's escapes are TOML's)."""
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else json.dumps(text)


def pins_line(pins: Mapping[str, str]) -> str:
    """``pins = { "tool" = "sha256:…", … }`` (one line: TOML's inline tables cannot span lines)."""
    return "pins = { " + ", ".join(f"{_key(tool)} = {json.dumps(digest)}" for tool, digest in pins.items()) + " }" \
        if pins else "pins = {}"


def toml_block(results: Sequence[ServerPins], prefix: str = "") -> str:
    """The TOML to paste: each server's table header and its ``pins`` line."""
    return "\n".join(f"[{prefix}{SERVERS_TABLE}.{_key(r.name)}]\n{pins_line(r.pins)}\n"
                     for r in results if r.error is None)


class UneditableConfig(Exception):
    """The file cannot be edited exactly as text; the message says where and why."""


_HEADER: Final = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_PINS_LINE: Final = re.compile(r"^\s*pins\s*=")


def _table_name(line: str) -> str | None:
    """The dotted name of a ``[table]`` header line (``[[array]]`` headers are not tables), or None."""
    if line.lstrip().startswith("[["):
        return "[["
    match = _HEADER.match(line)
    return re.sub(r"\s*\.\s*", ".", match.group(1)) if match else None


def _path(dotted: str) -> tuple[str, ...]:
    """The key path of ``dotted`` (a name this module spelled: bare or JSON-quoted parts)."""
    return _header_path(f"[{dotted}]") or ()


def _header_path(line: str) -> tuple[str, ...] | None:
    """The key path a ``[table]`` header line names however it is spelled (quotes, spaces), or None."""
    if _table_name(line) in (None, "[["):
        return None
    try:
        node: Any = tomllib.loads(line)
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(node, dict) and len(node) == 1:
        key, node = next(iter(node.items()))
        path.append(key)
    return tuple(path)


def _trailing_comment(line: str) -> str:
    """The comment after a one-line ``key = value`` (with the spaces before it), or ``""``."""
    text = line.rstrip("\r\n")
    for match in re.finditer("#", text):
        try:
            tomllib.loads(text[:match.start()])
        except tomllib.TOMLDecodeError:
            continue  # a '#' inside a string
        return text[len(text[:match.start()].rstrip()):]
    return ""


def edit_pins(text: str, new: Mapping[str, Mapping[str, str]], prefix: str = "") -> str:
    """``text`` with each server's ``pins`` set to ``new[server]``; ``UneditableConfig`` where the
    layout is not one this can edit exactly, and when the parsed result differs from the parsed
    original anywhere else than in those ``pins``."""
    lines = text.splitlines(keepends=True)
    for server, pins in new.items():
        table = f"{prefix}{SERVERS_TABLE}.{server}"
        headers = [i for i, line in enumerate(lines) if _table_name(line) == table]
        if not headers:
            spelled = next((re.sub(r"\]\s*#.*$", "]", line.strip()) for line in lines
                            if _header_path(line) == _path(table)), None)
            if spelled is not None:
                raise UneditableConfig(f"its table header is spelled {spelled}, which this command cannot edit "
                                       f"(it edits a header spelled exactly [{table}])")
        if len(headers) != 1:
            raise UneditableConfig(f"no [{table}] table of its own in the file (inline or dotted tables are "
                                   "not edited)")
        start = headers[0] + 1
        end = next((i for i in range(start, len(lines)) if _table_name(lines[i]) is not None), len(lines))
        if any(_table_name(line) == f"{table}.pins" for line in lines):
            raise UneditableConfig(f"[{table}.pins] is a table of its own; replace it with the line printed")
        existing = [i for i in range(start, end) if _PINS_LINE.match(lines[i])]
        newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
        line = pins_line(pins) + newline
        if len(existing) == 1:
            lines[existing[0]] = pins_line(pins) + _trailing_comment(lines[existing[0]]) + newline
        elif not existing:
            last = max((i for i in range(start, end) if lines[i].strip() and not lines[i].lstrip().startswith("#")),
                       default=start - 1)
            if last >= 0 and not lines[last].endswith(("\n", "\r")):
                lines[last] += newline
            lines.insert(last + 1, line)
        else:
            raise UneditableConfig(f"[{table}] sets pins more than once")
    edited = "".join(lines)
    _check_only_pins_changed(text, edited, new, prefix)
    return edited


def _check_only_pins_changed(before: str, after: str, new: Mapping[str, Mapping[str, str]], prefix: str) -> None:
    try:
        old_data, new_data = tomllib.loads(before), tomllib.loads(after)
    except tomllib.TOMLDecodeError as exc:  # e.g. a pins value spanning lines, an array of tables
        raise UneditableConfig(f"the edited text would not be valid TOML ({exc})") from None
    for server, pins in new.items():
        node: Any = old_data
        for part in (prefix.rstrip(".").split(".") if prefix else []) + ["plugins", PLUGIN, "servers", server]:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise UneditableConfig(f"{prefix}{SERVERS_TABLE}.{server} is not a table")
        node["pins"] = dict(pins)
    if old_data != new_data:
        raise UneditableConfig("the edit would change more than the pins (a layout this command does not "
                               "edit as text)")


def write_pins(path: Path, new: Mapping[str, Mapping[str, str]], *, loaded_sha256: str | None = None) -> str:
    """Set each server's ``pins`` in the TOML file ``path`` (atomically; ``UneditableConfig`` when
    it cannot be done exactly, ``ConfigError`` when the file changed meanwhile). Returns the text
    written. ``loaded_sha256``: the digest of the bytes the host loaded (and the trust check
    judged); a file that no longer holds them is not edited (found by attack: a server that
    rewrote the file while it was asked had its edit written back with the pins, and trusted)."""
    prefix = PYPROJECT_PREFIX if path.name == "pyproject.toml" else ""
    fd = open_host_file(path, os.O_RDONLY)  # a regular file of this user, not a link
    with os.fdopen(fd, "rb") as file:
        original = file.read()
        mode = os.fstat(file.fileno()).st_mode & 0o7777
    if loaded_sha256 is not None and hashlib.sha256(original).hexdigest() != loaded_sha256:
        raise ConfigError("the file changed while the servers were asked; nothing was written", file=str(path),
                          hint="review the file (a server or tool may have written it), then run the command again")
    edited = edit_pins(original.decode("utf-8"), new, prefix)
    temp = path.with_name(f".{path.name}.pin-{os.getpid()}.tmp")
    fd = open_host_file(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(edited.encode("utf-8"))
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp, mode)  # the umask narrowed the create
        if path.read_bytes() != original:
            raise ConfigError("the file changed while the servers were asked; nothing was written", file=str(path),
                              hint="run the command again")
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return edited


def link_refusal(path: Path) -> str | None:
    """Why ``path`` is not edited in place although it is a TOML file, or None: a symbolic link, or
    a file with more than one hard link (the edit would write through to, or split from, a file
    elsewhere). Checked before any server is started."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode):
        return (f"it is a symbolic link (to {os.readlink(path)!r}); a link is not edited, because the edit "
                "could write elsewhere than the file named")
    if info.st_nlink > 1:
        return (f"it has {info.st_nlink} hard links; a hard-linked file is not edited, because the edit could "
                "write elsewhere than the file named (or split it from its other names)")
    return None


def run_pin(host: Any, *, only: Sequence[str] = (), print_only: bool = False, source: str | None = None) -> int:
    """The command: ask the servers, then write their pins into the host's configuration file (or
    print them). Exit status 0; 1 when a server could not be asked (the others are pinned) or the
    file could not be edited exactly (the TOML to paste is printed); ``ConfigError`` as at a host
    start (an untrusted configuration file, an unknown server). ``source``: the configuration as
    the user would name it, for the hint of a server that could not be asked."""
    from .. import config_trust
    from ..hoststate import ensure_state_dir
    from . import MISSING_SDK_HINT, MISSING_SDK_MESSAGE, sdk_available

    own, _ = plugin_section(host.config, PLUGIN)
    if not own.get("servers"):  # said before the SDK is looked for: without servers it is not needed
        raise ConfigError("no MCP server is configured", key=SERVERS_TABLE,
                          hint=f"add [{SERVERS_TABLE}.<name>] with command or url")
    if not sdk_available():
        raise ConfigError(MISSING_SDK_MESSAGE, key=SERVERS_TABLE, hint=MISSING_SDK_HINT)
    # Servers are started from this file: only from one the host itself would start from.
    trust_dir = ensure_state_dir(host.trust_dir)
    config_trust.check(trust_dir, host.config_file, host.trust_roots, discovered=host.discovered_config,
                       sha256=host.config_sha256)
    path = Path(host.config_file) if host.config_file is not None else None
    writable = path is not None and path.suffix == ".toml"
    refusal = link_refusal(path) if writable and not print_only and path is not None else None
    results = asyncio.run(current_pins(host, only))
    if not results:
        raise ConfigError("no MCP server is configured", key=SERVERS_TABLE,
                          hint=f"add [{SERVERS_TABLE}.<name>] with command or url")
    status = 0
    for result in results:
        if result.error is not None:
            print(f"error: {result.error}", file=sys.stderr)
            status = 1
    failed = [f"[{SERVERS_TABLE}.{_key(r.name)}]" for r in results if r.error is not None]
    if failed:  # the command line's hint line, naming the file as ``list``'s does (found by a newcomer's trial)
        print(f"hint: fix the server or its settings, {', '.join(failed)}{f' ({source})' if source else ''}, then "
              "run the command again", file=sys.stderr)
    done = [r for r in results if r.error is None]
    prefix = PYPROJECT_PREFIX if path is not None and path.name == "pyproject.toml" else ""
    if print_only or not done:
        print(toml_block(done, prefix), end="")
        return status
    if not writable:
        print(f"error: the configuration {'comes from code' if path is None else f'{path} is not TOML'}; "
              "paste these pins into it:", file=sys.stderr)
        print(toml_block(done, prefix), end="")
        return 1
    assert path is not None
    if refusal is not None:
        print(f"error: {path} was not changed: {refusal}; paste these pins into it instead:", file=sys.stderr)
        print(toml_block(done, prefix), end="")
        return 1
    try:
        written = write_pins(path, {r.name: r.pins for r in done}, loaded_sha256=host.config_sha256)
    except UneditableConfig as exc:
        print(f"error: {path} was not changed: {exc}; paste these pins into it instead:", file=sys.stderr)
        print(toml_block(done, prefix), end="")
        return 1
    # The bytes written are trusted, not what the file holds when it is read again.
    state = config_trust.config_state(str(path), host.trust_roots,
                                      sha256=hashlib.sha256(written.encode("utf-8")).hexdigest())
    if state is not None:  # the change is the operator's own: the next start takes it
        config_trust.remember(trust_dir, state)
    for r in done:
        print(f"pinned {len(r.pins)} tool(s) of MCP server {r.name!r} in {path}")
    return status
