"""A compiled fast path for the common subset of JSON Schema.

jsonschema walks a schema generically on every ``is_valid`` (about 15 µs for a
two-property object), which is most of the host's per-call budget. Tool input
schemas are nearly always simple objects, so for schemas made only of the
keywords below this module compiles a plain Python predicate once, at mount.

Soundness rule: the predicate may answer ``True`` only when jsonschema would.
The host treats ``False`` as "ask jsonschema" — jsonschema stays the authority
for every rejection and every error message — so a gap here can only cost
speed, never correctness. A schema using any other keyword (``$ref``,
``allOf``, ``if``, ``patternProperties``, ``format`` assertions ...) is not
compiled at all. ``oneOf`` is compiled only when each branch names its ``type`` and no two
branches share one (``integer`` and ``number`` count as shared): a value one branch accepts
then fails every other branch's ``type``, so "exactly one" is "any". A ``$schema``, at the root or
in any subschema, must name draft 6 or later (``_DRAFTS``): jsonschema validates each subschema by
the draft its own ``$schema`` names, and drafts 3 and 4 count no float as an integer.
``tests/test_schema_fastpath.py`` checks the two agree on random instances with hypothesis.

``pattern`` is compiled with the engine the caller names (``compile_pattern``;
Python's ``re`` for the host's own schemas): this module never chooses a regex
engine for a schema it was not told to trust.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, Final, NamedTuple, Protocol

Check = Callable[[Any], bool]


class CompiledPattern(Protocol):
    """A compiled regular expression: what ``pattern`` keywords need of one."""

    def search(self, string: str) -> object: ...


#: Compiles a JSON Schema ``pattern``; raises (any exception) when it cannot.
PatternCompiler = Callable[[str], CompiledPattern]

#: Keywords that only annotate and never change validity.
_ANNOTATIONS: Final = frozenset(
    {"$schema", "$id", "$comment", "title", "description", "default", "examples", "deprecated",
     "readOnly", "writeOnly", "format"}
)
_SUPPORTED: Final = _ANNOTATIONS | frozenset(
    {"type", "properties", "required", "additionalProperties", "enum", "const", "minimum", "maximum",
     "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "items", "minItems",
     "maxItems", "minProperties", "maxProperties", "oneOf"}
)


def _is_number(value: Any) -> bool:
    kind = type(value)
    return kind is int or kind is float  # NaN and infinities included, as in jsonschema


_TYPE_CHECKS: Final[dict[str, Check]] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
    "number": _is_number,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
}


#: Drafts whose numeric and ``items`` keywords mean what this module assumes.
_DRAFTS: Final = ("2020-12", "2019-09", "draft-07", "draft-06")


def compile_check(schema: Any, compile_pattern: PatternCompiler = re.compile) -> Check | None:
    """A predicate equivalent to ``validator.is_valid`` for ``True`` answers, or None.

    ``compile_pattern`` compiles the ``pattern`` keywords (the engine the validator uses too).
    """
    return _compile(schema, compile_pattern)


def _known_dialect(schema: dict[str, Any]) -> bool:
    """Whether ``schema``'s own ``$schema`` (absent, or naming one of ``_DRAFTS``) lets it compile.

    Asked of every subschema, not only the root: jsonschema takes up the draft a nested
    ``$schema`` names for that subschema (``validator_for`` at each descent), so a nested draft-04
    ``{"type": "integer"}`` refuses ``1.0`` (found by attack: the fast path accepted it). A
    string naming none of the drafts is no draft jsonschema knows: it keeps the enclosing one."""
    dialect = schema.get("$schema")
    return dialect is None or (isinstance(dialect, str) and any(d in dialect for d in _DRAFTS))


def generate_check(schema: Any, compile_pattern: PatternCompiler = re.compile) -> Check | None:
    """``compile_check``'s predicate as one generated Python function (the same tests in the same
    order, with no closure, lambda or generator per keyword at run time: ≈ 0.7 µs less a call for
    a two-property object, and less code to run), or None where ``compile_check`` gives None. It
    costs ≈ 80 µs (``compile``), so ``schema.CompiledSchema`` generates it at a schema's first use.
    A schema nested deeper than Python's compiler takes blocks gets ``compile_check``'s closures."""
    check = compile_check(schema, compile_pattern)
    if check is None or check is _always:
        return check
    try:
        return _generate(schema, compile_pattern)
    except Exception:  # SyntaxError: too many statically nested blocks, or RecursionError
        return check


class PlainJSON(NamedTuple):
    """What "plain JSON data within the host's limits" means, for ``generate_plain_check``: the
    host's rule (``schema.PLAIN_JSON``), passed in so this module keeps no second copy of it."""

    #: The most bits an ``int`` may have.
    max_int_bits: int
    #: Containers (``dict``, ``list``) are plain only at a depth below this (the value itself at 0).
    max_depth: int
    #: ``is_plain(value, depth)``: whether ``value``, found at ``depth``, is plain JSON data
    #: (``schema.is_plain_json``); the generated predicate calls it wherever the schema does not
    #: test a value by its exact type.
    is_plain: Callable[[Any, int], bool]


