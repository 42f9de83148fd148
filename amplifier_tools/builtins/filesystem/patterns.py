"""``PathPattern``: how one path-rule glob matches a resolved path — the only matcher of path rules.

Used by the filesystem tools' ``denied_paths`` / ``write_denied_paths`` (through ``PathRules``)
and by the policy plugin's path rules (``arguments`` on path arguments, ``paths``), always on a
path that was already resolved (absolute, ``..`` collapsed, symlinks followed). A pattern is one
of three kinds, and ``*`` matches across ``/`` (``fnmatch`` semantics) in all of them:

- a **name** (no ``/``: ``secrets*``, ``.env*``): matches when any component of the path below
  the *base* matches (the base is the allowed root for the filesystem tools, the working
  directory for policy rules; a path outside the base is taken from ``/``);
- an **absolute** glob (``/etc/*``, ``/srv/data``): matches the path or any of its ancestors;
- a **relative** glob (``build/*``, ``./src``: a leading ``./`` makes a name relative): matches
  the path relative to the base, or an ancestor of it.

Because an ancestor that matches makes the path match, a rule on a directory covers everything
below it, so whether a listing or search of a directory may be allowed is just ``matches``.
``may_match_below`` answers the deny side of a walk: could some entry below the
directory match? It is decided on the pattern's literal prefix and over-approximates (a name
pattern may match below any directory): it is for refusing, never for allowing.

What it does not do: it never touches the filesystem (resolution is ``PathRules``' job), and it
is case-sensitive even on case-insensitive filesystems.
"""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Final

WILDCARDS: Final = frozenset("*?[")


def components_below(path: str, base: str) -> tuple[str, ...] | None:
    """The components of ``path`` below ``base``, compared component-wise (``/work/app`` is not under
    ``/work/ap``), or None when ``path`` does not lie under ``base``. Both must be normalized absolute
    paths (``os.path.normpath``: no ``.``, ``..``, doubled or trailing ``/``)."""
    if base == "/":
        rest = path[1:]
    elif path == base:
        return ()
    elif path.startswith(base) and path[len(base):len(base) + 1] == "/":
        rest = path[len(base) + 1:]
    else:
        return None
    return tuple(rest.split("/")) if rest else ()


def _literal_prefix(pattern: str) -> str:
    cut = next((i for i, ch in enumerate(pattern) if ch in WILDCARDS), len(pattern))
    return pattern[:cut]


def _prefix_compatible(literal: str, directory: str) -> bool:
    """Whether a pattern whose literal prefix is ``literal`` may match a path below ``directory``."""
    below = directory.rstrip("/") + "/"
    return literal.startswith(below) or below.startswith(literal)


class PathPattern:
    """One compiled path-rule glob (see the module docstring for its three kinds)."""

    __slots__ = ("_glob", "_regex", "kind", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        stripped = text.rstrip("/") or "/"
        anchored = stripped.startswith("./")  # "./src": the relative path src, not the name src
        while stripped.startswith("./"):
            stripped = stripped[2:]
        self.kind = ("absolute" if stripped.startswith("/") else "relative" if anchored or "/" in stripped
                     else "name")
        self._glob = stripped
        # "the path or one of its ancestors matches" is "the path matches glob(/.*)?" for normalized paths
        body = fnmatch.translate(stripped).removesuffix(r"\Z")
        suffix = "" if self.kind == "name" else ".*" if stripped == "/" else r"(?:/.*)?"
        self._regex = re.compile(body + suffix, re.DOTALL)

    def __repr__(self) -> str:
        return f"PathPattern({self.text!r})"

    def _parts(self, path: str, base: str) -> tuple[str, ...]:
        parts = components_below(path, base)
        return parts if parts is not None else components_below(path, "/") or ()

    def matches(self, path: str, base: str) -> bool:
        """Whether the resolved absolute ``path`` (or an ancestor of it) matches."""
        fullmatch = self._regex.fullmatch
        if self.kind == "name":
            return any(fullmatch(part) for part in self._parts(path, base))
        if self.kind == "absolute":
            return fullmatch(path) is not None
        return fullmatch("/".join(self._parts(path, base))) is not None

    def matches_entry(self, path: str, name: str, base: str) -> bool:
        """``matches`` for an entry ``name`` (at ``path``) met in a walk whose directories were already
        checked: an ancestor cannot match, so a name pattern looks at ``name`` alone."""
        if self.kind == "name":
            return self._regex.fullmatch(name) is not None
        if self.kind == "absolute":
            return self._regex.fullmatch(path) is not None
        return self.matches(path, base)

    def may_match_below(self, directory: str, base: str) -> bool:
        """Whether some path below ``directory`` might match (over-approximated; for denying walks)."""
        if self.kind == "name":
            return True
        if self.kind == "absolute":
            return _prefix_compatible(_literal_prefix(self._glob), directory)
        literal = _literal_prefix(self._glob)
        return any(_prefix_compatible(os.path.join(anchor, literal), directory) for anchor in (base, "/"))
