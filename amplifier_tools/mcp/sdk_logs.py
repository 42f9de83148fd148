"""Secrets and credential shapes kept out of what the MCP SDK writes to Python's ``logging``.

At DEBUG the SDK logs whole JSON-RPC messages (``mcp.client.streamable_http``: "Sending client
message: …", "SSE message: …", tool arguments and results included), and the server stack it
runs on logs every event it sends (``sse_starlette.sse``: "chunk: …"). A host importing or serving
MCP puts resolved secrets in those messages: a header's bearer token, a ``[secrets]`` value passed
in an argument or returned by a tool. ``redact_sdk_logs`` puts one ``SdkLogRedaction`` filter on
the SDK's loggers (and those of the HTTP stack under it) while a host has MCP in use: each record
is redacted by the one redaction function (``redaction.redact_text``) of every registered host's
secrets and of credential shapes — its message with its arguments, its exception's text, the
fields an ``extra=`` added — before any handler sees it.

Several hosts in one process: loggers are process-wide and a record does not say which host it
is for, so each record is redacted of the secrets of every host registered at that moment (a
secret of one host is never shown in a line of another's; the price is that a value one host
holds as a secret is also hidden from the others' lines). The filter is on the loggers from the
first registration to the last removal, and only then.

Cost: a logger not enabled for a level never makes a record, so with DEBUG off the SDK's DEBUG
lines cost nothing here; the filter runs only for records that will be handled, and leaves a
record it has nothing to redact in it as it was (its template and arguments kept).

It must never drop a record, nor change one that holds nothing to redact. Limits (docs/mcp.md,
"The SDK's debug logs"): a logger is guarded when it exists at a registration or is one of
``SDK_LOGGERS``; records of a logger created later (an SDK module imported after the mount) are
not filtered until the next registration. A record's exception is scrubbed of secrets, not of
credential shapes (``chain_without_secrets``); its ``stack_info`` (code, not values) is kept.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Final, final

from ..redaction import PLACEHOLDER, SecretSet, chain_without_secrets, redact, redact_text

#: Logger namespaces guarded: the SDK's own and those of the HTTP stack it runs on (its HTTP
#: client, ``httpx2``/``httpcore2``; its event streams, ``sse_starlette``). ``client`` is the name
#: the SDK's ``mcp.client.session`` logs under (not under ``mcp``): guarded by that name only.
GUARDED_NAMESPACES: Final = ("mcp", "sse_starlette", "httpx2", "httpcore2")
GUARDED_NAMES: Final = ("client",)
#: Loggers guarded even before they exist: the SDK creates them when a module is imported, some of
#: them after the mount (``mcp.client.streamable_http`` at a ``url`` server's first connection).
SDK_LOGGERS: Final = ("mcp.client.streamable_http", "mcp.client.stdio", "mcp.client.session", "mcp.shared.session",
                      "mcp.shared.jsonrpc_dispatcher", "mcp.server.lowlevel.server", "mcp.server.runner",
                      "mcp.server.streamable_http", "mcp.server.streamable_http_manager", "sse_starlette.sse",
                      "client")

#: The attributes every ``LogRecord`` has; any other was added by ``extra=`` (or a record factory).
_STANDARD: Final = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


@final
class SdkLogRedaction(logging.Filter):
    """Redacts every record of the loggers it is on (see the module); never drops one."""

    def __init__(self) -> None:
        super().__init__()
        #: Each registered host's secrets, with how many registrations it has (import and serve).
        self._sources: dict[int, tuple[SecretSet, int]] = {}
        #: The registered sets, replaced whole on a change (read without the lock by ``filter``).
        self._sets: tuple[SecretSet, ...] = ()
        #: The union of several hosts' secrets, with the ``values`` objects it was built from.
        self._union: tuple[tuple[frozenset[str], ...], SecretSet] = ((), SecretSet())

    def add(self, secrets: SecretSet) -> None:
        """Register one host's secrets (called under the module's lock)."""
        _, count = self._sources.get(id(secrets), (secrets, 0))
        self._sources[id(secrets)] = (secrets, count + 1)
        self._sets = tuple(found for found, _ in self._sources.values())

    def discard(self, secrets: SecretSet) -> bool:
        """Take back one registration of ``secrets``; whether none is left (under the module's lock)."""
        found = self._sources.get(id(secrets))
        if found is not None and found[1] > 1:
            self._sources[id(secrets)] = (secrets, found[1] - 1)
        else:
            self._sources.pop(id(secrets), None)
        self._sets = tuple(found for found, _ in self._sources.values())
        return not self._sources

    def secrets(self) -> SecretSet | None:
        """The secrets to redact now: the one host's set, or the union of several (rebuilt only
        when one of them has changed: ``SecretSet.values`` is a new object after every change)."""
        sets = self._sets
        if len(sets) <= 1:
            return sets[0] if sets else None
        values = tuple(s.values for s in sets)
        built, union = self._union
        if len(built) != len(values) or any(a is not b for a, b in zip(built, values, strict=True)):
            union = SecretSet(frozenset().union(*values))
            self._union = (values, union)
        return union

    def filter(self, record: logging.LogRecord) -> bool:
        # A filter that raises raises into the SDK's logging call: whatever fails here ends in a
        # record that says so and shows nothing it could not redact (a hostile ``__str__``, say).
        try:
            scrub_record(record, self.secrets() or ())
        except Exception as exc:
            record.msg, record.args = f"(a log record that could not be redacted, not shown: {type(exc).__name__})", ()
            record.exc_info = record.exc_text = None
            for name in record.__dict__.keys() - _STANDARD:
                record.__dict__[name] = PLACEHOLDER
        return True


def scrub_record(record: logging.LogRecord, secrets: Collection[str] | SecretSet) -> None:
    """Redact ``record`` in place of ``secrets`` and credential shapes: the message as formatted
    (``getMessage``: its arguments, a dict's or a pydantic model's text among them) becomes the
    redacted text without arguments when redaction changed it; its exception chain is replaced by
    one whose messages hold no secret; each ``extra=`` field is redacted as a JSON-like value."""
    try:
        message = record.getMessage()
    except Exception:  # arguments that do not fit the template: a handler would print both as they are
        record.msg = redact_text(f"{record.msg!s} (its arguments, not formatted: {record.args!r})", secrets)
        record.args = ()
    else:
        clean = redact_text(message, secrets)
        # Also when only the arguments hold one (a template that cuts it, ``%.5s``): a handler may
        # send the arguments on by themselves (Sentry's logging integration does; found by review).
        if clean != message or (record.args and _args_hold_one(record.args, secrets)):
            record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        replaced = chain_without_secrets(exc, secrets)
        if replaced is not None and replaced is not exc:
            record.exc_info = (type(replaced), replaced, replaced.__traceback__)
            record.exc_text = None  # a handler formatting it again formats the redacted chain
    if record.exc_text:
        record.exc_text = redact_text(record.exc_text, secrets)
    for name in record.__dict__.keys() - _STANDARD:
        value = record.__dict__[name]
        clean_value = redact(value, secrets=secrets)
        if clean_value is not value:
            record.__dict__[name] = clean_value


def _args_hold_one(args: object, secrets: Collection[str] | SecretSet) -> bool:
    """Whether a record's arguments hold a secret or a credential shape: in their ``repr``, or in the
    ``str`` of one of them (an object whose ``repr`` does not show what its ``str`` does: found by
    review, such an argument cut by its template kept the secret). An argument whose ``str`` fails
    is judged by the ``repr`` alone."""
    texts = [repr(args)]
    values = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else (args,)
    for value in values:
        if not isinstance(value, (str, int, float)):
            with contextlib.suppress(Exception):
                texts.append(str(value))
    return any(redact_text(text, secrets) != text for text in texts)


_LOCK: Final = threading.Lock()
_FILTER: Final = SdkLogRedaction()
#: The loggers ``_FILTER`` is on (empty while no host is registered).
_GUARDED: list[logging.Logger] = []


def _guarded_loggers() -> list[logging.Logger]:
    """The loggers to guard now: ``SDK_LOGGERS`` (created if need be) and every existing logger in
    ``GUARDED_NAMESPACES``."""
    names = set(SDK_LOGGERS)
    for name in list(logging.Logger.manager.loggerDict):  # a copy: another thread may add one
        if name in GUARDED_NAMES or name.split(".", 1)[0] in GUARDED_NAMESPACES:
            names.add(name)
    return [logging.getLogger(name) for name in sorted(names)]


def redact_sdk_logs(secrets: Collection[str] | SecretSet) -> Callable[[], None]:
    """Redact ``secrets`` (a host's ``session.secrets``, read at each record: values added later are
    redacted too) and credential shapes from the SDK's log records until the function returned is
    called (once; later calls do nothing). Registrations nest: the filter stays on its loggers
    until the last is taken back. Loggers that appeared since an earlier registration are guarded
    from this one on."""
    registered = secrets if isinstance(secrets, SecretSet) else SecretSet(secrets)
    with _LOCK:
        _FILTER.add(registered)
        for logger in _guarded_loggers():
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)
                _GUARDED.append(logger)
    taken_back = False

    def remove() -> None:
        nonlocal taken_back
        with _LOCK:
            if taken_back:
                return
            taken_back = True
            if _FILTER.discard(registered):
                for logger in _GUARDED:
                    logger.removeFilter(_FILTER)
                _GUARDED.clear()

    return remove
