"""serve-mcp over stdio attacked as a hostile or sloppy client (raw pipes, no SDK client): what the
attack found, held.

- SIGTERM while a call ran killed the process outright: no audit record and no ``tool_complete``
  for the call, and its ``bash`` command's processes (``sandbox = "off"``) kept running.
- SIGINT while a call ran cancelled the call, then never exited: the SDK's stdin reader is a worker
  thread a cancellation waits for, blocked until the client writes a line or closes stdin.
- SIGTERM to a server whose client stopped reading stdout never exited either: the SDK's writer
  thread was blocked in ``write`` on the full pipe, and the cancellation waited for it.
- A client that closed its end of stdout (and kept stdin open) left the server running until it
  closed stdin too, then serve-mcp exited 1 with ``ExceptionGroup: unhandled errors in a TaskGroup``
  and "this is a bug"; now it ends as when the client closes stdin.

- A 30 MB line was read whole (no bound on a line from the client): now a line past
  ``[plugins.mcp.serve] max_message_bytes`` is read in pieces and dropped, answered -32600 (with
  its id when its first bytes tell it), a warning names the setting, and serving goes on.
- The SDK answered nothing to a line that is not JSON, a batch, or JSON that is no request (a
  client waited forever for the answer to a request it sent malformed): now -32700 / -32600, id
  null unless the request's id can be read, as JSON-RPC 2.0 asks.
- A request whose id is ``true``, ``1.0``, ``null``, an array or an object was read by the SDK as a
  notification: nothing ran and nothing was answered, and the client waited forever. Now -32600,
  id null.

- Two requests in flight with one id (the second sent before the first was answered): both ran
  and both answers came under that id, the client unable to tell which was which, and
  ``notifications/cancelled`` for the id cancelled the second. Now the second is answered -32600
  with its id at once and never runs (``7`` and ``"7"`` are one id, as the SDK correlates them);
  the first keeps its answer and its cancellation, and the id is free again once it is answered.

And what held (kept as regression guards): such lines, bytes that are not UTF-8 and a call before
``initialize`` (the SDK answers -32602) neither stop the server nor reach a tool; an unknown tool
is -32602 without an audit record; arguments that are no object are -32602; closing stdin with a
call in flight records the call once, as cancelled.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import REPO, alive, wait_dead

RUNNER = '''
import asyncio, json, sys
from amplifier_tools import ToolHost, hookimpl
from amplifier_tools.mcp.server import serve

class Completions:
    @hookimpl
    def tool_complete(self, result, context):
        with open(sys.argv[2], "a") as out:
            out.write(json.dumps([context.call_id, None if result.error is None else result.error["code"]]) + "\\n")

async def main():
    config = json.loads(sys.argv[1])
    async with ToolHost(config=config, plugins=[Completions()], builtins=["bash", "filesystem", "audit", "mcp"],
                        entry_points=False, discover=False) as host:
        await serve(host)

asyncio.run(main())
'''

INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "hostile", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


class Served:
    """One ``serve`` process on stdio, spoken to through raw pipes."""

    def __init__(self, tmp_path: Path, **serve: Any) -> None:
        root = tmp_path / "root"
        root.mkdir()
        (root / "hello.txt").write_text("hello\n")
        self.audit_path = tmp_path / "audit.jsonl"
        self.completions_path = tmp_path / "complete.jsonl"
        self.tmp_path = tmp_path
        config = {"working_dir": str(root), "state_dir": str(tmp_path / "state"),
                  "plugins": {"audit": {"path": str(self.audit_path)}, "bash": {"sandbox": "off"},
                              "mcp": {"serve": {"principal": "hostile", "tools": ["*"], **serve}}}}
        runner = tmp_path / "runner.py"
        runner.write_text(RUNNER)
        env = {"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "XDG_STATE_HOME": str(tmp_path / "xdg")}
        self.process = subprocess.Popen(
            [sys.executable, str(runner), json.dumps(config), str(self.completions_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
        self.buffer = b""

    def send(self, message: Any) -> None:
        line = message if isinstance(message, bytes) else json.dumps(message).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def receive(self, timeout: float = 20.0) -> dict[str, Any] | None:
        """The next message from the server, None when none came within ``timeout`` seconds."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def until_answer(self, request_id: int) -> list[dict[str, Any]]:
        """The messages from the server up to and with its answer to request ``request_id``."""
        messages = []
        while not messages or messages[-1].get("id") != request_id:
            message = self.receive()
            assert message is not None, f"no answer to request {request_id} after {messages}"
            messages.append(message)
        return messages

    def peak_rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM")

    def answer(self, request_id: int) -> dict[str, Any]:
        """The server's answer to request ``request_id`` (notifications before it are skipped)."""
        while True:
            message = self.receive()
            assert message is not None, f"no answer to request {request_id}"
            if message.get("id") == request_id:
                return message

    def initialize(self) -> None:
        self.send(INITIALIZE)
        assert "result" in self.answer(0)
        self.send(INITIALIZED)

    def call(self, request_id: int, tool: str, arguments: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                   "params": {"name": tool, "arguments": arguments}})

    def wait(self, timeout: float = 5.0) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"serve-mcp did not exit within {timeout} s") from None

    def audit(self) -> list[dict[str, Any]]:
        if not self.audit_path.exists():
            return []
        return [r for r in map(json.loads, self.audit_path.read_text().splitlines()) if r.get("kind") == "call"]

    def completions(self) -> list[list[Any]]:
        if not self.completions_path.exists():
            return []
        return [json.loads(line) for line in self.completions_path.read_text().splitlines()]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def served(tmp_path: Path) -> Any:
    server = Served(tmp_path)
    yield server
    server.close()


