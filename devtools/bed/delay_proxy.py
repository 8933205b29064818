"""A TCP proxy that delays every byte by a set time in each direction: the bed's stand-in for ``tc netem
delay`` on a kernel without the netem queueing discipline (docs/scale-out.md).

``python -m devtools.bed.delay_proxy --listen 127.0.0.1:5673 --upstream 10.231.0.2:5672 --delay-file F``
accepts connections on ``--listen`` and opens one to ``--upstream`` for each. What one side sends reaches
the other ``delay`` seconds after the proxy read it, in order (each direction is a FIFO of timestamped
chunks), so a request and its answer cross the link with twice the delay added, as with netem on both
ends. ``F`` holds the delay in milliseconds (missing or empty: 0); it is read again every 0.2 s, so a
drill switches the delay on and off without touching the connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

CHUNK = 65536
#: Seconds the proxy waits for the upstream to accept before closing the client's connection.
CONNECT_TIMEOUT_S = 5.0
POLL_S = 0.2


class Delay:
    """The current delay in seconds, read from ``path`` (milliseconds as text) every ``POLL_S`` by
    :meth:`follow`; a value that does not parse counts as 0 (a drill writing the file mid-read)."""

    def __init__(self, path: Path | None, seconds: float = 0.0):
        self.path, self.seconds = path, seconds

    def read(self) -> None:
        if self.path is None:
            return
        try:
            self.seconds = max(0.0, float(self.path.read_text().strip() or 0) / 1000)
        except (OSError, ValueError):
            self.seconds = 0.0

    async def follow(self) -> None:
        while True:
            self.read()
            await asyncio.sleep(POLL_S)


async def _carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay) -> None:
    """Copy ``reader`` to ``writer``, each chunk written ``delay.seconds`` after it was read; returns when
    ``reader`` ends (after writing what it had) or either side fails."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(CHUNK):
            queue.put_nowait((loop.time() + delay.seconds, data))
            if sender.done():
                break
        queue.put_nowait((loop.time() + delay.seconds, b""))
        await sender
    except (ConnectionError, OSError):
        pass
    finally:
        sender.cancel()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


def handler(upstream: tuple[str, int], delay: Delay):
    """The connection callback for ``asyncio.start_server``: one upstream connection per client, both
    closed when either direction ends (AMQP, PostgreSQL and Redis do not half-close)."""

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*upstream), CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError):
            await _close(client_w)
            return
        directions = [
            asyncio.create_task(_carry(client_r, up_w, delay)),
            asyncio.create_task(_carry(up_r, client_w, delay)),
        ]
        await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
        for task in directions:
            task.cancel()
        await asyncio.gather(_close(up_w), _close(client_w))

    return serve


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host, int(port)


async def serve_forever(listen: tuple[str, int], upstream: tuple[str, int], delay: Delay) -> None:
    server = await asyncio.start_server(handler(upstream, delay), *listen)
    follower = asyncio.create_task(delay.follow())
    try:
        async with server:
            await server.serve_forever()
    finally:
        follower.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devtools.bed.delay_proxy", description=__doc__)
    parser.add_argument("--listen", type=_addr, required=True, help="HOST:PORT to accept on")
    parser.add_argument("--upstream", type=_addr, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-file", type=Path, help="file holding the delay in ms (default: 0)")
    args = parser.parse_args(argv)
    asyncio.run(serve_forever(args.listen, args.upstream, Delay(args.delay_file)))


if __name__ == "__main__":
    main()
