"""``manage.py bench_connect``: what opening chat sockets costs the web process, as a reconnect storm after a
deploy or a network blip opens them.

``--sockets`` sockets of the ``bench_overhead`` users (``--users`` of them, their sessions reused round robin)
are opened one after another as fast as the handshakes complete; each round prints the wall time of the
whole storm and the CPU the web process (the one listening on ``--origin``'s port) and PostgreSQL used in it,
per socket; the sockets are then closed. Every socket runs the handshake's user lookup, the consumer's
``connect`` (the user's group joined, the admission warmer told) and daphne's WebSocket upgrade. A benchmark
that prints figures, not a test (docs/overhead-levers.md, lever 57).
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import psutil
from django.core.management.base import BaseCommand, CommandError

from devtools import overhead_bench as bench
from devtools.management.commands.bench_burst import cpu_s, listening_pid, postgres_processes


async def storm(cookies: list[str], url: str, origin: str, web: psutil.Process) -> dict:
    """Open a socket per cookie (one after another), then close them. Returns the storm's wall time (ms) and
    the web process's and PostgreSQL's CPU (ms) from the first handshake to the last socket open."""
    postgres = postgres_processes()
    web_before, pg_before = cpu_s([web]), cpu_s(postgres)
    started = time.perf_counter()
    sockets = await bench.open_sockets(cookies, url, origin)
    wall_ms = 1000 * (time.perf_counter() - started)
    web_ms, pg_ms = 1000 * (cpu_s([web]) - web_before), 1000 * (cpu_s(postgres) - pg_before)
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return {"wall_ms": wall_ms, "web_ms": web_ms, "postgres_ms": pg_ms}


class Command(BaseCommand):
    help = "A storm of chat sockets opened: wall time, and the web process's and PostgreSQL's CPU per socket."

    def add_arguments(self, parser):
        parser.add_argument("--origin", default="http://127.0.0.1:8000")
        parser.add_argument("--sockets", type=int, default=200, help="sockets opened per round")
        parser.add_argument("--users", type=int, default=32, help="distinct signed-in users among them")
        parser.add_argument("--rounds", type=int, default=5)
        parser.add_argument("--web-pid", type=int, help="default: the process listening on the origin's port")

    def handle(self, *args, **o):
        from devtools.bench_figures import median_range
        from devtools.management.commands.bench_overhead import Command as OverheadBench

        if min(o["sockets"], o["users"], o["rounds"]) < 1:
            raise CommandError("--sockets, --users and --rounds must be >= 1")
        origin = o["origin"].rstrip("/")
        url = origin.replace("http", "ws", 1) + "/ws/chat/"
        web = psutil.Process(o["web_pid"] or listening_pid(urlsplit(origin).port or 80))
        prepare = OverheadBench(stdout=self.stdout, stderr=self.stderr)
        rows = []
        with prepare.signed_in(o["users"], 32) as users:
            cookies = [users[i % len(users)] for i in range(o["sockets"])]
            asyncio.run(storm(cookies[:8], url, origin, web))  # warm-up: not counted
            for _ in range(o["rounds"]):
                time.sleep(1.5)  # the last storm's closes and the warmer's passes over them are done
                rows.append(asyncio.run(storm(cookies, url, origin, web)))
        n = o["sockets"]
        w = self.stdout.write
        w(
            f"bench_connect: {n} sockets of {o['users']} users opened one after another, {o['rounds']} rounds; "
            f"web pid {web.pid}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        w("| round | wall ms | web CPU ms per socket | PostgreSQL CPU ms per socket |")
        w("|---|---:|---:|---:|")
        for i, r in enumerate(rows, 1):
            w(f"| {i} | {r['wall_ms']:.0f} | {r['web_ms'] / n:.2f} | {r['postgres_ms'] / n:.2f} |")

        def med(values):
            return median_range(values, "{:.2f}")

        w(
            f"median [min-max]: wall {median_range([r['wall_ms'] for r in rows])} ms, web CPU per socket "
            f"{med([r['web_ms'] / n for r in rows])} ms, PostgreSQL CPU per socket "
            f"{med([r['postgres_ms'] / n for r in rows])} ms"
        )
