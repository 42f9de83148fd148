"""Bounded output capture: the head and the tail of a stream, its byte count, an optional spill file.

Memory held per stream is at most ``limit`` bytes however much the command
prints: the first half of the budget keeps the head, a ring of the second half
keeps the tail, and everything in between is only counted (and, with a spill
file, written to disk as it arrives). Must never accumulate a whole stream.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, BinaryIO, Final

READ_CHUNK: Final = 256 * 1024


class StreamCapture:
    """Head + tail of one stream, bounded by ``limit`` bytes; counts the total."""

    __slots__ = ("head", "head_limit", "limit", "spill", "spill_path", "tail", "tail_limit", "total")

    def __init__(self, limit: int, spill_path: str | None = None) -> None:
        self.limit = limit
        self.head_limit = limit - limit // 2
        self.tail_limit = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.spill_path = spill_path
        self.spill: BinaryIO | None = open(spill_path, "xb") if spill_path else None  # noqa: SIM115

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.spill is not None:
            self.spill.write(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_limit:
            if len(chunk) >= self.tail_limit:
                self.tail[:] = chunk[-self.tail_limit:]
            else:
                self.tail += chunk
                excess = len(self.tail) - self.tail_limit
                if excess > 0:
                    del self.tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        """The kept bytes as text; a marker says how many bytes were left out in the middle."""
        head = self.head.decode("utf-8", "replace")
        if not self.truncated:
            return head + self.tail.decode("utf-8", "replace")
        omitted = self.total - len(self.head) - len(self.tail)
        where = f"; the full output is in {self.spill_path}" if self.spill_path else ""
        return (f"{head}\n[... {omitted} bytes omitted{where} ...]\n"
                + self.tail.decode("utf-8", "replace"))

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()
            self.spill = None

    def summary(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {name: self.text(), f"{name}_bytes": self.total, f"{name}_truncated": self.truncated}
        if self.spill_path:
            out[f"{name}_file"] = self.spill_path
        return out


async def pump(reader: asyncio.StreamReader, capture: StreamCapture) -> None:
    """Feed ``capture`` from ``reader`` until end of file, a chunk at a time."""
    while True:
        chunk = await reader.read(READ_CHUNK)
        if not chunk:
            return
        capture.feed(chunk)


def spill_paths(directory: str, call_id: str) -> tuple[str, str]:
    """Fresh file names for a call's stdout and stderr inside ``directory``."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in call_id)[:80] or "call"
    base = os.path.join(directory, f"bash-{safe}-{os.getpid()}")
    return base + ".stdout", base + ".stderr"
