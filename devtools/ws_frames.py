"""An Autobahn WebSocket server protocol without a network, for timing and testing what daphne's WebSocket
layer does per frame (``manage.py bench_ws_frames``, ``tests/unit/test_websocket_debug_args.py``)."""

from __future__ import annotations

from collections.abc import Callable

HANDSHAKE = (
    b"GET /ws/chat/ HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def open_socket(on_message: Callable[[bytes], None] | None = None):
    """``(protocol, transport)``: an Autobahn ``WebSocketServerProtocol`` (daphne's base class) past its opening
    handshake over Twisted's in-memory ``StringTransport``, whose ``value()`` holds the bytes written since the
    handshake; ``on_message(payload)`` gets each message the protocol reads. Raises ``RuntimeError`` when the
    handshake does not complete."""
    from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
    from twisted.internet.testing import StringTransport

    class Server(WebSocketServerProtocol):
        def onMessage(self, payload, isBinary):  # noqa: N802 (Autobahn's name)
            if on_message is not None:
                on_message(payload)

    factory = WebSocketServerFactory("ws://127.0.0.1:8000")
    factory.protocol = Server
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(HANDSHAKE)
    if protocol.state != protocol.STATE_OPEN:
        raise RuntimeError("the opening handshake did not complete")
    transport.clear()
    return protocol, transport


def client_frame(payload: bytes) -> bytes:
    """One masked text frame as a browser sends it (RFC 6455 section 5.2); ``payload`` under 126 bytes."""
    if len(payload) > 125:
        raise ValueError("a payload of 126 bytes or more needs an extended length")
    mask = b"\x11\x22\x33\x44"
    return bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
