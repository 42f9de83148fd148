"""Trust on first use for a configuration file that tools could have written.

The configuration decides whether policy and audit run and whether bash is sandboxed. When it
lives in the working directory (``amplifier-tools.toml``, ``[tool.amplifier-tools]`` in
``pyproject.toml``, or any config file named there), every tool that can write files — an
unsandboxed bash, an Amplifier ``write_file``, an MCP server — could rewrite it between two runs,
or plant one where none was. So the host remembers, in its state directory (out of the tools'
reach), which configuration it last started with in this working directory and its SHA-256, and
refuses to start when that changed: a new file, an edited one, or one that disappeared. The
operator reviews the file and accepts it with ``amplifier-tools trust``.

The record lives where the configuration cannot move it (``record_dir``), whatever ``state_dir``
or ``working_dir`` the file itself names (found by attack: a planted file naming a fresh
``state_dir`` or another ``working_dir`` was checked against an empty record, and taken as a
first start): for a configuration the host looked for, in the default state directory of the
directory it looked in (``ToolHost(working_dir=...)`` or the current directory); for a file named
to it (``--config``, ``ToolHost(config=path)``), in one of that file's own (found by review: two
projects started with ``--config`` from one directory shared one record, and refused each other).
A file is checked when it lies in the directory the host was started in or in the working
directory the configuration names, judged by where it is found, not where a symlink leads (found
by attack: ``amplifier-tools.toml`` linked to an empty file elsewhere was taken as outside,
unchecked, and every rule of ``pyproject.toml`` dropped).

The first start in a working directory trusts what it finds (there is nothing to compare with):
a config planted before the host ever ran is not detected. A configuration given from outside
the working directory (``--config``/``AMPLIFIER_TOOLS_CONFIG`` elsewhere, or a mapping in code)
is not checked: tools cannot reach it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from .errors import ConfigError
from .hoststate import default_state_dir, open_host_file

TRUST_FILE: Final = "trusted-config.json"


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def placed(config_file: str) -> Path:
    """Where ``config_file`` is: its directory resolved, its own name kept (a symlink is judged
    where it is, not where it leads)."""
    given = Path(config_file).absolute()
    return given.parent.resolve() / given.name


def record_dir(root: str, config_file: str | None, *, discovered: bool) -> Path:
    """Where the trust record of a start is kept: never a directory its configuration names."""
    if discovered or config_file is None:
        return default_state_dir(root)
    return default_state_dir(str(placed(config_file)))


def config_state(config_file: str | None, roots: Sequence[str], *,
                 sha256: str | None = None) -> dict[str, Any] | None:
    """What to remember about the configuration of a start, or None when it needs no trust (it
    lies outside every one of ``roots``, the directories tools can write). The file is placed by
    its directory, resolved, and its own name: a symlink is judged where it is, not where it leads.
    ``sha256``: the digest of the bytes the host loaded (``ToolHost.config_sha256``), judged instead
    of what the file holds now (found by attack: a file swapped after the host loaded it and put
    back before the check started a host on a configuration never trusted)."""
    if config_file is None:
        return {"path": None, "sha256": None}
    path = placed(config_file)
    if not any(_inside(path, Path(root).resolve()) for root in roots):
        return None
    digest = sha256
    if digest is None:
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            digest = None
    return {"path": str(path), "sha256": digest}


def _read(state_dir: Path) -> dict[str, Any] | None:
    """The trusted state; None when there is no record. A record that is not one (empty, cut short,
    not JSON) is no first start: ``ConfigError`` naming it (found by attack: garbage ended in a bare
    ``JSONDecodeError``, and ``[1]`` or an empty file had the host trust whatever it found)."""
    where = state_dir / TRUST_FILE
    try:
        fd = open_host_file(where, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as file:
        raw = file.read()
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict) or "path" not in data or "sha256" not in data:
        raise ConfigError("the record of the trusted configuration is damaged, so a changed configuration "
                          "could not be told from the trusted one", file=str(where),
                          hint="review the configuration, then accept it with: amplifier-tools trust")
    return data


def remember(state_dir: Path, state: dict[str, Any]) -> None:
    """Record ``state`` as the trusted configuration (atomically, through a host file)."""
    temp = state_dir / f".{TRUST_FILE}.{os.getpid()}.tmp"
    fd = open_host_file(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(json.dumps(state, sort_keys=True).encode())
    os.replace(temp, state_dir / TRUST_FILE)


def check(state_dir: Path, config_file: str | None, roots: Sequence[str], *,
          discovered: bool, sha256: str | None = None) -> dict[str, Any] | None:
    """Refuse to start on a configuration in the working directory that changed since the last
    start there (``ConfigError`` naming the file and ``amplifier-tools trust``). On the first start
    it returns the state to ``remember`` once the host has started (a start that fails, on a typo
    in the file say, records nothing: the fixed file is still the first). ``discovered``: the host
    looked for a config itself (so "none" is a state too); ``sha256`` as for ``config_state``."""
    if config_file is None and not discovered:
        return None  # a mapping from code
    state = config_state(config_file, roots, sha256=sha256)
    if state is None:
        return None
    trusted = _read(state_dir)
    if trusted is None:
        return state
    if trusted == state:
        return None
    raise _refusal(trusted, state, state_dir)


class UnloadableUntrusted(ConfigError):
    """The trust check's refusal of a file that also cannot be loaded: ``load_error`` says why it
    cannot (``amplifier-tools trust`` shows that alone: trusting such a file cannot help)."""

    load_error: ConfigError | None = None


def _refusal(trusted: dict[str, Any], state: dict[str, Any], state_dir: Path,
             load_error: ConfigError | None = None) -> ConfigError:
    """The error for a start on ``state``, which is not the ``trusted`` one (``load_error``: the
    error that loading the file ended in, said too)."""
    before, now = trusted.get("path"), state["path"]
    if now is None:
        change = f"the configuration {before} the host started with last time is gone"
    elif before is None:
        change = f"a configuration file appeared in the working directory: {now}"
    elif before != now:
        change = f"the configuration moved from {before} to {now}"
    else:
        change = f"the configuration file {now} changed since the host last started"
    if load_error is not None:
        fault = f"{load_error.key}: {load_error.detail}" if load_error.key else load_error.detail
        also = f"; {load_error.hint}" if load_error.hint else ""
        refusal = UnloadableUntrusted(
            f"{change}; tools can write the working directory, so the host will not take it on trust, and it cannot "
            f"be loaded either: {fault}. Review it (a tool may have written it), fix or remove it, then accept it "
            f"with: amplifier-tools trust (remembered in {state_dir / TRUST_FILE})", file=now,
            hint=f"review {now}: a tool may have written it; fix or remove it{also}; then run: amplifier-tools trust")
        refusal.load_error = load_error
        return refusal
    return ConfigError(f"{change}; tools can write the working directory, so the host will not take it on "
                      "trust. Review it, then accept it with: amplifier-tools trust "
                      f"(remembered in {state_dir / TRUST_FILE})", file=now or before,
                      hint=f"review {now}, then run: amplifier-tools trust" if now is not None else
                      "if its removal was meant, accept it with: amplifier-tools trust")


def unloadable(error: ConfigError, state_dir: Path, config_file: str, roots: Sequence[str], *,
               sha256: str | None) -> ConfigError:
    """The error to raise for a configuration file that could not be loaded (``error``: not valid
    TOML, a key refused, ...): when the file is not the trusted one — it appeared, moved or changed
    since the last start — the trust check's refusal, saying ``error`` too, so the operator learns
    first that the file is new and may be a tool's (found by a newcomer's trial: a bash command
    wrote an invalid ``amplifier-tools.toml``, and the next start said only "not valid TOML ... fix
    the configuration"); ``error`` itself otherwise (a first start, the trusted bytes, a file not
    read: too large or no regular file, or a damaged record, which ``amplifier-tools trust`` could
    not mend while the file cannot be loaded). ``sha256``: the digest of the bytes read, if any."""
    if sha256 is None:
        return error
    state = config_state(config_file, roots, sha256=sha256)
    if state is None:
        return error
    try:
        trusted = _read(state_dir)
    except ConfigError:
        return error
    if trusted is None or trusted == state:
        return error
    return _refusal(trusted, state, state_dir, error)