def wait_for(path: Path, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.02)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_call_cancels_the_call_records_it_once_ends_its_processes_and_exits(
        served: Served, signum: signal.Signals) -> None:
    served.initialize()
    child = served.tmp_path / "child.pid"
    served.call(1, "bash", {"command": f"sleep 60 & echo $! > {child}; wait"})
    wait_for(child)
    started = time.monotonic()
    served.process.send_signal(signum)
    assert served.wait() == 0
    assert time.monotonic() - started < 5
    assert wait_dead(int(child.read_text()), 2.0), "the command's process outlived serve-mcp"
    records = served.audit()
    assert [(r["tool"], r["status"], r["error"]["code"]) for r in records] == [("local::bash", "error", "cancelled")]
    assert served.completions() == [[records[0]["call_id"], "cancelled"]]


def test_a_signalled_server_whose_client_stopped_reading_stdout_still_exits(served: Served) -> None:
    served.initialize()
    (served.tmp_path / "root" / "big.txt").write_text(("x" * 200 + "\n") * 3000)
    for request_id in range(1, 6):  # answers of ≈ 600 KB each nobody reads: the pipe (64 KB) fills
        served.call(request_id, "fs_read_file", {"path": "big.txt"})
    deadline = time.monotonic() + 15
    while len(served.completions()) < 5:
        assert time.monotonic() < deadline, "the calls did not finish"
        time.sleep(0.05)
    served.process.send_signal(signal.SIGTERM)
    assert served.wait() == 0
    assert len(served.audit()) == 5 and len(served.completions()) == 5


def test_closing_stdin_mid_call_records_the_call_once_and_exits(served: Served) -> None:
    served.initialize()
    child = served.tmp_path / "child.pid"
    served.call(1, "bash", {"command": f"sleep 60 & echo $! > {child}; wait"})
    wait_for(child)
    assert served.process.stdin is not None
    served.process.stdin.close()
    assert served.wait() == 0
    assert not alive(int(child.read_text())) or wait_dead(int(child.read_text()), 2.0)
    assert [(r["status"], r["error"]["code"]) for r in served.audit()] == [("error", "cancelled")]
    assert [code for _, code in served.completions()] == ["cancelled"]


def test_a_client_that_closes_stdout_ends_the_serving_as_closing_stdin_does(served: Served) -> None:
    served.initialize()
    child = served.tmp_path / "child.pid"
    served.call(1, "bash", {"command": "echo quick"})
    served.call(2, "bash", {"command": f"sleep 60 & echo $! > {child}; wait"})
    wait_for(child)
    assert served.process.stdout is not None
    served.process.stdout.close()  # the answer to 3 cannot be written: the client is gone
    served.call(3, "bash", {"command": "echo after"})
    assert served.wait() == 0
    assert "bug" not in served.process.stderr.read().decode()  # type: ignore[union-attr]
    assert wait_dead(int(child.read_text()), 2.0)
    records = served.audit()
    assert len(records) == len({r["call_id"] for r in records}) >= 2
    assert sorted(r["call_id"] for r in records) == sorted(call_id for call_id, _ in served.completions())
    assert [r["error"]["code"] for r in records if r["arguments"]["command"].startswith("sleep")] == ["cancelled"]


