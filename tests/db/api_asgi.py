"""Driving Django's real ASGI handler as a server does, for the API tests that watch a request's life."""

import asyncio
import json


def http_scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    """The ASGI ``http`` scope of ``method path`` from a local client, with ``headers`` after ``Host``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }


async def asgi_messages(app, scope: dict, body: bytes = b"") -> list[dict]:
    """Every message ``app`` sends for one whole request of ``scope`` and ``body``, in order (the inbox holds
    the request's body at once, as a server hands it over)."""
    inbox: asyncio.Queue = asyncio.Queue()
    inbox.put_nowait({"type": "http.request", "body": body, "more_body": False})
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await app(scope, inbox.get, send)
    return sent


def completion_scope(key: str, payload: bytes) -> dict:
    """The ASGI ``http`` scope of ``POST /v1/chat/completions`` carrying ``payload`` (a JSON body) with the
    API key ``key``."""
    return http_scope(
        "POST",
        "/v1/chat/completions",
        [
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ],
    )


def completion_call(key: str, body: dict) -> tuple[dict, asyncio.Queue]:
    """``(scope, inbox)`` for ``POST /v1/chat/completions`` of ``body`` (JSON-encoded) with API key ``key``:
    the inbox holds the whole request already; a test adds ``http.disconnect`` to leave."""
    payload = json.dumps(body).encode()
    inbox: asyncio.Queue = asyncio.Queue()
    inbox.put_nowait({"type": "http.request", "body": payload, "more_body": False})
    return completion_scope(key, payload), inbox


async def completion_opened_and_left(key: str, body: dict) -> int:
    """``POST /v1/chat/completions`` of ``body`` with API key ``key`` through Django's real ASGI handler, the
    client leaving as soon as the response starts; returns the response's status."""
    from django.core.handlers.asgi import ASGIHandler

    scope, inbox = completion_call(key, body)
    seen: dict = {}

    async def send(message):
        if message["type"] == "http.response.start":
            seen["status"] = message["status"]
            inbox.put_nowait({"type": "http.disconnect"})

    await asyncio.wait_for(ASGIHandler()(scope, inbox.get, send), timeout=20)
    return seen["status"]
