"""JSON Schema validation of arguments and outputs.

Validators are compiled once per schema, when a tool is mounted, and shared by
every call (``compile_validator``). A call pays only for ``is_valid``; the slower
error walk runs only for invalid data, to name the offending field by JSON
pointer (RFC 6901).

Checking a schema against its metaschema costs milliseconds (jsonschema resolves the 2020-12
metaschema's ``$dynamicRef`` at every step), and the check depends on the schema's content only.
So a schema whose content digest (``schema_digest``) is known to pass is not checked again: the
built-in tools' schemas (``_checked_schemas``, which ``tests/test_schema.py`` keeps equal to what
the built-ins mount and checks against the metaschema) and every schema this process has already
checked. Any other schema — a plugin's, an MCP server's, a built-in's under a non-default
configuration — is checked at mount as before. jsonschema itself is imported when first needed:
a host whose schemas are all known and all compile to the fast path (``schema_fastpath``) starts,
lists and describes its tools without it.

``check_json_data`` rejects what jsonschema would let through silently but JSON
cannot carry: non-string keys, NaN and infinities, bytes, sets and arbitrary
objects.

Regular expressions (``pattern``, ``patternProperties``) run on Python's ``re``
unless the caller passes another engine (``patterns``): a schema from outside
the host (an imported MCP server) must come with a linear-time one, because a
backtracking engine lets a schema's author freeze the host with one string.
That engine is used for ``pattern``, ``patternProperties`` and the
``additionalProperties`` that depends on them; ``unevaluatedProperties`` and a
nested ``$schema`` (which makes jsonschema switch to a stock validator) still
use ``re`` here, so whoever passes an engine must refuse schemas that combine
them with patterns (:mod:`amplifier_tools.mcp.patterns` does).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol

from ._checked_schemas import BUILTIN_SCHEMA_DIGESTS
from ._json import json_pointer
from .errors import ContractError, did_you_mean
from .schema_fastpath import (
    CompiledPattern,
    PatternCompiler,
    PlainJSON,
    compile_check,
    generate_check,
    generate_plain_check,
)

#: Digests of the schemas known to pass their metaschema (see the module's docstring).
_CHECKED: set[str] = set(BUILTIN_SCHEMA_DIGESTS)
#: How many checked schemas a process remembers beyond the built-ins' (a host importing MCP servers
#: whose schemas change would otherwise grow the set for ever).
_MAX_REMEMBERED: Final = 4096

if TYPE_CHECKING:
    import jsonschema.exceptions


class Validator(Protocol):
    """The part of a jsonschema validator the host uses."""

    def is_valid(self, instance: Any) -> bool: ...

    def iter_errors(self, instance: Any) -> Iterable[jsonschema.exceptions.ValidationError]: ...

    def accepts_plain(self, instance: Any) -> bool:
        """True only when ``instance`` is plain JSON data (``is_plain_json``) that the schema
        accepts; False is no verdict."""
        ...


def compile_validator(
    schema: dict[str, Any], *, owner: str, which: str, patterns: PatternCompiler | None = None
) -> Validator:
    """Check ``schema`` against its metaschema and return a reusable validator.

    The draft is taken from ``$schema`` (default 2020-12). Raises
    ``ContractError`` naming ``owner`` (the tool), ``which`` schema and the
    pointer of the bad keyword. ``patterns`` compiles the schema's regular
    expressions instead of ``re.compile`` (see the module's docstring).
    """
    digest = schema_digest(schema)
    if digest is None or digest not in _CHECKED:
        _check_schema(schema, owner=owner, which=which)
        if digest is not None and len(_CHECKED) < len(BUILTIN_SCHEMA_DIGESTS) + _MAX_REMEMBERED:
            _CHECKED.add(digest)
    return CompiledSchema(schema, patterns)


def _check_schema(schema: dict[str, Any], *, owner: str, which: str) -> None:
    import jsonschema.exceptions

    _check_depth(schema, owner=owner, which=which)
    try:
        _validator_class(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        pointer = json_pointer(exc.absolute_path)
        raise ContractError(
            f"tool {owner!r}: {which} is not a valid JSON Schema at {pointer or '/'}: {exc.message}",
            code="invalid_schema",
            pointer=pointer,
        ) from None
    _check_refs(schema, owner=owner, which=which)


#: Most objects and arrays a schema may nest inside each other. jsonschema's own metaschema check
#: recurses once per level and ran out of stack at about 100 (found by attack: the start failed
#: with a bare ``RecursionError``, naming no tool). Real schemas nest a few levels; a reference
#: (``$defs`` and ``$ref``) does not count as nesting.
MAX_SCHEMA_DEPTH: Final = 64


def _check_depth(schema: dict[str, Any], *, owner: str, which: str) -> None:
    """Refuse a schema whose objects and arrays nest more than ``MAX_SCHEMA_DEPTH`` deep (also one
    that contains itself), naming the pointer where it passes the bound; iterative, so any depth
    is measured."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            items: Iterable[tuple[Any, Any]] = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        if len(path) > MAX_SCHEMA_DEPTH:
            pointer = json_pointer(path)
            raise ContractError(
                f"tool {owner!r}: {which} nests objects and arrays more than {MAX_SCHEMA_DEPTH} deep at {pointer}",
                code="invalid_schema",
                pointer=pointer,
                hint="move deep parts under $defs and refer to them with $ref (a reference does not count as nesting)",
            )
        stack.extend((value, (*path, key)) for key, value in items)


#: Keywords whose values are a subschema or an array of them, in any draft jsonschema knows (draft 3's
#: ``type``, ``disallow`` and ``extends`` may hold schemas). Any other keyword's value is data to
#: the validator (``enum``, ``default``, an unknown ``x-...``): a ``"$ref"`` key inside is no reference.
_SUBSCHEMA_KEYWORDS: Final = frozenset({
    "additionalItems", "additionalProperties", "allOf", "anyOf", "contains", "contentSchema", "disallow",
    "else", "extends", "if", "items", "not", "oneOf", "prefixItems", "propertyNames", "then", "type",
    "unevaluatedItems", "unevaluatedProperties"})
#: Keywords whose values map names to subschemas: their keys are names (a property may be called
#: ``default``), never keywords. Draft 4-7 ``dependencies`` values may also be arrays of names.
_SCHEMA_MAPS: Final = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                                 "dependencies"})
#: Most values a schema may stand for with every ``$ref`` written out in place (a reference back
#: into itself counted once). Frameworks that hand a schema to a model API write its references
#: out (LangChain's ``convert_to_openai_tool``): chained definitions each referring to the one
#: before twice double at every level, and 18 levels took 4.75 s and 8.6 MB there (found by attack:
#: a hostile MCP server's schema would hang the agent). Real schemas stay far below.
MAX_EXPANDED_VALUES: Final = 100_000


