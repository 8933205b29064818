"""Make daphne close over-limit and non-UTF-8 WebSocket frames with a close code the browser can read.

Daphne's Autobahn factory enforces ``--websocket-max-message-size`` (1 MiB by default) and UTF-8 validity of
text frames, but Autobahn's server default ``failByDrop=True`` drops the TCP connection on those protocol
violations, so the browser sees 1006 and no reason. With ``failByDrop=False`` it performs the closing
handshake instead: **1009** ("message exceeds payload limit") for an oversized message and **1007** for a
text frame that is not valid UTF-8 (RFC 6455 section 7.4.1). Daphne exposes no option for it, hence this
small hook, applied from ``chatsite/asgi.py`` before daphne builds its factory.

A second hook lets the application close with the IANA-registered server codes **1012** (service restart),
**1013** (try again later: the chat consumer's answer while PostgreSQL or Redis is down,
``docs/websocket-protocol.md``) and **1014**. Autobahn's ``sendClose`` accepts only 1000 and 3000-4999 from
an application, so daphne turned ``close(code=1013)`` into an exception and closed with 1011 (internal
error); the close frame is sent through Autobahn's ``sendCloseFrame`` instead, which RFC 6455 allows.
"""

#: Server close codes from the IANA registry that Autobahn's application-level check refuses.
REGISTERED_SERVER_CODES = (1012, 1013, 1014)


def apply() -> None:
    """Default daphne's WebSocket factory to a closing handshake on protocol errors, and let the application
    close with 1012-1014 (idempotent)."""
    try:
        from daphne.ws_protocol import WebSocketFactory
    except ImportError:  # served by something other than daphne
        return
    if getattr(WebSocketFactory, "_chatsite_close_with_code", False):
        return
    reset = WebSocketFactory.resetProtocolOptions

    def reset_protocol_options(self):
        reset(self)
        self.failByDrop = False

    WebSocketFactory.resetProtocolOptions = reset_protocol_options
    WebSocketFactory._chatsite_close_with_code = True

    from daphne.ws_protocol import WebSocketProtocol

    server_close = WebSocketProtocol.serverClose

    def serverClose(self, code=None):  # noqa: N802 (daphne's name)
        if code in REGISTERED_SERVER_CODES:
            self.sendCloseFrame(code=code, isReply=False)
        else:
            server_close(self, code)

    WebSocketProtocol.serverClose = serverClose
