"""A stdio MCP server that goes mute (JSON-RPC by hand, no SDK): it answers ``initialize`` and
``tools/list``, then at its first ``tools/call`` closes its stdout (fd 1) and sleeps on, never
exiting, as a server whose output side broke would. Each start appends its pid to the file named
by ``MUTE_PID_FILE``, so a test sees the restarts and which process to look for.

Steered by environment variables (optional):

``MUTE_AFTER_LIST``  close stdout right after answering ``tools/list`` instead: mute while idle.
``MUTE_ONCE``        only the first process started goes mute; a restarted one answers ``echo``
                     with ``ok`` as a healthy server does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main() -> None:
    pid_file = os.environ["MUTE_PID_FILE"]
    first = not os.path.exists(pid_file)
    with open(pid_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    mute = first or not os.environ.get("MUTE_ONCE")
    after_list = bool(os.environ.get("MUTE_AFTER_LIST"))
    for line in sys.stdin:
        request = json.loads(line)
        method, rid = request.get("method"), request.get("id")
        if rid is None:
            continue
        if method == "tools/call" and mute and not after_list:
            sys.stdout.flush()
            os.close(1)
            while True:  # alive, its stdin still open, its stdout gone
                time.sleep(1)
        if method == "initialize":
            result: dict[str, Any] = {"protocolVersion": request["params"]["protocolVersion"],
                                      "capabilities": {"tools": {}}, "serverInfo": {"name": "mute", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "echo", "description": "echo", "inputSchema": {"type": "object"}}]}
        else:
            result = {"content": [{"type": "text", "text": "ok"}]}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + "\n")
        sys.stdout.flush()
        if method == "tools/list" and mute and after_list:
            os.close(1)
            while True:
                time.sleep(1)


if __name__ == "__main__":
    main()