def test_hostile_lines_neither_stop_the_server_nor_reach_a_tool(served: Served) -> None:
    served.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                 "params": {"name": "fs_read_file", "arguments": {"path": "hello.txt"}}})  # before initialize
    assert "error" in served.answer(7)  # the SDK's -32602: it does not run
    served.initialize()
    for line in (b"not json", b'[{"jsonrpc": "2.0", "id": 8, "method": "ping"}]', b"\xff\xfe{\x80}",
                 b'{"jsonrpc": "2.0", "id": 9}', b"{}"):
        served.send(line)
    served.call(10, "nosuch", {})
    assert served.answer(10)["error"]["code"] == -32602
    served.call(11, "fs_read_file", ["hello.txt"])
    assert served.answer(11)["error"]["code"] == -32602
    served.call(12, "fs_read_file", {"path": "hello.txt"})
    ok = served.answer(12)["result"]
    assert not ok["isError"] and "hello" in ok["content"][0]["text"]
    assert served.process.stdin is not None
    served.process.stdin.close()
    assert served.wait() == 0
    # the one call that ran has its audit record and its tool_complete; the refused ones have none
    (record,) = served.audit()
    assert (record["tool"], record["status"], record["principal"]) == ("local::fs.read_file", "ok", "hostile")
    assert served.completions() == [[record["call_id"], None]]


def errors(messages: list[dict[str, Any]]) -> list[tuple[Any, int]]:
    return [(m["id"], m["error"]["code"]) for m in messages if "error" in m]


def test_a_line_past_max_message_bytes_is_dropped_unread_answered_and_serving_goes_on(tmp_path: Path) -> None:
    served = Served(tmp_path, max_message_bytes=65536)
    try:
        served.initialize()
        served.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        served.answer(1)
        before = served.peak_rss_kib()
        huge = "x" * 20_000_000
        served.call(5, "fs_read_file", {"path": huge})  # the SDK's clients write the id first
        served.send({"params": {"name": "fs_read_file", "arguments": {"path": huge}}, "id": 6,
                     "jsonrpc": "2.0", "method": "tools/call"})  # the id after the params: unknown
        served.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
        messages = served.until_answer(7)
        assert errors(messages) == [(5, -32600), (None, -32600)]
        assert "65536 bytes" in messages[0]["error"]["message"]
        assert "fs_read_file" in [tool["name"] for tool in messages[-1]["result"]["tools"]]
        assert served.peak_rss_kib() - before < 8 * 1024, "the server held the 20 MB line"
        assert served.process.stdin is not None
        served.process.stdin.close()
        assert served.wait() == 0
        stderr = served.process.stderr.read().decode()  # type: ignore[union-attr]
        assert "plugins.mcp.serve.max_message_bytes (65536)" in stderr and "dropped unparsed" in stderr
        assert served.audit() == []  # neither call ran
    finally:
        served.close()


def test_lines_that_are_no_request_are_answered_as_json_rpc_2_asks(served: Served) -> None:
    served.initialize()
    for line in (b"not json", b'[{"jsonrpc": "2.0", "id": 8, "method": "ping"}]', b"[]", b'"ping"',
                 b'{"jsonrpc": "2.0", "id": 9}', b'{"jsonrpc": "2.0", "id": 10, "method": "tools/list", "params": 1}',
                 b'{"jsonrpc": "1.0", "id": "eleven", "method": "ping"}', b'{"jsonrpc": "2.0", "method": 5}',
                 b"   ",  # a blank line: no message, no answer
                 b'{"jsonrpc": "2.0", "id": 12, "result": 5}'):  # a response, even malformed, is never answered
        served.send(line)
    served.send({"jsonrpc": "2.0", "id": 13, "method": "tools/list"})
    messages = served.until_answer(13)
    assert errors(messages) == [(None, -32700), (None, -32600), (None, -32600), (None, -32600), (9, -32600),
                                (10, -32600), ("eleven", -32600), (None, -32600)]
    assert "batch" in messages[1]["error"]["message"]
    assert messages[-1]["result"]["tools"]