def generate_plain_check(schema: Any, plain: PlainJSON, compile_pattern: PatternCompiler = re.compile) -> Check | None:
    """For any schema ``compile_check`` takes: ``generate_check``'s predicate that also vouches,
    when it answers True, that the value is plain JSON data within ``plain``'s limits — what
    ``plain.is_plain(value, 0)`` says — so an argument check walks the value once. Values the
    schema tests by exact type get exact leaf tests (an ``int`` of at most ``max_int_bits`` bits, a
    finite ``float``, ``str`` keys, containers only below ``max_depth``); every other value
    (unlisted properties of an open object, untyped or annotation-only subschemas, ``items`` of
    ``{}``) is handed to ``plain.is_plain`` with its depth. None where ``compile_check`` gives
    None or the function cannot be generated (a schema nested past Python's block limit).
    False is no verdict."""
    if compile_check(schema, compile_pattern) is None:
        return None
    try:
        return _generate(schema, compile_pattern, plain, 0)
    except Exception:  # SyntaxError: too many statically nested blocks, or RecursionError
        return None


def _always(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


def _any_of(tests: list[Check]) -> Check:
    return lambda value: any(test(value) for test in tests)


def _all_of(tests: tuple[Check, ...]) -> Check:
    return lambda value: all(test(value) for test in tests)


def _one_of_strings(allowed: frozenset[str | None]) -> Check:
    return lambda value: (value is None or type(value) is str) and value in allowed


def _size(kind: type[str] | type[list[Any]], size: int, at_least: bool) -> Check:
    """``minLength``/``maxLength`` (kind ``str``) and ``minItems``/``maxItems`` (kind ``list``)."""
    if at_least:
        return lambda value: not isinstance(value, kind) or len(value) >= size
    return lambda value: not isinstance(value, kind) or len(value) <= size


def _matches(regex: CompiledPattern) -> Check:
    return lambda value: not isinstance(value, str) or regex.search(value) is not None


def _each_item(item: Check) -> Check:
    return lambda value: not isinstance(value, list) or all(item(i) for i in value)


def _compile(schema: Any, compile_pattern: PatternCompiler) -> Check | None:
    if schema is True or schema == {}:
        return _always
    if not isinstance(schema, dict) or not set(schema) <= _SUPPORTED or not _known_dialect(schema):
        return None
    checks: list[Check] = []

    kind = schema.get("type")
    if kind is not None:
        names = [kind] if isinstance(kind, str) else kind
        if not isinstance(names, list) or not all(n in _TYPE_CHECKS for n in names):
            return None
        tests = [_TYPE_CHECKS[n] for n in names]
        checks.append(tests[0] if len(tests) == 1 else _any_of(tests))

    if "enum" in schema or "const" in schema:
        # Equality in JSON Schema distinguishes 1 from True; Python's does not. Only compile
        # enums of strings and None, where the two agree.
        allowed = schema["enum"] if "enum" in schema else [schema["const"]]
        if not isinstance(allowed, list) or not all(a is None or type(a) is str for a in allowed):
            return None
        checks.append(_one_of_strings(frozenset(allowed)))

    for keyword, op in (("minimum", "ge"), ("maximum", "le"), ("exclusiveMinimum", "gt"),
                        ("exclusiveMaximum", "lt")):
        if keyword in schema:
            bound = schema[keyword]
            if not _is_number(bound):
                return None
            checks.append(_bound_check(op, bound))

    for keyword, kind_, at_least in (("minLength", str, True), ("maxLength", str, False),
                                     ("minItems", list, True), ("maxItems", list, False)):
        if keyword in schema:
            size = schema[keyword]
            if type(size) is not int:
                return None
            checks.append(_size(kind_, size, at_least))
    if "pattern" in schema:
        try:
            regex = compile_pattern(schema["pattern"])
        except Exception:  # the engine's own error type; jsonschema then decides (and reports)
            return None
        checks.append(_matches(regex))

    if "oneOf" in schema:
        one_of = _compile_one_of(schema["oneOf"], compile_pattern)
        if one_of is None:
            return None
        checks.append(one_of)

    if "items" in schema:
        item_check = _compile(schema["items"], compile_pattern)
        if item_check is None:
            return None
        checks.append(_each_item(item_check))

    object_check = _compile_object(schema, compile_pattern)
    if object_check is False:
        return None
    if object_check is not None and object_check is not True:
        checks.append(object_check)

    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    return _all_of(tuple(checks))


def _compile_one_of(branches: Any, compile_pattern: PatternCompiler) -> Check | None:
    """``oneOf`` whose branches have pairwise disjoint ``type``s (see the module's docstring), or None."""
    if not isinstance(branches, list) or not branches:
        return None
    seen: set[str] = set()
    tests: list[Check] = []
    for branch in branches:
        kind = branch.get("type") if isinstance(branch, dict) else None
        names = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()
        if not names or not all(isinstance(n, str) for n in names):
            return None
        if "integer" in names or "number" in names:
            names |= {"integer", "number"}  # jsonschema's integer is a number (1.0 included)
        if names & seen:
            return None
        seen |= names
        test = _compile(branch, compile_pattern)
        if test is None:
            return None
        tests.append(test)
    return tests[0] if len(tests) == 1 else _any_of(tests)


def _numeric(value: Any) -> bool:
    """Whether jsonschema treats ``value`` as a number (bounds apply to it)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bound_check(op: str, bound: float) -> Check:
    # Written exactly as jsonschema's keywords compare, so NaN behaves the same.
    if op == "ge":
        return lambda v: not _numeric(v) or not v < bound
    if op == "le":
        return lambda v: not _numeric(v) or not v > bound
    if op == "gt":
        return lambda v: not _numeric(v) or not v <= bound
    return lambda v: not _numeric(v) or not v >= bound


def _compile_object(schema: dict[str, Any], compile_pattern: PatternCompiler) -> Check | bool | None:
    """The object keywords' check; None when there are none, False when not compilable."""
    keys = {"properties", "required", "additionalProperties", "minProperties", "maxProperties"}
    if not keys & set(schema):
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list):
        return False
    if not all(type(r) is str for r in required):
        return False
    compiled: dict[str, Check] = {}
    for name, sub in properties.items():
        check = _compile(sub, compile_pattern)
        if check is None:
            return False
        compiled[name] = check
    extra_check: Check | None
    if extra is True:
        extra_check = None
    elif extra is False:
        extra_check = _never
    else:
        extra_check = _compile(extra, compile_pattern)
        if extra_check is None:
            return False
    min_props = schema.get("minProperties", 0)
    max_props = schema.get("maxProperties")
    if type(min_props) is not int or (max_props is not None and type(max_props) is not int):
        return False
    required_t = tuple(required)

    def check_object(value: Any) -> bool:
        if not isinstance(value, dict):
            return True  # object keywords do not apply to other types
        for name in required_t:
            if name not in value:
                return False
        if len(value) < min_props or (max_props is not None and len(value) > max_props):
            return False
        for name, item in value.items():
            sub = compiled.get(name)
            if sub is not None:
                if not sub(item):
                    return False
            elif extra_check is not None and not extra_check(item):
                return False
        return True

    return check_object


