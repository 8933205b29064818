"""Autobahn's per-frame debug-log arguments, left unformatted (docs/overhead-levers.md, lever 59).

Daphne speaks WebSocket through Autobahn, which logs every write (``WebSocketProtocol.sendData``: each frame
the chat consumer sends, every token of every reply) and every read (``WebSocketServerProtocol.dataReceived``
in ``autobahn/twisted/websocket.py``: each client frame) at debug level. The log line's arguments are built
before the call, ``func=hltype(self.sendData), peer=hlval(self.peer), data_len=hlval(len(data))``, each
styled with ANSI colours through ``click.style`` when click is installed (Celery installs it), whether or not
debug logging is on: txaio swaps a disabled level's method for a no-op, but Python has evaluated the
arguments by then. Measured on 2 vCPUs of an AMD EPYC Zen 3 (2026-12-07): a token frame's write through
Autobahn took 7.3 µs of CPU with them and 2.6 µs without, a client frame's read 28-32 µs against 19-22, and
in a 32-client page wave they were 2.8 % of daphne's GIL-held samples.

:func:`apply` rebinds those helpers, in the two Autobahn modules that call them per frame, to a function
that returns its argument as it is: a debug line, if someone turns Autobahn's debug log on, still names the
method, the peer and the byte count (through ``str()`` when the line is written), only without colours.
"""

#: The Autobahn modules whose per-frame debug calls build their arguments with ``hltype``/``hlval``.
MODULES = ("autobahn.websocket.protocol", "autobahn.twisted.websocket")
#: The helpers rebound in each of :data:`MODULES`.
HELPERS = ("hltype", "hlval")


def as_is(value, *args, **kwargs):
    """``value`` itself: what ``hltype(obj)`` and ``hlval(val, color=..., bold=...)`` return once
    :func:`apply` has run (their styling arguments are ignored)."""
    return value


def apply() -> None:
    """Rebind ``hltype`` and ``hlval`` to :func:`as_is` in each of :data:`MODULES` that is importable and
    still has them (idempotent; a newer Autobahn that drops a helper is left as it is)."""
    import importlib

    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # served by something other than daphne
            continue
        for helper in HELPERS:
            if callable(getattr(module, helper, None)):
                setattr(module, helper, as_is)