def test_a_request_whose_id_is_no_string_or_integer_is_answered_and_never_runs(served: Served) -> None:
    """Found by attack: the SDK read a request whose id is ``true``, ``1.0``, ``null``, an array or
    an object as a notification (its model takes any extra member), so it ran nothing and answered
    nothing, and a client (``1.0`` is a JSON-RPC id) waited forever. Now -32600 with id null, as
    JSON-RPC 2.0 asks of an id it cannot tell (MCP: an id is a string or an integer, never null),
    as an over-long line with such an id already was."""
    served.initialize()
    ran = served.tmp_path / "ran"
    for rid in (True, False, 1.0, 1.5, None, [1], {"id": 1}):
        served.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                     "params": {"name": "bash", "arguments": {"command": f"echo ran >> {ran}"}}})
    served.send(b'{"jsonrpc": "2.0", "id": 1e400, "method": "ping"}')  # past a float's range
    served.send(b'{"jsonrpc": "2.0", "\\u0069d": true, "method": "ping"}')  # the key escaped
    served.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}})  # no id
    served.send({"jsonrpc": "2.0", "id": 13, "method": "ping"})
    messages = served.until_answer(13)
    assert errors(messages) == [(None, -32600)] * 9
    assert "string or an integer" in messages[0]["error"]["message"]
    assert messages[-1] == {"jsonrpc": "2.0", "id": 13, "result": {}}
    assert served.process.stdin is not None
    served.process.stdin.close()
    assert served.wait() == 0
    assert not ran.exists() and served.audit() == []


@pytest.mark.parametrize(("head", "request_id"), [
    (b'{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"arguments": {"pa', 5),
    (b' {"id":"a\\"b","params":{"x', 'a"b'),
    (b'{"params": {"id": 3, "x": "', None),  # an id inside params is not the request's
    (b'{"jsonrpc": "2.0", "id": true, "method": "x', None),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "x', None),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "x', None),
    (b'{"jsonrpc": "2.0", "method": "x', None),
])
def test_the_id_of_an_over_long_line_is_read_only_from_members_before_any_nested_value(
        head: bytes, request_id: Any) -> None:
    from amplifier_tools.mcp.server import id_in_head

    assert id_in_head(head) == request_id


def test_an_over_long_response_from_the_client_is_dropped_unanswered(tmp_path: Path) -> None:
    """Found by review: an over-long line that is a response (the client answering a request of the
    server's, ids written first as the SDK writes them) was answered -32600 with its id, which the
    client could take for the answer to its own request of that id (ids of the two sides overlap),
    where a response the server can read, or a malformed one, is never answered."""
    served = Served(tmp_path, max_message_bytes=65536)
    try:
        served.initialize()
        big = "x" * 100_000
        served.send({"jsonrpc": "2.0", "id": 3, "result": {"content": [{"type": "text", "text": big}]}})
        served.send({"jsonrpc": "2.0", "id": 4, "error": {"code": -1, "message": big}})
        served.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": big}})  # a request
        served.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
        messages = served.until_answer(7)
        assert errors(messages) == [(5, -32600)]
    finally:
        served.close()


@pytest.mark.parametrize(("head", "response"), [
    (b'{"jsonrpc": "2.0", "id": 5, "result": {"content": [{"te', True),
    (b'{"jsonrpc": "2.0", "id": 5, "error": {"code": 1, "message": "x', True),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"result": 1, "x', False),
    (b'{"jsonrpc": "2.0", "id": 5, "params": {"result": {"x', False),
    (b'[{"jsonrpc": "2.0", "id": 5, "result": {"x', False),
])
def test_a_response_is_told_from_an_over_long_lines_first_members(head: bytes, response: bool) -> None:
    from amplifier_tools.mcp.server import response_in_head

    assert response_in_head(head) is response