# -- one generated function per schema ------------------------------------------------------

#: The type tests of ``_TYPE_CHECKS`` as source, over a variable named by ``{}``.
_TYPE_SOURCE: Final = {
    "string": "type({0}) is str",
    "integer": "(type({0}) is int or (type({0}) is float and {0}.is_integer()))",
    "number": "(type({0}) is int or type({0}) is float)",
    "boolean": "type({0}) is bool",
    "null": "{0} is None",
    "object": "type({0}) is dict",
    "array": "type({0}) is list",
}
#: ``_TYPE_SOURCE`` for a plain predicate: numbers JSON and the host can carry (``{1}`` and
#: ``{2}``: -2**bits and 2**bits, both excluded, so an ``int`` of at most ``bits`` bits);
#: ``float.is_integer`` is already False for NaN and infinities.
_PLAIN_TYPE_SOURCE: Final = {
    **_TYPE_SOURCE,
    "integer": "((type({0}) is int and {1} < {0} < {2}) or (type({0}) is float and {0}.is_integer()))",
    "number": "((type({0}) is int and {1} < {0} < {2}) or (type({0}) is float and _isfinite({0})))",
}
#: For a value that passed the test of one type: which guard of a later keyword it already met
#: (the generated code then leaves the guard out).
_GUARDS_MET: Final = {"integer": "number", "number": "number", "string": "str", "array": "list", "object": "dict"}
#: What makes a value fail each bound (the negation of how jsonschema's keyword accepts it).
_BOUND_FAILS: Final = {"minimum": "<", "maximum": ">", "exclusiveMinimum": "<=", "exclusiveMaximum": ">="}
_NUMERIC_SOURCE: Final = "(isinstance({0}, (int, float)) and not isinstance({0}, bool))"
_MISSING: Final = object()