def _local_registry() -> Any:
    """The registry every ``$ref`` is resolved with: the drafts' metaschemas
    (``jsonschema_specifications``), and the schema itself as the root, nothing retrieved.
    jsonschema's default registry fetches any other URI over the network at validation time (an
    imported MCP server's ``"$ref": "http://169.254.169.254/..."`` made the host send a GET, on
    its event loop, at every call), and validated against whatever came back."""
    from jsonschema_specifications import REGISTRY  # type: ignore[import-untyped,unused-ignore]

    return REGISTRY


def _check_refs(schema: dict[str, Any], *, owner: str, which: str) -> None:
    """Refuse a ``$ref`` (or ``$dynamicRef``) that resolves to nothing in the
    schema (a typo, or a URI the host would have to fetch): every call reaching it would fail as an
    internal error. Resolved as validation resolves it (the schema's dialect, ``_local_registry``,
    below a nested ``$id`` — ``id`` before draft 6 — against that base URI). Only what the
    validator reads as a schema is searched: the subschemas of the keywords that have them, and
    whatever a reference resolves to (so a ``"$ref"`` key inside ``enum``, ``default`` or an
    unknown ``x-...`` keyword is data, unless a reference points there). Each object is searched
    once per base URI it is reached under."""
    import referencing.exceptions
    import referencing.jsonschema

    cls = _validator_class(schema)
    specification = referencing.jsonschema.specification_with(cls.ID_OF(cls.META_SCHEMA) or "urn:unknown-dialect")
    root = _local_registry().resolver_with_root(specification.create_resource(schema))
    # (node, its path, whether it is a name -> subschema map rather than a schema, the resolver in
    # scope, whether that resolver is already the node's own: the root's, and what a reference
    # resolved to, whose resolver ``lookup`` gives in the target's scope, $id applied; jsonschema
    # applies it once, and applying a relative $id twice moved the base URI, found by attack)
    stack: list[tuple[Any, tuple[Any, ...], bool, Any, bool]] = [(schema, (), False, root, True)]
    # The objects searched, by id and base URI: a target reached again in the same scope is not
    # searched again (an object a plugin shares between two scopes is searched in each).
    searched: set[tuple[int, str]] = set()
    schemas: dict[tuple[int, str], tuple[Any, tuple[Any, ...], Any]] = {}  # every schema searched
    while stack:
        node, path, names, resolver, scoped = stack.pop()
        if isinstance(node, list):
            stack.extend((item, (*path, index), False, resolver, False) for index, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        if not names and not scoped and isinstance(cls.ID_OF(node), str):  # a base URI of its own below
            resolver = resolver.in_subresource(specification.create_resource(node))
        place = (id(node), _base_uri(resolver))
        if place in searched:
            continue
        searched.add(place)
        if names:
            stack.extend((value, (*path, key), False, resolver, False) for key, value in node.items())
            continue
        schemas[place] = (node, path, resolver)
        for keyword in ("$ref", "$dynamicRef"):  # $recursiveRef always means "#": jsonschema reads no value
            ref = node.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                resolved = resolver.lookup(ref)
            except referencing.exceptions.Unresolvable:
                pointer = json_pointer([*path, keyword])
                raise ContractError(
                    f"tool {owner!r}: {which} has a {keyword} that resolves to nothing in the schema at {pointer}: "
                    f"{ref!r} (references outside the schema are never fetched)",
                    code="invalid_schema",
                    pointer=pointer,
                    hint="define what it refers to under $defs in the same schema",
                ) from None
            # What it points at is read as a schema, wherever it is (inside an unknown keyword, say).
            stack.append((resolved.contents, (*path, keyword), False, resolved.resolver, True))
        stack.extend((value, (*path, key), key in _SCHEMA_MAPS, resolver, False) for key, value in node.items()
                     if key in _SUBSCHEMA_KEYWORDS or key in _SCHEMA_MAPS)
    _check_cycles(cls, specification, schemas, owner=owner, which=which)
    _check_expansion(schema, root, owner=owner, which=which)


def _base_uri(resolver: Any) -> str:
    """The base URI ``resolver`` resolves references against."""
    return str(resolver._base_uri)


#: Keywords that apply their subschemas to the same value, not to a part of it (in the drafts that
#: have them; ``then`` and ``else`` beside an ``if``); ``dependencies`` and ``dependentSchemas``
#: map names to such subschemas.
_IN_PLACE: Final = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas",
                              "dependencies", "extends", "disallow", "type"})


