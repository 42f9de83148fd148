"""``amplifier-tools policy status``: the live counters of the configured policy store.

Finds the store as the command line's host would (config file, ``state_dir``,
``[plugins.policy] store``, ``sqlite`` when none is set) and lists every live key
under the deployment's prefix: rate-limit and budget counters per window,
concurrency leases and budget reservations with their holders, idempotency
records (running or stored — never their content) and breaker records.

Limits: read-only and a snapshot (counters move while it reads); a ``memory``
store lives inside each host process, so there is nothing to show from outside.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from typing import Any

from ...hoststate import HostFileError
from ...plugin_settings import structure_settings
from .settings import PolicySettings
from .store import StoreUnavailable, open_store


def _finite(value: Any) -> Any:
    """``value`` with every float that JSON cannot hold (``inf``, ``nan``) as its text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _value(row: dict[str, Any]) -> str:
    value = row["value"]
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict) and "state" in value:
        return f"breaker {value['state']}"
    if isinstance(value, dict):
        return f"{len(value)} held"
    return str(value)


async def _status(store: str, prefix: str, timeout: float, state_dir: str) -> tuple[str, list[dict[str, Any]]]:
    shared = open_store(store, prefix, timeout, state_dir)
    if store == "sqlite" and not os.path.exists(shared.where):
        return f"{shared.kind} {shared.where}", []  # nothing decided yet: create nothing
    try:
        rows = await asyncio.wait_for(shared.status(), 10 * timeout)
    finally:
        await shared.close()
    for row in rows:  # idempotency records show their state, never the stored result
        if row["key"].startswith("idem:") and isinstance(row["value"], dict):
            row["value"] = "stored" if "value" in row["value"] else "running"
        # Found by attack: a record that never expires (a breaker with cooldown_ms = 1e308 on SQLite)
        # was listed with ``expires_in: Infinity``, and a counter of ``inf``/``nan`` written under the
        # prefix as such: not JSON, so ``--json`` output was refused whole by strict readers.
        if isinstance(row["expires_in"], float) and not math.isfinite(row["expires_in"]):
            row["expires_in"] = None
        row["value"] = _finite(row["value"])
    return f"{shared.kind} {shared.where}", rows


def status(host: Any, *, as_json: bool, source: str | None = None) -> int:
    """Print the live policy state of ``host``'s configuration (a host the command line made with
    ``cli.trusted_host``: a planted file would name the store, and the server, to ask); 0, or 1 when
    the store does not answer. ``source``: the configuration as the user would name it, for the hint."""
    section = host.config.get("plugins", {}).get("policy") or {}
    settings = structure_settings(section, PolicySettings, "plugins.policy")
    store = settings.store if "store" in section else "sqlite"  # the command line's default
    if store == "memory":
        print("[plugins.policy] store = \"memory\": each host process keeps its own policy state; "
              "nothing to show from outside")
        return 0
    try:
        where, rows = asyncio.run(_status(store, settings.store_prefix, settings.store_timeout_ms / 1000.0,
                                          str(host.state_dir)))
    except (StoreUnavailable, HostFileError, asyncio.TimeoutError) as exc:
        message = str(exc) if isinstance(exc, (StoreUnavailable, HostFileError)) else \
            f"the policy store did not answer within {10 * settings.store_timeout_ms / 1000.0:g} s"
        if isinstance(exc, StoreUnavailable) and exc.hint:  # the store knows better (a file of another schema)
            hint = exc.hint
        elif store == "sqlite":  # a file, not a server (found by attack: the hint sent people to a server)
            hint = ("check the file named above ([plugins.policy] store = \"sqlite\", in state_dir): another "
                    "process may hold it locked past store_timeout_ms, or it is not a policy store the host made")
        else:
            hint = (f"check the server named by [plugins.policy] store{f' ({source})' if source else ''}; each "
                    "of its answers is awaited for store_timeout_ms, and the whole listing for ten times that")
        # As the command line reports a failure: stderr for people, and with --json a JSON error on stdout.
        print(f"error: {message}", file=sys.stderr)
        print(f"hint: {hint}", file=sys.stderr)
        if as_json:
            print(json.dumps({"error": {"type": "StoreUnavailable", "message": message, "hint": hint,
                                        "exit_status": 1}}))
        return 1
    if as_json:
        print(json.dumps({"store": where, "keys": rows}, indent=2))
        return 0
    print(f"store: {where}")
    if not rows:
        print("no live policy state")
        return 0
    width = max(len(row["key"]) for row in rows)
    print(f"{'KEY'.ljust(width)}  {'VALUE'.ljust(24)}  EXPIRES IN")
    for row in rows:
        left = "-" if row["expires_in"] is None else f"{row['expires_in']:g} s"
        print(f"{row['key'].ljust(width)}  {_value(row).ljust(24)}  {left}")
    return 0