class _Source:
    """The lines of one generated predicate; every constant lives in ``names`` (the source holds
    only its own identifiers: nothing of a schema is ever spelled in the code)."""

    def __init__(self, compile_pattern: PatternCompiler, plain: PlainJSON | None = None) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"_MISSING": _MISSING, "_isfinite": math.isfinite}
        self.compile_pattern = compile_pattern
        #: Set for a plain predicate (``generate_plain_check``): its limits and its plain walk.
        self.plain = plain
        if plain is not None:
            self.names["_plain"] = plain.is_plain
        self._count = 0

    def type_test(self, kind: str, var: str, depth: int | None) -> str:
        """The test of one type; the plain predicate's exact one when ``depth`` (of ``var``) is given."""
        if self.plain is None or depth is None:
            return _TYPE_SOURCE[kind].format(var)
        if kind in ("object", "array") and depth >= self.plain.max_depth:
            return "False"  # a container this deep is not plain data
        # ``-2**b < i < 2**b`` is ``i.bit_length() <= b``, without a method call
        limit = 1 << self.plain.max_int_bits
        return _PLAIN_TYPE_SOURCE[kind].format(var, self.name(-limit), self.name(limit))

    def name(self, value: Any) -> str:
        self._count += 1
        identifier = f"_k{self._count}"
        self.names[identifier] = value
        return identifier

    def variable(self) -> str:
        self._count += 1
        return f"_v{self._count}"

    def fail_if(self, indent: int, condition: str) -> None:
        self.lines.append(" " * indent + f"if {condition}: return False")

    def fail_unless_plain(self, indent: int, var: str, depth: int, guard: str = "") -> None:
        """Return False unless ``var`` (at ``depth``) is plain JSON data: the host's own walk."""
        self.fail_if(indent, f"{guard}not _plain({var}, {depth})")


def _is_trivial(schema: Any) -> bool:
    """Whether ``schema`` accepts every value (``True``, or nothing but annotations)."""
    return schema is True or (isinstance(schema, dict) and set(schema) <= _ANNOTATIONS)