def _check_cycles(cls: Any, specification: Any, schemas: dict[tuple[int, str], tuple[Any, tuple[Any, ...], Any]],
                  *, owner: str, which: str) -> None:
    """Refuse a schema that refers back to itself without moving into a part of the value
    (``{"$ref": "#"}``, ``{"allOf": [{"$ref": "#"}]}``, two definitions referring to each other):
    jsonschema follows such a loop until the interpreter's stack runs out, so every call reaching
    it failed as an internal ``RecursionError`` (found by attack). ``schemas`` are the schemas
    ``_check_refs`` searched, each with its path and its resolver; a reference is followed where
    the validator reads one (the draft's keywords only; in drafts 3 to 7 nothing beside a
    ``$ref``), and a loop through ``properties``, ``items`` or the like is a recursive schema,
    bounded by the data."""
    applicable = getattr(cls, "_APPLICABLE_VALIDATORS", None)
    keywords = cls.VALIDATORS

    def in_place(node: dict[str, Any], resolver: Any) -> Iterator[tuple[int, str]]:
        pairs = applicable(node) if applicable is not None else node.items()
        for keyword, value in pairs:
            if keyword in ("then", "else"):
                if "if" not in keywords or "if" not in node:
                    continue
            elif keyword not in keywords:
                continue
            if keyword in ("$ref", "$dynamicRef"):
                if isinstance(value, str):
                    resolved = resolver.lookup(value)  # resolvable: _check_refs looked it up
                    yield id(resolved.contents), _base_uri(resolved.resolver)
                continue
            if keyword not in _IN_PLACE:
                continue
            subschemas = value.values() if isinstance(value, dict) and keyword in _SCHEMA_MAPS \
                else value if isinstance(value, list) else [value]
            for subschema in subschemas:
                if isinstance(subschema, dict):
                    yield id(subschema), _base_uri(resolver.in_subresource(specification.create_resource(subschema)))

    done: set[tuple[int, str]] = set()
    for start in schemas:
        if start in done:
            continue
        on_path = {start}
        node, _, resolver = schemas[start]
        walk: list[tuple[tuple[int, str], Iterator[tuple[int, str]]]] = [(start, in_place(node, resolver))]
        while walk:
            here, successors = walk[-1]
            following = next(successors, None)
            if following is None:
                walk.pop()
                on_path.discard(here)
                done.add(here)
                continue
            if following in on_path:
                pointer = json_pointer(schemas[here][1])
                raise ContractError(
                    f"tool {owner!r}: {which} refers back to itself at {pointer or '/'} without moving into a part "
                    "of the value: validation would follow the reference for ever",
                    code="invalid_schema",
                    pointer=pointer,
                    hint="a schema may refer back to itself only below properties, items or the like",
                )
            if following in done or following not in schemas:
                continue
            on_path.add(following)
            node, _, resolver = schemas[following]
            walk.append((following, in_place(node, resolver)))