def test_an_id_that_cannot_be_written_back_gets_an_answer_with_id_null(tmp_path: Path) -> None:
    """Found by review: a malformed or over-long line whose id is a string with a lone surrogate
    (``"\\udfff"``: JSON's grammar allows it, UTF-8 cannot carry it) made writing its -32600 answer
    raise, which ended the serving: the client got no answer to anything after it. Such an id is
    unknown (null), as any other the answer cannot carry. (The SDK's parser refuses a line holding
    one as no JSON: -32700.)"""
    served = Served(tmp_path, max_message_bytes=65536)
    try:
        served.initialize()
        served.send(b'{"jsonrpc": "2.0", "id": "\\ud800", "method": 5}')
        served.send(b'{"jsonrpc": "2.0", "id": "\\udfff", "method": "tools/call", "params": {"name": "'
                    + b"x" * 100_000 + b'"}}')
        served.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
        messages = served.until_answer(7)
        assert errors(messages) == [(None, -32700), (None, -32600)]
        assert "fs_read_file" in [tool["name"] for tool in messages[-1]["result"]["tools"]]
    finally:
        served.close()


def result_text(message: dict[str, Any]) -> str:
    return json.loads(message["result"]["content"][0]["text"])["stdout"]  # type: ignore[no-any-return]


def test_a_request_with_the_id_of_one_in_flight_is_refused_at_once_and_the_first_keeps_its_answer(
        served: Served) -> None:
    served.initialize()
    ran = served.tmp_path / "ran"
    served.call(5, "bash", {"command": f"sleep 1; echo first; echo first >> {ran}"})
    served.call(5, "bash", {"command": f"echo second >> {ran}"})  # before the first is answered
    served.call("5", "bash", {"command": f"echo third >> {ran}"})  # the same id to the SDK
    refused = [served.receive(), served.receive()]
    assert [(m["id"], m["error"]["code"]) for m in refused if m is not None] == [(5, -32600), ("5", -32600)]
    assert "already in use" in refused[0]["error"]["message"]  # type: ignore[index]
    first = served.answer(5)
    assert result_text(first) == "first\n"
    assert served.receive(timeout=0.5) is None  # nothing more under id 5
    served.call(5, "bash", {"command": "echo again"})  # answered: the id is free again
    assert result_text(served.answer(5)) == "again\n"
    assert served.process.stdin is not None
    served.process.stdin.close()
    assert served.wait() == 0
    assert ran.read_text() == "first\n"
    assert [r["arguments"]["command"] for r in served.audit()] == [
        f"sleep 1; echo first; echo first >> {ran}", "echo again"]
    assert "with the id of one still in flight" in served.process.stderr.read().decode()  # type: ignore[union-attr]


def test_a_cancellation_of_a_duplicated_id_cancels_the_call_in_flight_and_frees_the_id(served: Served) -> None:
    served.initialize()
    child = served.tmp_path / "child.pid"
    served.call(5, "bash", {"command": f"sleep 60 & echo $! > {child}; wait"})
    wait_for(child)
    served.call(5, "bash", {"command": "echo second"})
    assert served.answer(5)["error"]["code"] == -32600
    served.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}})
    assert wait_dead(int(child.read_text()), 5.0)
    deadline = time.monotonic() + 10
    while True:  # the id is in use until the cancelled call has settled
        served.call(5, "bash", {"command": "echo after"})
        answer = served.answer(5)
        if "result" in answer:
            break
        assert answer["error"]["code"] == -32600 and time.monotonic() < deadline
        time.sleep(0.05)
    assert result_text(answer) == "after\n"
    assert served.process.stdin is not None
    served.process.stdin.close()
    assert served.wait() == 0
    assert [(r["arguments"]["command"], r["status"]) for r in served.audit()] == [
        (f"sleep 60 & echo $! > {child}; wait", "error"), ("echo after", "ok")]


def test_a_cancellation_naming_no_request_in_flight_cancels_nothing_and_one_id_may_serve_call_after_call(
        served: Served) -> None:
    served.initialize()
    served.call(1, "bash", {"command": "sleep 0.5; echo slow"})
    for rid in (2, "1x", 99):  # never sent, or not this call's
        served.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid}})
    assert result_text(served.answer(1)) == "slow\n"
    for n in range(20):  # as clients that send every request with id 1 do, one after the other
        served.call(1, "bash", {"command": f"echo {n}"})
        assert result_text(served.answer(1)) == f"{n}\n"
