"""``manage.py bench_burst``: the admission phase of a burst of page sends, and what it costs in CPU.

``--clients`` sockets (the ``bench_overhead`` users, memory off) are opened, then each sends one ``send``
frame at the same moment; the phase ends when every socket has its ``queued`` ticket (the reply admitted,
stored and dispatched). Each round prints the time from the burst to the tickets (p50, p99, last) and the CPU
the web process (the one listening on ``--origin``'s port) and PostgreSQL (every ``postgres`` process)
used during the phase, per send. The replies then stream to their end before the next round.

What it is for: at 32 clients the added TTFT of ``bench_overhead`` is mostly this phase (docs/overhead.md,
"The 32-client burst"). Its CPU per send against ``--clients 1`` says whether a lever cuts work or only moves
it. A benchmark that prints figures, not a test.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from urllib.parse import urlsplit

import psutil
from django.core.management.base import BaseCommand, CommandError

from devtools import overhead_bench as bench
from devtools.reply_stages import percentile


def listening_pid(port: int) -> int:
    """The pid of the process listening on TCP ``port``. Raises ``CommandError`` when none is found."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    raise CommandError(f"no process listens on port {port}: start the stack (make run) or pass --web-pid")


def cpu_s(processes: list[psutil.Process]) -> float:
    """CPU seconds ``processes`` ran so far, all their threads (those that ended count 0): the scheduler's
    nanosecond run times (``/proc/PID/task/TID/schedstat``) where the kernel has them, else user + system time
    in clock ticks (10 ms), too coarse for one send. A thread that ends between two readings takes its time
    since the first with it: measure servers whose threads are pools, as daphne's and PostgreSQL's are."""
    total = 0.0
    for proc in processes:
        tasks = f"/proc/{proc.pid}/task"
        # No schedstat in this kernel (or the process ended): its user + system time.
        if not os.path.exists(f"/proc/{proc.pid}/schedstat"):
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
            continue
        try:
            tids = os.listdir(tasks)
        except FileNotFoundError:  # the process ended
            continue
        # A thread that ends between the listing and its read counts 0, as one that ended before: never the
        # process's tick total, which holds its ended threads too and would jump between two readings.
        total += sum(_schedstat_ns(f"{tasks}/{tid}/schedstat") for tid in tids) / 1e9
    return total


def _schedstat_ns(path: str) -> int:
    """The run time in ns that the kernel's ``schedstat`` file at ``path`` holds; 0 where the thread ended."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def postgres_processes() -> list[psutil.Process]:
    """Every process named ``postgres`` on this machine (the server and its backends)."""
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "postgres"]


async def _ticket(ws, prompt: str, started: float) -> float:
    """Send ``prompt`` and wait for its ``queued`` ticket: ms since ``started``. Raises ``CommandError`` when
    the send is refused."""
    await ws.send(json.dumps({"type": "send", "content": prompt, "client_id": str(uuid.uuid4())}))
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if frame["type"] == "error":
            raise CommandError(f"a send was refused: {frame.get('code')}: {frame.get('message')}")
        if frame["type"] == "queued":
            return (time.perf_counter() - started) * 1000


async def _drain(ws) -> None:
    """Read the reply to its end, so the next round starts with an idle engine."""
    while json.loads(await asyncio.wait_for(ws.recv(), 300))["type"] not in ("done", "error"):
        pass


async def burst(cookies: list[str], url: str, origin: str, web: psutil.Process) -> dict:
    """One burst: the sockets opened (not timed), one ``send`` each at once. Returns the tickets' times (ms)
    and the web process's and PostgreSQL's CPU (ms) from the burst to the last ticket."""
    sockets = await bench.open_sockets(cookies, url, origin)
    try:
        postgres = postgres_processes()
        web_before, pg_before = cpu_s([web]), cpu_s(postgres)
        started = time.perf_counter()
        tickets = await asyncio.gather(
            *(_ticket(ws, bench.PROMPTS[i % len(bench.PROMPTS)], started) for i, ws in enumerate(sockets))
        )
        web_ms, pg_ms = 1000 * (cpu_s([web]) - web_before), 1000 * (cpu_s(postgres) - pg_before)
        await asyncio.gather(*(_drain(ws) for ws in sockets))
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return {"tickets": list(tickets), "web_ms": web_ms, "postgres_ms": pg_ms}


class Command(BaseCommand):
    help = (
        "A burst of page sends: send -> queued ticket, and the web process's and PostgreSQL's CPU per send."
    )

    def add_arguments(self, parser):
        parser.add_argument("--origin", default="http://127.0.0.1:8000")
        parser.add_argument("--clients", type=int, default=32)
        parser.add_argument("--rounds", type=int, default=5)
        parser.add_argument("--max-tokens", type=int, default=32, help="reply length (1: the burst alone)")
        parser.add_argument("--web-pid", type=int, help="default: the process listening on the origin's port")

    def handle(self, *args, **o):
        from django.conf import settings

        from devtools.bench_figures import median_range
        from devtools.management.commands.bench_overhead import Command as OverheadBench

        if o["clients"] < 1 or o["rounds"] < 1:
            raise CommandError("--clients and --rounds must be >= 1")
        origin = o["origin"].rstrip("/")
        url = origin.replace("http", "ws", 1) + "/ws/chat/"
        web = psutil.Process(o["web_pid"] or listening_pid(urlsplit(origin).port or 80))
        prepare = OverheadBench(stdout=self.stdout, stderr=self.stderr)
        rows = []
        with prepare.signed_in(o["clients"], o["max_tokens"]) as cookies:
            asyncio.run(burst(cookies[:1], url, origin, web))  # warm-up: not counted
            for _ in range(o["rounds"]):
                # The web process counts its recent admissions as queued for 2 * ADMISSION_LOAD_CACHE_S + 1 s
                # (conversations.load.note_admitted): each burst meets an empty queue, as the first one did.
                time.sleep(2 * settings.ADMISSION_LOAD_CACHE_S + 1)
                rows.append(asyncio.run(burst(cookies, url, origin, web)))
        n = o["clients"]
        w = self.stdout.write
        w(
            f"bench_burst: {n} sends at once, {o['rounds']} rounds; web pid {web.pid}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        w("| round | send -> queued p50 ms | p99 | last | web CPU ms per send | PostgreSQL CPU ms per send |")
        w("|---|---:|---:|---:|---:|---:|")
        for i, r in enumerate(rows, 1):
            t = r["tickets"]
            w(
                f"| {i} | {percentile(t, 50):.1f} | {percentile(t, 99):.1f} | {max(t):.1f} | "
                f"{r['web_ms'] / n:.2f} | {r['postgres_ms'] / n:.2f} |"
            )

        def med(values):
            return median_range(values, "{:.1f}")

        w(
            f"median [min-max]: queued p50 {med([percentile(r['tickets'], 50) for r in rows])} ms, last "
            f"{med([max(r['tickets']) for r in rows])} ms, web CPU per send {med([r['web_ms'] / n for r in rows])}"
            f" ms, PostgreSQL CPU per send {med([r['postgres_ms'] / n for r in rows])} ms"
        )
