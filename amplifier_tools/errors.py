"""The error taxonomy: five categories every failure maps onto.

A tool or plugin may raise any of these; the host turns each into a failed
``ToolResult`` whose ``error`` dict carries the category (``type``), a stable
``code``, a sanitized ``message``, ``retryable``, the ``cause`` and correlation
fields. Nothing here ever reaches the caller of ``ToolHost.call`` as an
exception.

The fifth category is serialized as ``"SystemError"``; its class is named
``ToolSystemError`` so that it never shadows Python's builtin ``SystemError``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, ClassVar, Final

CONTRACT_ERROR: Final = "ContractError"
POLICY_ERROR: Final = "PolicyError"
AUTH_ERROR: Final = "AuthError"
EXECUTION_ERROR: Final = "ExecutionError"
SYSTEM_ERROR: Final = "SystemError"

#: The five category names as they appear in ``ToolResult.error["type"]``.
CATEGORIES: Final = frozenset(
    {CONTRACT_ERROR, POLICY_ERROR, AUTH_ERROR, EXECUTION_ERROR, SYSTEM_ERROR}
)


class ToolError(Exception):
    """Base class of the taxonomy. Use one of the five subclasses.

    ``details`` holds extra JSON-serializable fields that belong in the error
    dict (for example ``retry_after`` or ``pointer``); ``plugin`` names the
    plugin the failure is attributed to, if any.
    """

    category: ClassVar[str] = SYSTEM_ERROR
    default_code: ClassVar[str] = "error"
    default_retryable: ClassVar[bool] = False
    #: The result a tool returned to report this failure (``success=False``), or None when the
    #: failure was raised by the tool or decided by the host. Never serialized.
    reported: Any = None
    #: How many times the host ran the tool before failing with this error, when the tool's retry
    #: policy applied (set by ``retry.run_with_retries``; the result's ``metadata["attempts"]``).
    #: None: the host made no retry decision. Never serialized into the error.
    attempts: int | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retryable: bool | None = None,
        cause: str | None = None,
        plugin: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.retryable = self.default_retryable if retryable is None else retryable
        self.cause = cause
        self.plugin = plugin
        self.details = details

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class ContractError(ToolError):
    """Input or output violates the tool's contract; unknown tool or version."""

    category = CONTRACT_ERROR
    default_code = "invalid_input"


class PolicyError(ToolError):
    """A policy stopped the call: veto, timeout, rate limit, open circuit, budget."""

    category = POLICY_ERROR
    default_code = "denied"


class AuthError(ToolError):
    """Missing scope or permission; a secret that cannot be resolved."""

    category = AUTH_ERROR
    default_code = "forbidden"


class ExecutionError(ToolError):
    """The tool or its backend failed while doing the work."""

    category = EXECUTION_ERROR
    default_code = "execution_failed"


class ToolSystemError(ToolError):
    """Unexpected runtime failure, including a plugin that broke. Serialized as ``SystemError``."""

    category = SYSTEM_ERROR
    default_code = "internal"


ERROR_CLASSES: Final[dict[str, type[ToolError]]] = {
    cls.category: cls
    for cls in (ContractError, PolicyError, AuthError, ExecutionError, ToolSystemError)
}


class ConfigError(ValueError):
    """Host configuration is invalid. Raised at host start, never during a call.

    The message names the key path and, when known, the file.
    """

    def __init__(self, message: str, *, key: str | None = None, file: str | None = None,
                 hint: str | None = None, expected: Collection[str] | None = None) -> None:
        where = ""
        if file:
            where = f"{file}: "
        if key:
            where += f"{key}: "
        super().__init__(f"{where}{message}")
        self.detail = message
        self.key = key
        self.file = file
        #: What to do about it, for a person (the command line prints it as its hint line).
        self.hint = hint
        if hint is None and expected is not None and key:
            leaf = key.rpartition(".")[2]
            # Never left without one: the command line's generic hint for a key ("set <key> ...")
            # told the user to set the very key that is unknown (found by a new-user trial).
            self.hint = did_you_mean(leaf, expected) or (
                f"remove or rename {leaf!r}; the keys allowed here: {', '.join(sorted(expected))}")
        note_hint(self, self.hint)

    def located(self, file: str | None) -> ConfigError:
        """This error as a new one naming ``file``, the configuration it is about, unless it names
        a file already (then the new one is a copy): what the host does with a plugin's error about
        its section, and the command line with a command's that reads the settings itself (found by
        a newcomer's trial: ``list`` said which file held a typo, ``policy status`` did not)."""
        return ConfigError(self.detail, key=self.key, file=self.file or file, hint=self.hint)


