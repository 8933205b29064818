"""Driving Django's real ASGI handler as a server does, for the API tests that watch a request's life."""


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
