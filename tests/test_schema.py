"""Schema checks at mount: which schemas are checked against their metaschema, and when."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import amplifier_tools
from amplifier_tools import ContractError, ToolHost
from amplifier_tools._checked_schemas import BUILTIN_SCHEMA_DIGESTS
from amplifier_tools.schema import compile_validator, schema_digest


async def test_the_builtin_schemas_pass_their_metaschema_and_are_the_ones_listed_as_checked(tmp_path: Path) -> None:
    """The host skips the metaschema check for the digests in ``_checked_schemas``: this test is that check."""
    async with ToolHost(entry_points=False, discover=False, working_dir=tmp_path) as host:
        schemas = {f"{m.spec.name} {which}": schema for m in host.tools
                   for which, schema in (("input_schema", m.spec.input_schema),
                                         ("output_schema", m.spec.output_schema)) if schema is not None}
    assert len(schemas) >= 14
    for schema in schemas.values():
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    digests = {label: schema_digest(schema) for label, schema in schemas.items()}
    listing = "".join(f'    "{digest}",  # {label}\n' for label, digest in sorted(digests.items(), key=lambda i: i[0]))
    assert set(digests.values()) == BUILTIN_SCHEMA_DIGESTS, (
        f"a built-in schema changed: set BUILTIN_SCHEMA_DIGESTS in amplifier_tools/_checked_schemas.py to\n"
        f"frozenset({{\n{listing}}})")


def test_the_digest_ignores_key_order_and_layout_only() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    reordered = {"properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "type": "object"}
    assert schema_digest(schema) == schema_digest(reordered)
    assert schema_digest(schema) != schema_digest({**schema, "required": ["a"]})
    assert schema_digest({"minimum": 1}) != schema_digest({"minimum": 1.0}) != schema_digest({"minimum": True})


@pytest.mark.parametrize("schema", [
    {"type": "object", "required": ("a",)},  # json writes a tuple as a list; jsonschema wants a list
    {"type": "object", "properties": {1: {"type": "string"}}},  # json writes the key as "1"
    {"minimum": math.nan},
    {"minimum": math.inf},
    {"enum": [object()]},
    {"const": {"a"}},
])
def test_a_schema_that_is_not_plain_json_has_no_digest(schema: dict[str, Any]) -> None:
    assert schema_digest(schema) is None


def test_a_cyclic_schema_has_no_digest() -> None:
    schema: dict[str, Any] = {"type": "object"}
    schema["properties"] = {"self": schema}
    assert schema_digest(schema) is None


def test_a_schema_unlike_a_checked_one_is_checked_even_when_json_writes_it_alike() -> None:
    """A tuple where the metaschema wants an array: refused, though its JSON is a valid schema's."""
    valid = {"type": "object", "required": ["a"]}
    compile_validator(valid, owner="t", which="input_schema")  # checked, and remembered
    with pytest.raises(ContractError) as caught:
        compile_validator({"type": "object", "required": ("a",)}, owner="t", which="input_schema")
    assert caught.value.code == "invalid_schema"
    assert "not a valid JSON Schema at /required" in caught.value.message


def test_an_invalid_schema_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(ContractError, match="not a valid JSON Schema at /type"):
            compile_validator({"type": "objekt"}, owner="t", which="input_schema")


def test_a_host_with_the_builtins_alone_starts_without_importing_jsonschema(tmp_path: Path) -> None:
    """Start-up time (bench/bench_cli.py): the built-ins' schemas are known valid and compile to the fast
    path, and no configuration means none to validate, so jsonschema is not imported until a call needs it."""
    code = ("import asyncio, sys\n"
            "from amplifier_tools import ToolHost\n"
            "async def main():\n"
            "    async with ToolHost(entry_points=False, discover=False) as host:\n"
            "        assert len(host.tools) >= 7\n"
            "        print('after start:', 'jsonschema' in sys.modules)\n"
            "        result = await host.call('local::fs.list_dir', {'path': 1})\n"
            "        print('after a bad call:', result.error['code'], 'jsonschema' in sys.modules)\n"
            "asyncio.run(main())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(Path(amplifier_tools.__file__).parent.parent)})
    assert out.stdout.splitlines() == ["after start: False", "after a bad call: invalid_input True"], out.stderr
