"""Driving Django's real ASGI handler as a server does, for the API tests that watch a request's life."""

import asyncio
import json


def completion_scope(key: str, payload: bytes) -> dict:
    """The ASGI ``http`` scope of ``POST /v1/chat/completions`` carrying ``payload`` (a JSON body) with the
    API key ``key``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }


def completion_call(key: str, body: dict) -> tuple[dict, asyncio.Queue]:
    """``(scope, inbox)`` for ``POST /v1/chat/completions`` of ``body`` (JSON-encoded) with API key ``key``:
    the inbox holds the whole request already; a test adds ``http.disconnect`` to leave."""
    payload = json.dumps(body).encode()
    inbox: asyncio.Queue = asyncio.Queue()
    inbox.put_nowait({"type": "http.request", "body": payload, "more_body": False})
    return completion_scope(key, payload), inbox
