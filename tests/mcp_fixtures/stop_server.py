"""A stdio MCP server for the stop-path tests (JSON-RPC by hand, no SDK): it ignores the end of its
stdin, so only signals stop it.

Steered by environment variables (all optional):

``STOP_TERM_FILE``  on SIGTERM, appends ``term``, works ``STOP_TERM_WORK`` seconds (default 0.3),
                    appends ``done`` and exits 0: the file shows whether it got SIGTERM and its grace.
``STOP_BEAT_FILE``  at start, a child in a session of its own that ignores SIGTERM appends a line
                    there every 20 ms until it is killed.
``STOP_HANG_INIT``  when set, never answers ``initialize``.

Tools: ``echo`` (returns ``ok``); ``crash`` exits at once (status 3), its child left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

BEAT = ("import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True:\n"
        "    with open(sys.argv[1], 'a') as f:\n"
        "        f.write('beat\\n')\n"
        "    time.sleep(0.02)\n")


def on_term(signum: int, frame: Any) -> None:
    path = os.environ["STOP_TERM_FILE"]
    with open(path, "a") as f:
        f.write("term\n")
    time.sleep(float(os.environ.get("STOP_TERM_WORK", "0.3")))
    with open(path, "a") as f:
        f.write("done\n")
    os._exit(0)


def main() -> None:
    if os.environ.get("STOP_TERM_FILE"):
        signal.signal(signal.SIGTERM, on_term)
    if os.environ.get("STOP_BEAT_FILE"):
        subprocess.Popen([sys.executable, "-c", BEAT, os.environ["STOP_BEAT_FILE"]], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for line in sys.stdin:
        request = json.loads(line)
        method, rid = request.get("method"), request.get("id")
        if rid is None or (method == "initialize" and os.environ.get("STOP_HANG_INIT")):
            continue
        if method == "initialize":
            result: dict[str, Any] = {"protocolVersion": request["params"]["protocolVersion"],
                                      "capabilities": {"tools": {}}, "serverInfo": {"name": "stop", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": name, "description": name, "inputSchema": {"type": "object"}}
                                for name in ("echo", "crash")]}
        elif request["params"]["name"] == "crash":
            os._exit(3)
        else:
            result = {"content": [{"type": "text", "text": "ok"}]}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + "\n")
        sys.stdout.flush()
    while True:  # stdin closed: keep running, as a server that ignores EOF does
        time.sleep(1)


if __name__ == "__main__":
    main()
