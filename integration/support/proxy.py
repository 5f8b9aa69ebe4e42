"""A loopback TCP relay in front of a nats-server, for tests that cut or stall connections."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["TcpProxy"]


class TcpProxy:
    """A loopback TCP relay in front of the server whose connections a test can cut or stall.

    ``cut_after`` cuts every connection once that many bytes have gone from the server to
    clients, which lands the cut inside a large initial snapshot. ``hold(n)`` relays only the
    server's first n reads on each connection and keeps the rest back until ``release()``,
    which leaves a client waiting at one step of its handshake; ``holding`` is set then.
    ``pace(size, pause)`` makes the link slow, as a throttled or lossy one is: from then on the
    server's bytes reach clients ``size`` at a time, ``pause`` seconds apart.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.downstream = 0
        self.cut_after: int | None = None
        self.cuts = 0
        self.hold_after: int | None = None
        self.pace_size: int | None = None
        self.pace_pause = 0.0
        self.holding = asyncio.Event()
        self._released = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"nats://127.0.0.1:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, downstream=False)),
            asyncio.create_task(self._pump(up_reader, writer, downstream=True)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for w in (writer, up_writer):
            w.transport.abort()
            self._writers.discard(w)
        self._tasks.difference_update(pumps)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, downstream: bool
    ) -> None:
        relayed = 0
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await reader.read(65536):
                if downstream and self.hold_after is not None and relayed >= self.hold_after:
                    released = self._released
                    self.holding.set()
                    await released.wait()
                relayed += 1
                if downstream and self.pace_size is not None:
                    await self._paced(writer, chunk)
                else:
                    writer.write(chunk)
                    await writer.drain()
                if downstream:
                    self.downstream += len(chunk)
                    if self.cut_after is not None and self.downstream >= self.cut_after:
                        self.cut_after = None
                        self.cut()

    async def _paced(self, writer: asyncio.StreamWriter, chunk: bytes) -> None:
        while chunk:
            size = self.pace_size or len(chunk)
            writer.write(chunk[:size])
            await writer.drain()
            chunk = chunk[size:]
            if self.pace_size is not None:
                await asyncio.sleep(self.pace_pause)

    def pace(self, size: int | None, pause: float = 0.0) -> None:
        """Relay the server's bytes ``size`` at a time, ``pause`` s apart (``None``: at once)."""
        self.pace_size = size
        self.pace_pause = pause

    def hold(self, after: int) -> None:
        """From now on, relay only the server's first ``after`` reads on each connection."""
        self.hold_after = after
        self.holding.clear()
        self._released = asyncio.Event()

    def release(self) -> None:
        """Relay what was kept back, and everything after it."""
        self.hold_after = None
        self._released.set()

    def cut(self) -> None:
        """Drop every relayed connection at once, as a failing network would."""
        self.cuts += 1
        for writer in list(self._writers):
            writer.transport.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
