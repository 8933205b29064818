"""WebSocket test clients for the chat consumer (``channels.testing.WebsocketCommunicator`` over the real ASGI
application, so the origin check, session auth and the real Redis channel layer all run)."""

from channels.testing import WebsocketCommunicator

from chatsite.asgi import application

ORIGIN = b"http://127.0.0.1:8000"


def connect(cookie: str | None = None, origin: bytes = ORIGIN) -> WebsocketCommunicator:
    """A communicator for ``/ws/chat/`` with ``cookie`` (``"sessionid=…"``, or none: anonymous) and ``origin``;
    not connected yet."""
    headers = [(b"origin", origin), (b"host", b"127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, "/ws/chat/", headers=headers)


async def open_socket(cookie: str) -> WebsocketCommunicator:
    """A connected socket of the session in ``cookie``; fails the test when the handshake is refused."""
    communicator = connect(cookie)
    connected, _ = await communicator.connect()
    assert connected
    return communicator