class _TooLarge(Exception):
    """The count passed ``MAX_EXPANDED_VALUES``."""


_NOWHERE: Final = object()


def _pointer_target(schema: Any, ref: str) -> Any:
    """What ``ref`` names the way frameworks that write references out resolve it (LangChain's
    ``dereference_refs``: a ``#/...`` pointer from the document's root, whatever ``$id`` is in
    scope, nothing decoded), or ``_NOWHERE``."""
    parts = ref.split("/")
    if parts[0] != "#":
        return _NOWHERE
    node = schema
    for part in parts[1:]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _NOWHERE
    return node


def _check_expansion(schema: dict[str, Any], resolver: Any, *, owner: str, which: str) -> None:
    """Refuse a schema that stands for more than ``MAX_EXPANDED_VALUES`` values with its references
    written out as frameworks write them (LangChain's ``convert_to_openai_tool``): every value
    counted, data (``enum``, ``default``...) and keys named like keywords included, a reference
    written out at every use, even under a nested ``$id`` (those frameworks resolve ``#/...`` from
    the root), a reference back to a definition being written out cut there. Nothing is memoized
    (a count computed inside a cycle is no count for another entry into it, found by attack), so
    the count visits at most ``MAX_EXPANDED_VALUES`` values and stops."""
    import referencing.exceptions

    budget = MAX_EXPANDED_VALUES
    targets: dict[str, list[Any]] = {}
    writing: set[int] = set()  # the definitions being written out, on the way here

    def resolve(ref: str) -> list[Any]:
        found = targets.get(ref)
        if found is None:
            found = []
            by_pointer = _pointer_target(schema, ref)
            if by_pointer is not _NOWHERE:
                found.append(by_pointer)
            try:
                contents = resolver.lookup(ref).contents
            except referencing.exceptions.Unresolvable:
                pass
            else:
                if all(contents is not other for other in found):
                    found.append(contents)
            targets[ref] = found
        return found

    def count(node: Any) -> None:
        nonlocal budget
        budget -= 1
        if budget < 0:
            raise _TooLarge
        if isinstance(node, list):
            for item in node:
                count(item)
        elif isinstance(node, dict):
            for value in node.values():
                count(value)
            ref = node.get("$ref")
            if isinstance(ref, str):
                for target in resolve(ref):
                    if id(target) in writing:
                        continue
                    writing.add(id(target))
                    try:
                        count(target)
                    finally:
                        writing.discard(id(target))

    try:
        count(schema)
        too_large = False
    except (_TooLarge, RecursionError):
        too_large = True
    if too_large:
        raise ContractError(
            f"tool {owner!r}: {which} stands for more than {MAX_EXPANDED_VALUES:,} values with its $refs written "
            "out, as frameworks that pass it to a model write them (definitions referring to each other "
            "several times, level after level)",
            code="invalid_schema",
            pointer="",
            hint="define the shared parts once and refer to them without nesting the references",
        )


