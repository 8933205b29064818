"""``manage.py bench_send_ab``: two web processes (two checkouts of the product, or two settings) behind the same
database, broker and workers, compared send by send: one socket to each, their ``send`` frames alternated so
that drift of a shared machine's load hits both alike. Per origin: send -> ``queued`` frame (admission and
the transaction as a page sees them), send -> first token frame, and the added TTFT (that minus the engine's
own TTFT for the reply, the ``done`` frame's ``ttft_ms``, as ``bench_overhead`` counts it), p50/p99 (ms) per
round and median [min-max] over rounds. Every send starts a conversation; the bench users' memory is off
unless ``--memory on``, so each prompt is the same short one. A benchmark that prints figures, not a test.

    manage.py bench_send_ab --origins http://127.0.0.1:8501,http://127.0.0.1:8500 --sends 20 --rounds 3
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid

from django.core.management.base import BaseCommand

from devtools.reply_stages import percentile

TIER = "bench-send-ab"


async def _one_send(ws, prompt: str) -> tuple[float, float | None, float | None]:
    """``(ms to queued, ms to the first token or None, added TTFT ms or None)`` of one ``send`` on ``ws``; waits
    for its ``done``."""
    started = time.perf_counter()
    await ws.send(json.dumps({"type": "send", "content": prompt, "client_id": str(uuid.uuid4())}))
    queued = first = None
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
        now = (time.perf_counter() - started) * 1000
        if frame["type"] == "queued" and queued is None:
            queued = now
        elif frame["type"] == "token" and first is None:
            first = now
        elif frame["type"] in ("done", "error"):
            if frame["type"] == "error":
                raise RuntimeError(f"send refused: {frame}")
            engine_ttft = frame.get("ttft_ms")
            added = first - engine_ttft if first is not None and engine_ttft is not None else None
            return queued, first, added


async def _api_round(
    origins: list[str], keys: list[str], model: str, sends: int, max_tokens: int, pause_s: float = 0.0
) -> list[dict]:
    """As :func:`_round` for streamed chat completions: request -> first content chunk (``first``); ``queued``
    is when the response's headers came (the view returned: admitted and stored)."""
    import openai

    clients = [
        openai.AsyncOpenAI(base_url=o + "/v1", api_key=k, max_retries=0, timeout=120)
        for o, k in zip(origins, keys, strict=True)
    ]
    out = [{"queued": [], "first": []} for _ in origins]
    try:
        for i in range(sends):
            order = range(len(clients)) if i % 2 == 0 else reversed(range(len(clients)))
            for k in order:
                await asyncio.sleep(pause_s)
                started = time.perf_counter()
                stream = await clients[k].chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"Say hello number {i}."}],
                    max_tokens=max_tokens,
                    stream=True,
                    store=True,
                )
                out[k]["queued"].append((time.perf_counter() - started) * 1000)
                first = None
                async for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = (time.perf_counter() - started) * 1000
                if first is not None:
                    out[k]["first"].append(first)
    finally:
        for c in clients:
            await c.close()
    return out


async def _round(
    urls: list[str], origins: list[str], cookies: list[str], sends: int, pause_s: float = 0.0
) -> list[dict]:
    """One round of page sends: ``sends`` per origin, alternated, each after ``pause_s`` seconds idle; per
    origin the lists of ms to ``queued``, to the first token and the added TTFT."""
    import websockets

    sockets = [
        await websockets.connect(u, additional_headers={"Cookie": c}, origin=o)
        for u, o, c in zip(urls, origins, cookies, strict=True)
    ]
    out = [{"queued": [], "first": [], "added": []} for _ in urls]
    try:
        for i in range(sends):
            order = range(len(sockets)) if i % 2 == 0 else reversed(range(len(sockets)))
            for k in order:
                await asyncio.sleep(pause_s)
                queued, first, added = await _one_send(sockets[k], f"Say hello number {i}.")
                out[k]["queued"].append(queued)
                if first is not None:
                    out[k]["first"].append(first)
                if added is not None:
                    out[k]["added"].append(added)
    finally:
        for ws in sockets:
            await ws.close()
    return out


class Command(BaseCommand):
    help = "Alternate page sends between web processes on the same stack; send->queued and ->first token."

    def add_arguments(self, parser):
        parser.add_argument("--origins", required=True, help="comma-separated, e.g. the before and the after")
        parser.add_argument("--sends", type=int, default=20, help="sends per origin and round")
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--max-tokens", type=int, default=8)
        parser.add_argument(
            "--api", action="store_true", help="streamed /v1/chat/completions instead of the page"
        )
        parser.add_argument(
            "--pause-s",
            type=float,
            default=0.0,
            help="seconds idle before each send: over ADMISSION_LOAD_CACHE_S (1 s), a client that sends "
            "less often than the web process's cached figures last",
        )
        parser.add_argument(
            "--memory",
            choices=["off", "on"],
            default="off",
            help="the bench users' memory (off: no recall, every prompt the same short one)",
        )

    def handle(self, *args, origins, sends, rounds, max_tokens, api, memory, pause_s, **options):
        from django.conf import settings

        from accounts.models import User
        from accounts.sessions import session_cookie_for
        from api.models import ApiKey
        from api.services import api_key_create
        from conversations.models import Conversation
        from devtools.bench_tiers import bench_tier
        from memory.models import AccountMemory

        origins = [o.rstrip("/") for o in origins.split(",")]
        urls = [o.replace("http", "ws", 1) + "/ws/chat/" for o in origins]
        tier = bench_tier(TIER, display_name="Send A/B bench", max_tokens=max_tokens)
        users = [
            User.objects.get_or_create(username=f"{TIER}-{i}", defaults={"tier": tier})[0] for i in origins
        ]
        for u in users:
            AccountMemory.objects.update_or_create(user=u, defaults={"enabled": memory == "on"})
        cookies = [session_cookie_for(u) for u in users]
        keys = [api_key_create(user=u, name="bench_send_ab")[1] for u in users]
        model = settings.INFERENCE_DEFAULT_MODEL

        def one_round(n):
            if api:
                return asyncio.run(_api_round(origins, keys, model, n, max_tokens, pause_s))
            return asyncio.run(_round(urls, origins, cookies, n, pause_s))

        load_before = open("/proc/loadavg").read().split()[:3]
        per_round = []
        try:
            one_round(2)  # warm-up: connections, pools, first prefill
            for r in range(rounds):
                per_round.append(one_round(sends))
                self.stderr.write(f"round {r + 1}/{rounds} done")
        finally:
            Conversation.objects.filter(owner__username__startswith=TIER).delete()
            ApiKey.objects.filter(user__username__startswith=TIER).delete()
        load_after = open("/proc/loadavg").read().split()[:3]
        w = self.stdout.write
        w(
            f"bench_send_ab{' --api' if api else ''}: {rounds} rounds x {sends} sends per origin, {max_tokens}-token replies, "
            f"{pause_s:g} s idle before each send; load average "
            f"before {' '.join(load_before)}, after {' '.join(load_after)}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        head = "headers" if api else "queued"
        kinds = ("queued", "first") if api else ("queued", "first", "added")
        extra = "" if api else " added TTFT p50 ms | p99 |"
        w(f"| origin | send -> {head} p50 ms | p99 | send -> first token p50 ms | p99 |{extra}")
        w("|---|---|---|---|---|" + ("" if api else "---|---|"))

        def mr(values):
            return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"

        for k, origin in enumerate(origins):
            cells = [mr([percentile(x[k][kind], q) for x in per_round]) for kind in kinds for q in (50, 99)]
            w(f"| {origin} | " + " | ".join(cells) + " |")
