"""A ``$ref`` is resolved inside the schema only: one to a URI the host would have to fetch (an
imported MCP server's ``"$ref": "http://169.254.169.254/..."``) or to nothing at all is refused at
mount, naming the pointer, and no validation ever fetches anything."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_helpers import hostile

from amplifier_tools import ToolResult, ToolSpec
from amplifier_tools.conformance import check_target_async
from amplifier_tools.errors import ContractError
from amplifier_tools.schema import compile_validator


@pytest.fixture
def web() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server answering every GET with ``{"type": "integer"}``; the paths it was asked for."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = json.dumps({"type": "integer"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/latest/meta-data/", hits
    finally:
        server.shutdown()
        server.server_close()


def test_a_remote_ref_is_refused_at_mount_and_never_fetched(web: tuple[str, list[str]]) -> None:
    url, hits = web
    schema = {"type": "object", "properties": {"q": {"$ref": url}}}
    with pytest.raises(ContractError, match="/properties/q/\\$ref"):
        compile_validator(schema, owner="x::t", which="input_schema")
    assert hits == []


def test_validation_never_fetches_a_remote_ref(web: tuple[str, list[str]]) -> None:
    url, hits = web
    validator = compile_validator({"type": "object"}, owner="x::t", which="input_schema")
    validator = type(validator)({"type": "object", "properties": {"q": {"$ref": url}}})  # past the mount check
    with pytest.raises(Exception, match="Unresolvable"):
        validator.is_valid({"q": "x"})
    assert hits == []


async def test_an_mcp_servers_remote_ref_makes_no_request(tmp_path: Path, web: tuple[str, list[str]]) -> None:
    url, hits = web
    tool = {"name": "lookup", "description": "Look up.",
            "inputSchema": {"type": "object", "properties": {"q": {"$ref": url}}}}
    host = hostile(tmp_path, tools=[tool])
    try:
        async with host:
            await host.call("mcp::h::lookup", {"q": "x"})
    except Exception as exc:  # refused at mount, like any invalid schema of the server's
        assert "$ref" in str(exc)
    assert hits == []


def test_local_refs_still_resolve() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}, "n": {"$ref": "#/$defs/N"}},
              "$defs": {"A": {"type": "integer"}, "N": {"type": "object", "properties": {"c": {"$ref": "#/$defs/N"}}}},
              "default": {"$ref": "not a reference, data"}}
    validator = compile_validator(schema, owner="x::t", which="input_schema")
    assert validator.is_valid({"a": 1, "n": {"c": {}}}) and not validator.is_valid({"a": "one"})


async def test_conformance_fails_a_tool_whose_ref_resolves_to_nothing() -> None:
    class Dangling:
        spec = ToolSpec(name="local::x.y", version="1.0.0", description="Dangling.", effect="Pure",
                        input_schema={"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}},
                        examples=[{"input": {"n": 1}, "output": 1}])  # type: ignore[list-item]
        name, description = spec.name, spec.description

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output=1)

    report = await check_target_async(Dangling())  # raised _WrappedReferencingError instead of reporting
    assert not report.ok and "#/$defs/N" in report.render()


def _chained(levels: int) -> dict[str, Any]:
    """Definitions each referring to the one before twice: 2 ** levels values written out."""
    defs: dict[str, Any] = {"D0": {"type": "string"}}
    for level in range(1, levels + 1):
        below = {"$ref": f"#/$defs/D{level - 1}"}
        defs[f"D{level}"] = {"type": "object", "properties": {"left": below, "right": dict(below)}}
    return {"type": "object", "properties": {"x": {"$ref": f"#/$defs/D{levels}"}}, "$defs": defs}


def test_a_schema_whose_refs_expand_exponentially_is_refused_at_mount() -> None:
    """Found by attack: such a schema mounted, and LangChain's ``convert_to_openai_tool`` (what
    ``bind_tools`` calls) wrote its references out: 18 levels took 4.75 s and 8.6 MB, each level
    doubling; a hostile MCP server's tool would hang the agent."""
    from amplifier_tools.schema import MAX_EXPANDED_VALUES

    with pytest.raises(ContractError, match=f"more than {MAX_EXPANDED_VALUES:,} values with its \\$refs written out"):
        compile_validator(_chained(18), owner="x::t", which="input_schema")
    assert compile_validator(_chained(8), owner="x::t", which="input_schema").is_valid({"x": {}})


def test_a_recursive_schema_is_not_an_expansion() -> None:
    tree = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}}}
    validator = compile_validator(tree, owner="x::t", which="input_schema")
    assert validator.is_valid({"name": "a", "children": [{"name": "b", "children": []}]})