def _validator_class(schema: dict[str, Any]) -> Any:
    """The jsonschema validator of the draft ``$schema`` names (default 2020-12)."""
    import jsonschema.validators

    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def schema_digest(schema: Any) -> str | None:
    """The SHA-256 of ``schema``'s canonical JSON (sorted keys, no spaces), or None when it holds
    anything but plain JSON values (exact ``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``,
    ``None``; finite numbers): a tuple, say, is written like a list by ``json`` but is no array to
    jsonschema, so two schemas with one digest always get the same answer from the metaschema."""
    try:  # raises on a cycle, and on most values that are not JSON
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None
    stack = [schema]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is dict:
            if any(type(key) is not str for key in value):  # json writes 1 and "1" alike
                return None
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
        elif not (kind is str or kind is int or kind is bool or value is None
                  or (kind is float and math.isfinite(value))):
            return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _with_patterns(cls: Any, compile_pattern: PatternCompiler) -> Any:
    """``cls`` with its regex keywords running on ``compile_pattern`` (jsonschema's own logic)."""
    import jsonschema.exceptions
    import jsonschema.validators

    compiled: dict[str, CompiledPattern] = {}

    def find(pattern: str) -> CompiledPattern:
        regex = compiled.get(pattern)
        if regex is None:
            regex = compiled[pattern] = compile_pattern(pattern)
        return regex

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and find(patrn).search(instance) is None:
            yield jsonschema.exceptions.ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in value.items():
            regex = find(patrn)
            for key, item in instance.items():
                if regex.search(key) is not None:
                    yield from validator.descend(item, subschema, path=key, schema_path=patrn)

    stock_additional = cls.VALIDATORS.get("additionalProperties")

    def additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
        regexes = [find(p) for p in schema.get("patternProperties", {})]
        if not regexes or stock_additional is None:  # no regex involved: jsonschema's own keyword
            if stock_additional is not None:
                yield from stock_additional(validator, extra, instance, schema)
            return
        if not validator.is_type(instance, "object"):
            return
        known = schema.get("properties", {})
        extras = {key for key in instance
                  if key not in known and not any(r.search(key) is not None for r in regexes)}
        if validator.is_type(extra, "object"):
            for key in extras:
                yield from validator.descend(instance[key], extra, path=key)
        elif not extra and extras:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            names = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield jsonschema.exceptions.ValidationError(f"{joined} {verb} not match any of the regexes: {names}")

    keywords = {"pattern": pattern, "patternProperties": pattern_properties,
                "additionalProperties": additional_properties}
    return jsonschema.validators.extend(cls, {k: v for k, v in keywords.items() if k in cls.VALIDATORS})



def _no_verdict(instance: Any) -> bool:
    """``CompiledSchema.accepts_plain`` of a schema without a plain predicate."""
    return False


