"""``manage.py bench_ws_frames``: what Autobahn, under daphne, spends of the web process's CPU per WebSocket
frame it writes (a token frame) and per frame it reads (a client's ``resume``), in process, with its per-frame
debug-log helpers as Autobahn installs them and as ``chatsite/websocket_debug_args.py`` leaves them (lever 59),
the two variants alternated ``--rounds`` times. Each frame goes through a real ``WebSocketServerProtocol``
past its opening handshake, over Twisted's in-memory transport (no socket, so the figures are Autobahn's
Python alone). Prints median [min-max] over the rounds of µs of CPU (``time.thread_time``) per frame. A
benchmark that prints figures, not a test; docs/overhead-levers.md holds them.

    manage.py bench_ws_frames --rounds 5 --frames 20000
"""

from __future__ import annotations

import statistics
import time

from django.core.management.base import BaseCommand

from devtools.ws_frames import client_frame, open_socket

TOKEN_FRAME = b'{"type":"token","message_id":123456,"seq":17,"text":" world"}'
RESUME_FRAME = b'{"type":"resume","message_id":123456,"after_seq":16}'


class Command(BaseCommand):
    help = "Autobahn's CPU per WebSocket frame written and read, as installed and with lever 59."

    def add_arguments(self, parser):
        parser.add_argument("--rounds", type=int, default=5)
        parser.add_argument("--frames", type=int, default=20000, help="frames written and read per round")

    def handle(self, *args, rounds, frames, **options):
        import importlib

        import autobahn.util

        from chatsite import websocket_debug_args

        modules = [importlib.import_module(name) for name in websocket_debug_args.MODULES]
        helpers = [(m, h) for m in modules for h in websocket_debug_args.HELPERS]
        bound = {(m, h): getattr(m, h) for m, h in helpers}  # restored after the run

        def use(variant: str) -> None:
            if variant == "lever 59":
                websocket_debug_args.apply()  # what daphne's application does at start
            else:  # Autobahn's own helpers (autobahn.util), even where this process has applied lever 59
                for module, helper in helpers:
                    setattr(module, helper, getattr(autobahn.util, helper))

        protocol, transport = open_socket()
        masked = client_frame(RESUME_FRAME)
        figures: dict[str, dict[str, list[float]]] = {"as installed": {}, "lever 59": {}}
        try:
            for _ in range(rounds):
                for variant, figure in figures.items():
                    use(variant)
                    written, read = _round(protocol, transport, masked, frames)
                    figure.setdefault("written", []).append(written)
                    figure.setdefault("read", []).append(read)
        finally:
            for (module, helper), value in bound.items():
                setattr(module, helper, value)
        self.stdout.write(
            f"bench_ws_frames: {rounds} rounds x {frames} frames each way; load average "
            f"{open('/proc/loadavg').read()[:14]}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        self.stdout.write(
            "| Autobahn's debug helpers | token frame written, µs CPU | resume frame read, µs CPU |"
        )
        self.stdout.write("|---|---|---|")
        for variant, figure in figures.items():
            cells = [
                f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"
                for v in (figure["written"], figure["read"])
            ]
            self.stdout.write(f"| {variant} | {cells[0]} | {cells[1]} |")


def _round(protocol, transport, masked: bytes, frames: int) -> tuple[float, float]:
    """µs of CPU per frame written and per frame read, after 1,000 untimed of each."""
    for _ in range(1000):
        protocol.sendMessage(TOKEN_FRAME)
        protocol.dataReceived(masked)
    transport.clear()
    started = time.thread_time()
    for _ in range(frames):
        protocol.sendMessage(TOKEN_FRAME)
    written = (time.thread_time() - started) / frames * 1e6
    transport.clear()
    started = time.thread_time()
    for _ in range(frames):
        protocol.dataReceived(masked)
    read = (time.thread_time() - started) / frames * 1e6
    return written, read
