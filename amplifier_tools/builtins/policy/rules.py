"""Declarative allow/deny rules from config.

Any matching ``deny`` rule denies the call, wherever it stands in the list
(the first matching deny is the one reported); ``allow`` rules never cancel a
deny — they only matter under ``default_action = "deny"``, where a call no
allow rule matches is refused.

A rule matches a call when every given selector matches: ``tools``,
``principals``, ``roles``, ``environments`` (lists of globs) and ``arguments``
(JSON pointer -> glob on the value). For path arguments of the filesystem
tools the value is first resolved by the filesystem plugin's ``PathRules``
(capability ``fs.path_rules``), so ``../`` and relative spellings cannot slip
past a glob such as ``/etc/*``.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Final

import attrs

from ...errors import ConfigError, ContractError

SELECTORS: Final = ("tools", "principals", "roles", "environments")
RULE_KEYS: Final = frozenset({"name", "action", "reason", "arguments", *SELECTORS})


@attrs.frozen
class Rule:
    name: str
    action: str
    reason: str
    tools: tuple[str, ...] = ("*",)
    principals: tuple[str, ...] | None = None
    roles: tuple[str, ...] | None = None
    environments: tuple[str, ...] | None = None
    arguments: tuple[tuple[str, str], ...] = ()


def parse_rules(raw: Any, key: str) -> list[Rule]:
    """Rules from config; ``ConfigError`` naming ``key[index].field``."""
    if not isinstance(raw, list):
        raise ConfigError("must be a list of rule tables", key=key)
    rules = []
    for index, item in enumerate(raw):
        where = f"{key}[{index}]"
        if not isinstance(item, dict):
            raise ConfigError("must be a table", key=where)
        unknown = set(item) - RULE_KEYS
        if unknown:
            raise ConfigError(f"unknown key {sorted(unknown)[0]!r} (expected {sorted(RULE_KEYS)})", key=where)
        if item.get("action") not in ("allow", "deny"):
            raise ConfigError("action must be 'allow' or 'deny'", key=f"{where}.action")
        fields: dict[str, Any] = {}
        for selector in SELECTORS:
            if selector in item:
                value = item[selector]
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ConfigError("must be a list of glob strings", key=f"{where}.{selector}")
                fields[selector] = tuple(value)
        arguments = item.get("arguments", {})
        if not isinstance(arguments, dict) or not all(
                isinstance(k, str) and k.startswith("/") and isinstance(v, str) for k, v in arguments.items()):
            raise ConfigError("must map JSON pointers ('/path') to glob strings", key=f"{where}.arguments")
        name = str(item.get("name", f"rule {index + 1}"))
        rules.append(Rule(name=name, action=item["action"], reason=str(item.get("reason", name)),
                          arguments=tuple(arguments.items()), **fields))
    return rules


def _any(patterns: tuple[str, ...] | None, value: str | None) -> bool:
    if patterns is None:
        return True
    return value is not None and any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _pointer(data: Any, pointer: str) -> tuple[bool, Any]:
    for raw in pointer.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(data, dict) and part in data:
            data = data[part]
        else:
            return False, None
    return True, data


def matches(rule: Rule, tool: str, arguments: Any, principal: str, role: str | None, environment: str | None,
            path_rules: Any) -> bool:
    """Whether ``rule`` applies to this call."""
    if not (_any(rule.tools, tool) and _any(rule.principals, principal) and _any(rule.roles, role)
            and _any(rule.environments, environment)):
        return False
    for pointer, pattern in rule.arguments:
        found, value = _pointer(arguments, pointer)
        if not found:
            return False
        text = str(value)
        if path_rules is not None and tool.startswith("local::fs.") and pointer in ("/path",):
            try:
                text = path_rules.normalize(text)  # the same normalization the filesystem tools apply
            except ContractError:
                # fail closed: an unusable path is caught by a deny rule and never earns an allow
                return rule.action == "deny"
        if not fnmatch.fnmatchcase(text, pattern):
            return False
    return True