def shown_value(value: Any) -> str:
    """A refused configuration value as an error shows it: a scalar or list by its ``repr``, cut
    at 80 characters; a table (or a list holding tables) by its keys only, never its values
    (found by a newcomer's trial: ``[plugins.mcp.serve.clients]`` written for ``[[…]]`` printed
    the table's values, a token typed there among them)."""
    if isinstance(value, Mapping):
        keys = ", ".join(repr(key) for key in value)
        text = f"a table with keys {keys}" if keys else "an empty table"
    elif _holds_table(value):
        text = f"a list of {len(value)} items, tables among them"
    else:
        text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _holds_table(value: Any) -> bool:
    """Whether ``value`` is a list holding a table, at any depth (a list of lists of tables too)."""
    return isinstance(value, (list, tuple)) and any(isinstance(item, Mapping) or _holds_table(item)
                                                    for item in value)


def double_bracket_hint(key: str) -> str:
    """The hint for a table ``[key]`` written where a list of tables ``[[key]]`` is wanted."""
    return f"head each entry [[{key}]] (double brackets: a list of tables); [{key}] is one table"


def did_you_mean(name: str, expected: Collection[str]) -> str | None:
    """``"did you mean 'x'?"`` for a misspelled ``name`` among ``expected`` names, else None.

    ``difflib`` is imported only when some name shares enough letters with ``name`` to be close
    (``_quick_ratio``, the bound ``difflib`` itself checks first), not for every unknown name. A name
    that differs from one only in case is always close (found by attack: ``disable_plugins =
    ["BASH"]`` shares no letter with ``bash``, was taken for a plugin not installed, and bash ran)."""
    same = next((e for e in sorted(expected) if e.casefold() == name.casefold()), None)
    if same is not None and same != name:
        return f"did you mean {same!r}?"
    candidates = sorted(e for e in expected if _quick_ratio(name, e) >= 0.6)
    if not candidates:
        return None
    import difflib  # only where a name may be misspelled, not at every start

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if not close:
        return None
    return f"did you mean {close[0]!r}?"


def one_slip_apart(name: str, meant: str) -> bool:
    """Whether ``name`` is ``meant`` typed with one slip: a letter left out, added or changed, two
    adjacent letters swapped (Damerau's four kinds of single error), or only the case changed. A
    name close by ``did_you_mean`` but further than this (``my_policy`` for ``policy``) may as well
    be another name altogether."""
    a, b = name.casefold(), meant.casefold()
    if a == b:
        return True
    if abs(len(a) - len(b)) > 1:
        return False
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (a[i + 1:] == b[i + 1:] or a[i:] == b[i + 1:] or a[i + 1:] == b[i:]
            or (a[i:i + 2] == b[i:i + 2][::-1] and a[i + 2:] == b[i + 2:]))


def missing_extra(extra: str, error: ImportError, needs: str = "this adapter") -> ImportError:
    """The ``ImportError`` for a module (``needs``) whose optional dependency is not installed, naming
    the extra that installs it (``error`` is the import's own failure)."""
    return ImportError(f"{needs} needs the {extra!r} extra ({error.name or error} is not installed): "
                       f"pip install 'amplifier-tools[{extra}]'")


class PluginLoadError(RuntimeError):
    """A plugin could not be imported, registered or mounted; names the plugin."""

    def __init__(self, plugin: str, reason: str, *, hint: str | None = None) -> None:
        super().__init__(f"plugin {plugin!r}: {reason}")
        self.plugin = plugin
        self.reason = reason
        #: What to do about it, for a person, when the plugin said (the command line's hint line).
        self.hint = hint
        note_hint(self, hint)


def note_hint(exc: BaseException, hint: str | None) -> None:
    """Add ``hint`` to ``exc`` as a note (PEP 678), so a Python traceback and pytest show it, not
    the command line alone (found by a new-user trial: ``ToolHost(config=...)`` raised a
    ``ConfigError`` whose traceback never said what to do). On Python 3.10, which has no
    ``add_note``, the note is set as ``__notes__`` all the same: pytest shows it there too (through
    the ``exceptiongroup`` backport it depends on), a plain traceback does not."""
    if not hint:
        return
    if hasattr(exc, "add_note"):
        exc.add_note(f"hint: {hint}")
    else:  # found by a newcomer's trial: on 3.10, a failing test's output never showed the hint
        exc.__notes__ = [*getattr(exc, "__notes__", ()), f"hint: {hint}"]  # type: ignore[attr-defined]


def _quick_ratio(a: str, b: str) -> float:
    """An upper bound of ``difflib.SequenceMatcher(None, a, b).ratio()``: the letters both have,
    counted with repetition (``SequenceMatcher.quick_ratio``)."""
    if not a and not b:
        return 1.0
    left: dict[str, int] = {}
    for letter in b:
        left[letter] = left.get(letter, 0) + 1
    shared = 0
    for letter in a:
        count = left.get(letter, 0)
        if count:
            left[letter] = count - 1
            shared += 1
    return 2.0 * shared / (len(a) + len(b))
