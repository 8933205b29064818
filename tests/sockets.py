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


async def reply_frame(ws: WebsocketCommunicator, timeout: float = 1) -> dict:
    """The next frame on ``ws`` past tab-sync ``conversation`` frames: the pub/sub channel layer hands a
    group's message to the sockets in the group when the daphne receives it, so a tab that joined its
    user's group a moment after a change may still get that change's frame (harmless: the page reloads its
    sidebar entry)."""
    while (frame := await ws.receive_json_from(timeout=timeout))["type"] == "conversation":
        pass
    return frame