class CompiledSchema:
    """A jsonschema validator with a compiled fast path for accepting valid data.

    ``is_valid`` tries the fast predicate first and asks jsonschema only when it
    says no (or when the schema could not be compiled), so jsonschema decides
    every rejection. The jsonschema validator is made when first asked for.
    """

    __slots__ = ("_fast", "_patterns", "_schema", "_validator", "accepts_plain")

    def __init__(self, schema: dict[str, Any], patterns: PatternCompiler | None = None) -> None:
        self._schema = schema
        self._patterns = patterns
        fast = compile_check(schema) if patterns is None else compile_check(schema, patterns)
        # The predicate is generated as one function at the schema's first use (a mounted tool
        # never called costs no code generation); until then, only that it compiles is known.
        self._fast: Callable[[Any], bool] | None = None if fast is None else self._first_use
        #: True only when ``instance`` is plain JSON data within the host's limits (what
        #: ``is_plain_json`` says) and the schema accepts it: one generated predicate for both
        #: (``generate_plain_check``, which calls ``is_plain_json`` only for the values the schema
        #: does not test by exact type). False is no verdict: ask ``is_plain_json`` and
        #: ``is_valid``. The generated function itself once made (no method around it: it is
        #: asked at every call).
        self.accepts_plain: Callable[[Any], bool] = self._first_plain_use if fast is not None else _no_verdict
        self._validator: Validator | None = None

    def _first_use(self, instance: Any) -> bool:
        patterns = self._patterns
        fast = generate_check(self._schema) if patterns is None else generate_check(self._schema, patterns)
        assert fast is not None  # compile_check took this schema: so does generate_check
        self._fast = fast
        return fast(instance)

    def _first_plain_use(self, instance: Any) -> bool:
        patterns = self._patterns
        plain = generate_plain_check(self._schema, PLAIN_JSON) if patterns is None \
            else generate_plain_check(self._schema, PLAIN_JSON, patterns)
        self.accepts_plain = _no_verdict if plain is None else plain
        return plain is not None and plain(instance)

    @property
    def compiled(self) -> bool:
        """Whether the fast path is in use for this schema."""
        return self._fast is not None

    @property
    def validator(self) -> Validator:
        """The jsonschema validator (``patterns`` running the regex keywords, when given)."""
        validator = self._validator
        if validator is None:
            cls = _validator_class(self._schema)
            if self._patterns is not None:
                cls = _with_patterns(cls, self._patterns)
            validator = self._validator = cls(self._schema, registry=_local_registry())
        return validator

    def is_valid(self, instance: Any) -> bool:
        fast = self._fast
        if fast is not None and fast(instance):
            return True
        return self.validator.is_valid(instance)

    def iter_errors(self, instance: Any) -> Iterable[jsonschema.exceptions.ValidationError]:
        return self.validator.iter_errors(instance)


def describe_errors(validator: Validator, instance: Any, *, limit: int = 5) -> tuple[str, str]:
    """The pointer of the first problem and a message naming up to ``limit`` problems (a
    disallowed property's with the closest allowed one: ``schema_problems``' ``suggest``)."""
    problems = schema_problems(validator, instance, limit=limit + 1, suggest=True)
    shown = problems[:limit]
    text = "; ".join(f"{ptr or '/'}: {msg}" for ptr, msg in shown)
    if len(problems) > limit:
        text += " (and more)"
    return shown[0][0], text


def schema_problems(validator: Validator, instance: Any, *, limit: int = 5, suggest: bool = False,
                    show: Callable[[Any], str] | None = None) -> list[tuple[str, str]]:
    """Up to ``limit`` ``(JSON pointer, message)`` pairs, the offending field first.

    A missing required property or a disallowed extra property is reported at
    the pointer of that property, not of its parent object (its name escaped as any pointer's
    part: found by attack, ``"x/y"`` was reported at ``/x/y``, a place it is not). With
    ``suggest``, a disallowed property's message ends with the closest allowed one, when one is
    close (found by a newcomer's trial: ``{"limt": 3}`` said only "is not an allowed property");
    the configuration, whose error gives it as its hint, leaves it out. Only a refusal pays for it.
    ``show``: how a message that begins with the refused table or list shows it instead of its
    ``repr`` (the configuration's ``errors.shown_value``: its keys, never its values).
    """
    problems: list[tuple[str, str]] = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        pointer = json_pointer(error.absolute_path)
        if error.validator == "required" and isinstance(error.instance, dict):
            missing = [name for name in error.validator_value if name not in error.instance]
            for name in missing:
                problem = (pointer + json_pointer((name,)), "is a required property and is missing")
                if problem not in problems:  # jsonschema reports each missing name with the full list
                    problems.append(problem)
            continue
        if (
            error.validator == "additionalProperties"
            and isinstance(error.instance, dict)
            and isinstance(error.schema, dict)
            and "patternProperties" not in error.schema
        ):
            known = error.schema.get("properties", {})
            for name in error.instance:
                if name in known:
                    continue
                close = did_you_mean(name, known) if suggest and isinstance(known, dict) else None
                problem = (pointer + json_pointer((name,)),
                           f"is not an allowed property ({close})" if close else "is not an allowed property")
                if problem not in problems:
                    problems.append(problem)
            continue
        message = error.message
        if show is not None and isinstance(error.instance, (dict, list)):
            shown = repr(error.instance)
            if message.startswith(shown):
                message = show(error.instance) + message[len(shown):]
        problems.append((pointer, message))
        if len(problems) >= limit:
            break
    if not problems:  # is_valid said no; be explicit rather than silent
        problems.append(("", "does not match the schema"))
    return problems[:limit]


