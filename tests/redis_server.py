"""A throwaway ``redis-server`` for tests: 127.0.0.1, a free port, a temp dir, no persistence.

``RedisServer(tmp).start()`` waits until it answers ``PING``; ``stop()`` terminates it (and
``start()`` again brings it back on the same port). When ``redis-server`` is missing the
tests fail with how to install it, or skip when not running under CI (``CI`` unset): CI must
never skip them silently.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

INSTALL = "install it: apt-get install redis-server (Debian/Ubuntu), brew install redis (macOS)"


def require_redis_server() -> str:
    """The path of ``redis-server``; fails (under CI) or skips (elsewhere) when it is missing."""
    found = shutil.which("redis-server")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"redis-server is not installed and CI is set; {INSTALL}")
        pytest.skip(f"redis-server is not installed; {INSTALL}")
    try:
        import redis  # noqa: F401
    except ImportError:
        message = "the redis client is not installed: pip install 'amplifier-tools[redis]'"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path, *, unix: bool = False) -> None:
        self.binary = require_redis_server()
        self.directory = directory
        self.port = free_port()
        self.socket = str(directory / "redis.sock") if unix else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0" if self.socket else f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--save", "", "--appendonly", "no", "--protected-mode", "yes",
             *(["--unixsocket", self.socket, "--unixsocketperm", "700"] if self.socket else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None