def _emit(out: _Source, schema: Any, var: str, indent: int, depth: int | None = None) -> None:
    """Append the statements that return False when ``var`` breaks ``schema`` (a schema ``_compile``
    accepted: the same keywords, tested in the same order, with the same comparisons).

    ``depth``, in a plain predicate, is where ``var`` sits in the whole value (the value itself at
    0), and means these statements must also return False unless ``var`` is plain JSON data: by
    exact type tests where the schema makes them, by ``_plain`` (the host's walk) elsewhere. None:
    a predicate of ``generate_check``, or a value the plain walk already vouched for."""
    if _is_trivial(schema):
        if depth is not None:
            out.fail_unless_plain(indent, var, depth)
        return
    kind = schema.get("type")
    names: list[str] | None = None if kind is None else [kind] if isinstance(kind, str) else kind
    # The depth at which this level's own tests must vouch for ``var`` (None: something else does).
    vouch = depth
    if depth is not None and ({"enum", "const", "oneOf"} & set(schema)):
        vouch = None  # a string or None, by exact test; or each branch a plain predicate of its own
    elif depth is not None and names is None:  # no test of its exact type: the plain walk vouches
        out.fail_unless_plain(indent, var, depth)
        vouch = None
    met = None  # the guard that one tested type already meets
    if names is not None:
        out.fail_if(indent, "not (" + " or ".join(out.type_test(n, var, vouch) for n in names) + ")")
        met = _GUARDS_MET.get(names[0]) if len(names) == 1 else None
    if "enum" in schema or "const" in schema:
        allowed = out.name(frozenset(schema["enum"] if "enum" in schema else [schema["const"]]))
        out.fail_if(indent, f"not (({var} is None or type({var}) is str) and {var} in {allowed})")
    for keyword, fails in _BOUND_FAILS.items():
        if keyword in schema:
            guard = "" if met == "number" else f"{_NUMERIC_SOURCE.format(var)} and "
            out.fail_if(indent, f"{guard}{var} {fails} {out.name(schema[keyword])}")
    for keyword, kind_, fails in (("minLength", "str", "<"), ("maxLength", "str", ">"),
                                  ("minItems", "list", "<"), ("maxItems", "list", ">")):
        if keyword in schema:
            guard = "" if met == kind_ else f"isinstance({var}, {kind_}) and "
            out.fail_if(indent, f"{guard}len({var}) {fails} {out.name(schema[keyword])}")
    if "pattern" in schema:
        regex = out.name(out.compile_pattern(schema["pattern"]))
        guard = "" if met == "str" else f"isinstance({var}, str) and "
        out.fail_if(indent, f"{guard}{regex}.search({var}) is None")
    if "oneOf" in schema:  # each branch a predicate of its own (disjoint types: any is one)
        plain = None if depth is None else out.plain
        branches = [out.name(_generate(branch, out.compile_pattern, plain, depth)) for branch in schema["oneOf"]]
        out.fail_if(indent, "not (" + " or ".join(f"{b}({var})" for b in branches) + ")")
    inner_depth = None if vouch is None else vouch + 1
    items = schema.get("items", True)
    if not _is_trivial(items):
        start = len(out.lines)
        item = out.variable()
        inner = _open_guard(out, indent, "list", met, var)
        out.lines.append(" " * inner + f"for {item} in {var}:")
        body = len(out.lines)
        _emit(out, items, item, inner + 1, inner_depth)
        if len(out.lines) == body:  # every item passes (its schema only annotates): no loop
            del out.lines[start:]
    elif vouch is not None and names is not None and "array" in names:  # a list nothing else walks
        out.fail_unless_plain(indent, var, vouch, "" if met == "list" else f"type({var}) is list and ")
    _emit_object(out, schema, var, indent, met, vouch, names)


def _open_guard(out: _Source, indent: int, kind: str, met: str | None, var: str) -> int:
    """Open ``if isinstance(var, kind):`` unless the type test already met it; the indent inside."""
    if met == kind:
        return indent
    out.lines.append(" " * indent + f"if isinstance({var}, {kind}):")
    return indent + 1


