"""A quirky stdio MCP server for the protocol attack tests, speaking JSON-RPC by hand (no SDK).

It answers ``initialize``, ``tools/list`` and ``tools/call``; each tool breaks the protocol in
one way while answering a call:

``ask``        sends the request ``method`` (``sampling/createMessage``, ``roots/list``,
               ``elicitation/create``, ``ping``) to the client, waits for its answer and returns
               that answer as JSON text.
``stray``      first sends a result for an id never sent, then the real result.
``dup``        sends its result twice.
``raw_reply``  writes each line of ``before`` as it is, then answers with ``reply`` (a JSON
               object) as the whole message, its ``id`` set.
``late``       answers after ``ms`` milliseconds (the host may have given up and cancelled).
``echo``       returns ``{"text": ...}`` as structured content.
``ping_cancel`` sends ``count`` ``ping`` requests, each followed by a ``notifications/cancelled``
               for an id the client never had, then never reads again (nor answers).

``QUIRKY_TOOLS`` (JSON list) adds tool definitions to list (each answers as ``echo``);
``QUIRKY_LIST_FILE`` names a file that, when present, holds the JSON list to send for every
later ``tools/list`` instead (a definition that changes between starts).
``QUIRKY_LOG`` names a file every message the client sent is appended to (one JSON line each).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {"name": name, "description": f"The {name} quirk.",
     "inputSchema": {"type": "object", "additionalProperties": True}}
    for name in ("ask", "stray", "dup", "raw_reply", "late", "echo", "ping_cancel")
]


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def note(message: dict[str, Any]) -> None:
    path = os.environ.get("QUIRKY_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(message) + "\n")


def read() -> dict[str, Any] | None:
    while True:
        line = sys.stdin.readline()
        if not line:
            return None
        if line.strip():
            message: dict[str, Any] = json.loads(line)
            note(message)
            return message


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], "isError": False}


def tools() -> list[dict[str, Any]]:
    path = os.environ.get("QUIRKY_LIST_FILE")
    if path and os.path.exists(path):
        with open(path) as f:
            listed: list[dict[str, Any]] = json.load(f)
        return listed
    return TOOLS + json.loads(os.environ.get("QUIRKY_TOOLS", "[]"))


def call(rid: Any, name: str, arguments: dict[str, Any]) -> None:
    if name == "ask":
        send({"jsonrpc": "2.0", "id": "s-1", "method": arguments["method"], "params": arguments.get("params", {})})
        while True:
            answer = read()
            if answer is None:
                return
            if answer.get("id") == "s-1" and "method" not in answer:
                break
        send({"jsonrpc": "2.0", "id": rid, "result": text(json.dumps(answer))})
    elif name == "stray":
        send({"jsonrpc": "2.0", "id": 987654, "result": text("for nobody")})
        send({"jsonrpc": "2.0", "id": rid, "result": text("real")})
    elif name == "dup":
        send({"jsonrpc": "2.0", "id": rid, "result": text("first")})
        send({"jsonrpc": "2.0", "id": rid, "result": text("second")})
    elif name == "raw_reply":
        for line in arguments.get("before", []):
            sys.stdout.write(line + "\n")
        send({**arguments["reply"], "jsonrpc": "2.0", "id": rid})
    elif name == "ping_cancel":
        for number in range(int(arguments.get("count", 0))):
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": f"ping-{number}", "method": "ping"}) + "\n")
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                         "params": {"requestId": f"nobody-{number}"}}) + "\n")
        sys.stdout.flush()
        while True:
            time.sleep(1)
    elif name == "late":
        time.sleep(int(arguments.get("ms", 0)) / 1000)
        send({"jsonrpc": "2.0", "id": rid, "result": text("late")})
    else:
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "content": [{"type": "text", "text": str(arguments.get("text", ""))}],
            "structuredContent": {"text": arguments.get("text", "")}}})


def main() -> None:
    while True:
        request = read()
        if request is None:
            return
        method, rid = request.get("method"), request.get("id")
        if rid is None or method is None:
            continue  # a notification, or an answer nobody waits for
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "quirky", "version": "1.0.0"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools()}})
        elif method == "tools/call":
            call(rid, request["params"]["name"], request["params"].get("arguments") or {})
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no such method"}})


if __name__ == "__main__":
    main()
