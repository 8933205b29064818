"""Make daphne close over-limit and non-UTF-8 WebSocket frames with a close code the browser can read.

Daphne's Autobahn factory enforces ``--websocket-max-message-size`` (1 MiB by default) and UTF-8 validity of
text frames, but Autobahn's server default ``failByDrop=True`` drops the TCP connection on those protocol
violations, so the browser sees 1006 and no reason. With ``failByDrop=False`` it performs the closing
handshake instead: **1009** ("message exceeds payload limit") for an oversized message and **1007** for a
text frame that is not valid UTF-8 (RFC 6455 section 7.4.1). Daphne exposes no option for it, hence this
small hook, applied from ``chatsite/asgi.py`` before daphne builds its factory.
"""


def apply() -> None:
    """Default daphne's WebSocket factory to a closing handshake on protocol errors (idempotent)."""
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