def _emit_object(out: _Source, schema: dict[str, Any], var: str, indent: int, met: str | None,
                 depth: int | None, names: list[str] | None) -> None:
    """The object keywords' statements; ``depth`` as in ``_emit`` (where set, ``names`` is the
    schema's ``type``)."""
    if not {"properties", "required", "additionalProperties", "minProperties", "maxProperties"} & set(schema):
        if depth is not None and names is not None and "object" in names:  # a dict nothing else walks
            out.fail_unless_plain(indent, var, depth, "" if met == "dict" else f"type({var}) is dict and ")
        return
    properties: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    inner = _open_guard(out, indent, "dict", met, var)
    start = len(out.lines)
    # ``name not in var`` may run a key's own ``__eq__`` (a ``str`` subclass hashing as the name),
    # which can change parts of the value already checked and then leave: a plain predicate looks
    # names up only after its walk has found every key an exact ``str`` (found by attack).
    required = [out.name(name) for name in schema.get("required", [])]
    if depth is None:
        _fail_if_missing(out, inner, var, required)
    min_props, max_props = schema.get("minProperties", 0), schema.get("maxProperties")
    if min_props:
        out.fail_if(inner, f"len({var}) < {out.name(min_props)}")
    if max_props is not None:
        out.fail_if(inner, f"len({var}) > {out.name(max_props)}")
    inner_depth = None if depth is None else depth + 1
    checked = {key: sub for key, sub in properties.items() if not _is_trivial(sub)}
    if extra is True and depth is not None and not checked:  # any key, any value: the plain walk
        out.fail_unless_plain(inner, var, depth)
    elif extra is True and depth is None:  # only the declared properties have checks: look each one up
        for key, sub in checked.items():
            item = out.variable()
            out.lines.append(" " * inner + f"{item} = {var}.get({out.name(key)}, _MISSING)")
            out.lines.append(" " * inner + f"if {item} is not _MISSING:")
            _emit_block(out, sub, item, inner + 1, inner_depth)
    else:  # every key is checked: walk the items once, each listed one by its schema
        # (a plain predicate's open object too, every other value by the plain walk: one loop with
        # an ``elif`` per name took 394 ns for {a, b} where a lookup per name and then a loop over
        # the keys took 474, and 757 against 1,057 with two unlisted properties more)
        key_var, item = out.variable(), out.variable()
        out.lines.append(" " * inner + f"for {key_var}, {item} in {var}.items():")
        if depth is not None:  # a key of another type could compare equal to a name
            out.fail_if(inner + 1, f"type({key_var}) is not str")
        listed = checked if extra is True else properties
        keyword = "if"
        for key, sub in listed.items():
            out.lines.append(" " * (inner + 1) + f"{keyword} {key_var} == {out.name(key)}:")
            _emit_block(out, sub, item, inner + 2, inner_depth)
            keyword = "elif"
        if listed:
            out.lines.append(" " * (inner + 1) + "else:")
        other = inner + 2 if listed else inner + 1
        if extra is False:
            out.lines.append(" " * other + "return False")
        else:  # ``additionalProperties``' schema; True in a plain predicate: the plain walk
            _emit_block(out, extra, item, other, inner_depth)
    if depth is not None:
        _fail_if_missing(out, inner, var, required)
    if len(out.lines) == start:
        out.lines.append(" " * inner + "pass")


def _fail_if_missing(out: _Source, indent: int, var: str, required: list[str]) -> None:
    """``required``: return False when ``var`` lacks a name (each already in ``out.names``)."""
    for name in required:
        out.fail_if(indent, f"{name} not in {var}")


def _emit_block(out: _Source, schema: Any, var: str, indent: int, depth: int | None) -> None:
    """``_emit`` as the body of a block: ``pass`` where it has no statement."""
    before = len(out.lines)
    _emit(out, schema, var, indent, depth)
    if len(out.lines) == before:
        out.lines.append(" " * indent + "pass")


def _generate(schema: Any, compile_pattern: PatternCompiler, plain: PlainJSON | None = None,
              depth: int | None = None) -> Check:
    """One Python function testing ``schema`` (``_compile`` must have accepted it); with
    ``plain`` and ``depth``, the plain predicate (``generate_plain_check``) of a value found at
    ``depth``."""
    out = _Source(compile_pattern, plain)
    _emit(out, schema, "value", 1, None if plain is None else depth)
    source = "def check(value):\n" + "\n".join([*out.lines, " return True"]) + "\n"
    namespace = dict(out.names)
    # The source holds only identifiers of ours; every value of the schema is in ``namespace``.
    exec(compile(source, "<amplifier_tools.schema_fastpath>", "exec"), namespace)
    check: Check = namespace["check"]
    return check