#: Arguments nested deeper than this are refused (a deeper value would exhaust the interpreter's
#: recursion limit in validation, redaction or encoding further down the pipeline).
MAX_JSON_DEPTH: Final = 128
#: Integers longer than this are refused: CPython will not turn an integer of more than 4,300
#: decimal digits into text (``sys.set_int_max_str_digits``), which every JSON encoder needs.
MAX_INT_BITS: Final = 14_000


def check_json_data(value: Any, pointer: str = "", depth: int = 0) -> None:
    """Raise ``ContractError`` at the first value JSON cannot represent, or that is too deep
    (``MAX_JSON_DEPTH`` levels) or too large an integer (``MAX_INT_BITS``) to handle safely.

    Valid data (nearly every call's) is confirmed by ``is_plain_json``, which builds no JSON
    pointer; only data it does not vouch for is walked again here, naming where it fails."""
    if is_plain_json(value, depth):
        return
    _locate_non_json(value, pointer, depth)


def is_plain_json(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is JSON data of exact builtin types (dict, list, str, int, float, bool,
    None) within the limits ``check_json_data`` sets. False is no verdict: subclasses (enums),
    tuples and every failure go to ``_locate_non_json``."""
    kind = type(value)
    if kind is dict:
        items: Any = value.items()
    elif kind is list:
        items = enumerate(value)
    else:
        return _is_plain_scalar(value, kind)
    if depth >= MAX_JSON_DEPTH:
        return False
    for key, item in items:
        if kind is dict and type(key) is not str:
            return False
        item_kind = type(item)
        if item_kind is str or item_kind is bool or item is None:  # common leaves: no call per leaf
            continue
        if item_kind is int:
            if item.bit_length() > MAX_INT_BITS:
                return False
        elif item_kind is dict or item_kind is list:
            if not is_plain_json(item, depth + 1):
                return False
        elif not _is_plain_scalar(item, item_kind):
            return False
    return True


#: The host's rule for plain JSON data, as generated plain predicates apply it
#: (``CompiledSchema.accepts_plain``).
PLAIN_JSON: Final = PlainJSON(MAX_INT_BITS, MAX_JSON_DEPTH, is_plain_json)


def _is_plain_scalar(value: Any, kind: type) -> bool:
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(value.bit_length() <= MAX_INT_BITS)
    if kind is float:
        return math.isfinite(value)
    return False


def _locate_non_json(value: Any, pointer: str, depth: int) -> None:
    """``check_json_data``'s full walk: raise at the first value that is not JSON data, naming
    its JSON pointer; return when there is none (an enum member, a tuple)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return
    if kind is int:
        if value.bit_length() > MAX_INT_BITS:
            raise ContractError(f"{pointer or '/'}: integer of {value.bit_length()} bits is larger than the "
                                f"{MAX_INT_BITS}-bit limit", code="invalid_json", pointer=pointer)
        return
    if kind is float:
        if not math.isfinite(value):
            raise ContractError(
                f"{pointer or '/'}: {value!r} is not a JSON number", code="invalid_json", pointer=pointer
            )
        return
    if depth >= MAX_JSON_DEPTH and isinstance(value, (dict, list, tuple)):
        raise ContractError(f"{pointer or '/'}: nested deeper than {MAX_JSON_DEPTH} levels",
                            code="invalid_json", pointer=pointer)
    if isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str:
                raise ContractError(
                    f"{pointer or '/'}: key {key!r} is not a string", code="invalid_json", pointer=pointer
                )
            _locate_non_json(item, f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}", depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _locate_non_json(item, f"{pointer}/{index}", depth + 1)
        return
    if isinstance(value, (str, int, float)):  # subclasses (enums) that JSON encodes by value
        if isinstance(value, float) and not math.isfinite(value):
            raise ContractError(
                f"{pointer or '/'}: {value!r} is not a JSON number", code="invalid_json", pointer=pointer
            )
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise ContractError(f"{pointer or '/'}: integer is larger than the {MAX_INT_BITS}-bit limit",
                                code="invalid_json", pointer=pointer)
        return
    raise ContractError(
        f"{pointer or '/'}: a {kind.__name__} is not JSON data", code="invalid_json", pointer=pointer
    )
