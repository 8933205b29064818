"""A bare HTTP/1.1 client for the benchmarks' API path: the request's bytes written at once on one kept asyncio
connection (``asyncio.open_connection``), the chunked ``text/event-stream`` body read and split into events with
no HTTP or SSE library. It is the least work a client can do per request, so a TTFT taken through it is the
server's; set beside the ``openai`` SDK's (``httpx`` underneath), the difference is the client library's own
work on the same CPUs (``manage.py bench_api_client``, ``manage.py bench_overhead``'s bare rows).

Only what the product's ``/v1/chat/completions`` answers is handled: a ``Content-Length`` or chunked body, and
``Connection: close`` (the next request reconnects, untimed).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator


def completion_body(model: str, prompt: str, max_tokens: int) -> dict:
    """The benchmarks' streamed, stored chat completion of one user turn ``prompt``, as the JSON body of
    ``POST /v1/chat/completions`` (and as the openai SDK's ``chat.completions.create`` keyword arguments)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "store": True,
    }


def first_choice(event: dict) -> dict:
    """A ``chat.completion.chunk`` event's first choice, ``{}`` when it has none (the usage chunk)."""
    return (event.get("choices") or [{}])[0]


class BareHttpConnection:
    """One kept connection to ``origin`` (``http://host:port``); :meth:`open` before timing, :meth:`close`
    after. Not safe for two requests at once: one connection per concurrent stream."""

    def __init__(self, origin: str):
        host_port = origin.split("://", 1)[1].rstrip("/")
        self.host, _, port = host_port.partition(":")
        self.port = int(port or 80)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        """Connect unless a connection the server has not closed is already open."""
        if self.writer is not None and self.reader is not None and not self.reader.at_eof():
            return
        await self.close()
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def post_events(self, path: str, key: str, payload: dict) -> AsyncIterator[dict]:
        """POST ``payload`` as JSON with ``Authorization: Bearer key``; yields each ``data:`` event's JSON
        object as its chunk arrives (``[DONE]`` ends the iteration). Raises ``RuntimeError`` for a status
        other than 200 (its body in the message), ``asyncio.IncompleteReadError`` if the server hangs up
        mid-response."""
        await self.open()
        body = json.dumps(payload).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        headers = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        status = int(headers.split(" ", 2)[1])
        closes = "connection: close" in headers
        try:
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {(await self._whole_body(headers))[:300]!r}")
            pending = b""
            async for data in self._chunks(headers):
                pending += data
                while b"\n\n" in pending:
                    event, pending = pending.split(b"\n\n", 1)
                    if event.startswith(b"data: {"):
                        yield json.loads(event[6:])
        finally:
            if closes:
                await self.close()

    async def _chunks(self, headers: str) -> AsyncIterator[bytes]:
        if "transfer-encoding: chunked" not in headers:
            yield await self._whole_body(headers)
            return
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await self.reader.readexactly(size + 2)  # the chunk and its CRLF
            if size == 0:
                return
            yield data[:-2]

    async def _whole_body(self, headers: str) -> bytes:
        if "transfer-encoding: chunked" in headers:
            return b"".join([c async for c in self._chunks(headers)])
        length = next(
            (
                int(line.split(":", 1)[1])
                for line in headers.split("\r\n")
                if line.startswith("content-length:")
            ),
            0,
        )
        return await self.reader.readexactly(length)
