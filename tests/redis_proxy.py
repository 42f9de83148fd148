"""A TCP proxy in front of a test's Redis server that loses replies on demand."""

from __future__ import annotations

import asyncio


class ReplyDropper:
    """A TCP proxy to Redis on 127.0.0.1 that, once armed, closes the client's connection instead
    of passing on each of the next ``armed`` replies: the server ran the command, its sender
    never hears of it."""

    def __init__(self, port: int) -> None:
        self.port = port
        #: How many of the next replies are lost.
        self.armed = 0
        #: How many bytes of a lost reply still reach the client before its connection closes (a
        #: link that drops in the middle of a reply).
        self.keep = 0
        #: Seconds each reply is held back (a store that is far away, or slow, but answers).
        self.delay = 0.0
        self.dropped = 0
        self.server: asyncio.Server | None = None
        self.sides: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.sides += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, replies: bool) -> None:
            try:
                while data := await source.read(65536):
                    if replies and self.armed:
                        self.armed -= 1
                        self.dropped += 1
                        if self.keep:
                            sink.write(data[:self.keep])
                            await sink.drain()
                        break  # the reply is lost: close the client's side
                    if replies and self.delay:
                        await asyncio.sleep(self.delay)
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for side in (writer, up_writer):
                    side.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for side in self.sides:
            side.close()
        await asyncio.sleep(0.05)  # the pipes see their ends and return
