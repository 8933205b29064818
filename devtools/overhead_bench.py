"""The clients of ``manage.py bench_overhead``: the bare engine in this process, the page path (WebSocket)
and the API path (SSE) against a running stack, a refusal prober and a ``resume`` flood, each returning
plain figures. No Django import at module level: the refusal prober runs in a spawned process of its own,
so the streaming clients of this one do not delay the loop that times the refusals.

Every stream records, per reply: TTFT (ms, from the request leaving the client to the first token reaching
it), the gaps between its tokens (ms), the token count, and for the stack the engine's own TTFT (the ``done``
frame's ``ttft_ms`` / the stored reply's, from the request entering the engine to its first token), so that
``added TTFT = client TTFT - engine TTFT`` is what the product adds.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field

from devtools.bare_http import BareHttpConnection, completion_body, first_choice

PROMPTS = [
    "Explain what a KV cache is in two sentences.",
    "Give me three tips for learning to cook.",
    "What is the capital of Japan, and what is it known for?",
    "Write a haiku about the sea.",
    "Summarize the plot of a heist movie in a few sentences.",
    "List four prime numbers and explain why they are prime.",
]


@dataclass
class Stream:
    """One reply as a client saw it (ms); ``engine_ttft_ms`` None for the bare engine (its TTFT is the
    client's)."""

    ttft_ms: float | None = None
    engine_ttft_ms: float | None = None
    gaps_ms: list[float] = field(default_factory=list)
    #: ``time.perf_counter()`` (s) of the first token; each gap ends ``gaps_ms`` after the one before.
    first_token_at: float | None = None
    tokens: int = 0
    ok: bool = False
    error: str = ""

    @property
    def added_ms(self) -> float | None:
        if self.ttft_ms is None or self.engine_ttft_ms is None:
            return None
        return self.ttft_ms - self.engine_ttft_ms


@dataclass
class Wave:
    """``n`` concurrent replies started together; ``wall_s`` from the first request to the last token."""

    streams: list[Stream]
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return sum(s.tokens for s in self.streams) / self.wall_s if self.wall_s else 0.0

    def steady_gaps_ms(self) -> list[float]:
        """The gaps (ms) that ended after every stream of the wave had its first token: the steady decode,
        without the burst's arrival (admission, and prefills sharing steps with running decodes); [] when no
        stream got a first token."""
        firsts = [s.first_token_at for s in self.streams if s.first_token_at is not None]
        if not firsts:
            return []
        all_started = max(firsts)
        return [
            g
            for s in self.streams
            if s.first_token_at is not None
            for g, since_first_ms in zip(s.gaps_ms, itertools.accumulate(s.gaps_ms), strict=True)
            if s.first_token_at + since_first_ms / 1000 > all_started
        ]


def steady_gap_ratio(page_waves: list[Wave], bare_waves: list[Wave]) -> float:
    """Inter-token gap p99 of ``page_waves`` over that of ``bare_waves``, both counting only the gaps after each
    wave's last first token (:meth:`Wave.steady_gaps_ms`): what the relay adds once a burst has arrived. NaN
    when either side has no such gap."""
    from devtools.reply_stages import percentile

    page = [g for wave in page_waves for g in wave.steady_gaps_ms()]
    bare = [g for wave in bare_waves for g in wave.steady_gaps_ms()]
    if not page or not bare:
        return float("nan")
    b = percentile(bare, 99)
    return percentile(page, 99) / b if b else float("nan")


class _Clock:
    """Token arrival times of one stream, turned into a TTFT and gaps."""

    def __init__(self, stream: Stream, started: float):
        self.stream, self.started, self.last = stream, started, None

    def token(self, count: int = 1) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.stream.ttft_ms = (now - self.started) * 1000
            self.stream.first_token_at = now
        else:
            self.stream.gaps_ms.append((now - self.last) * 1000)
        self.last = now
        self.stream.tokens += count


# --- the bare engine, in this process ------------------------------------------------------------------------


def engine_wave(engine, n: int, sampling, *, round_index: int) -> Wave:
    """``n`` requests submitted at once straight to ``engine`` (the worker's engine class and settings), all
    followed by one thread that the engine wakes and that takes every handle's events at once
    (``set_waker``/``drain``), as the worker's publisher thread does (``conversations/delta_publisher.py``);
    prompts as the stack renders them (one user turn, the model's chat template)."""
    from inference.engine import FinishEvent, TokenEvent

    prompts = [engine.render_chat([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]) for i in range(n)]
    streams = [Stream() for _ in range(n)]
    woken = threading.Event()
    started = time.perf_counter()
    handles, clocks = [], []
    for i in range(n):
        clocks.append(_Clock(streams[i], time.perf_counter()))
        handle = engine.submit(
            prompts[i],
            sampling,
            request_id=f"bench-{uuid.uuid4().hex}",
            cache_salt=f"bench:{round_index}:{i}",
        )
        handle.set_waker(woken.set)
        handles.append(handle)
    woken.set()  # events delivered before a handle's waker was set woke nobody
    open_ = set(range(n))
    while open_:
        woken.wait()
        woken.clear()  # before draining: an event put meanwhile sets it again
        for i in list(open_):
            for event in handles[i].drain():
                if isinstance(event, TokenEvent):
                    clocks[i].token(len(event.token_ids))
                elif isinstance(event, FinishEvent):
                    streams[i].ok = event.finish_reason in ("stop", "length")
                    streams[i].engine_ttft_ms = streams[i].ttft_ms
                    open_.discard(i)
    return Wave(streams, time.perf_counter() - started)


# --- the page path (WebSocket) ---------------------------------------------------------------------------------


async def _page_reply(ws, prompt: str, stream: Stream, timeout: float) -> None:
    started = time.perf_counter()
    clock = _Clock(stream, started)
    await ws.send(json.dumps({"type": "send", "content": prompt, "client_id": str(uuid.uuid4())}))
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        kind = frame["type"]
        if kind == "token" and frame.get("text"):
            clock.token()
        elif kind == "done":
            stream.ok = frame["status"] == "completed"
            stream.engine_ttft_ms = frame["ttft_ms"]
            return
        elif kind == "error":
            stream.error = frame["code"]
            return


async def open_sockets(cookies: list[str], url: str, origin: str) -> list:
    """One chat socket per session cookie, opened one after another (``websockets`` client connections)."""
    import websockets

    return [
        await websockets.connect(url, additional_headers={"Cookie": c}, origin=origin, max_size=None)
        for c in cookies
    ]


async def page_wave(cookies: list[str], url: str, origin: str, timeout: float = 300.0) -> Wave:
    """One ``send`` on each of ``len(cookies)`` sockets (opened first, not timed), all at once."""
    sockets = await open_sockets(cookies, url, origin)
    streams = [Stream() for _ in cookies]
    try:
        started = time.perf_counter()
        await asyncio.gather(
            *(_page_reply(ws, PROMPTS[i % len(PROMPTS)], streams[i], timeout) for i, ws in enumerate(sockets))
        )
        wall = time.perf_counter() - started
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return Wave(streams, wall)


# --- the API path (SSE, the openai client) ---------------------------------------------------------------------


async def _api_reply(client, model: str, prompt: str, max_tokens: int, stream: Stream) -> int:
    clock = _Clock(stream, time.perf_counter())
    completion_id = ""
    response = await client.chat.completions.create(**completion_body(model, prompt, max_tokens))
    async for chunk in response:
        completion_id = chunk.id
        if chunk.choices and chunk.choices[0].delta.content:
            clock.token()
        if chunk.choices and chunk.choices[0].finish_reason:
            stream.ok = True
    return int(completion_id.removeprefix("chatcmpl-") or 0)


async def api_wave(base_url: str, key: str, model: str, n: int, max_tokens: int) -> tuple[Wave, list[int]]:
    """``n`` streamed chat completions at once; returns the wave and the stored replies' ids (the caller
    reads their engine TTFT from the database). The client's ``n`` connections are opened first (``n``
    concurrent ``GET /v1/models``), as the page path's sockets are, so a reply's TTFT runs from its request
    on an open connection, as for an SDK client that is kept, not from a TCP connect."""
    import openai

    streams = [Stream() for _ in range(n)]
    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300) as client:
        await asyncio.gather(*(client.models.list() for _ in range(n)))
        started = time.perf_counter()
        ids = await asyncio.gather(
            *(_api_reply(client, model, PROMPTS[i % len(PROMPTS)], max_tokens, streams[i]) for i in range(n))
        )
        wall = time.perf_counter() - started
    return Wave(streams, wall), list(ids)


async def _bare_api_reply(conn, key: str, model: str, prompt: str, max_tokens: int, stream: Stream) -> int:
    payload = completion_body(model, prompt, max_tokens)
    completion_id = ""
    try:
        clock = _Clock(stream, time.perf_counter())
        async for event in conn.post_events("/v1/chat/completions", key, payload):
            completion_id = event.get("id", completion_id)
            choice = first_choice(event)
            if choice.get("delta", {}).get("content"):
                clock.token()
            if choice.get("finish_reason"):
                stream.ok = True
    except (RuntimeError, OSError, asyncio.IncompleteReadError) as exc:
        stream.error = type(exc).__name__
    return int(completion_id.removeprefix("chatcmpl-") or 0)


async def bare_api_wave(origin: str, key: str, model: str, n: int, max_tokens: int) -> tuple[Wave, list[int]]:
    """:func:`api_wave` through :class:`devtools.bare_http.BareHttpConnection` instead of the ``openai`` SDK:
    ``n`` kept connections, opened before the timing, each sending its request's bytes at once and reading
    the chunked SSE body with no HTTP library, so the TTFT is the server's without the client library's work."""
    streams = [Stream() for _ in range(n)]
    conns = [BareHttpConnection(origin) for _ in range(n)]
    await asyncio.gather(*(c.open() for c in conns))
    try:
        started = time.perf_counter()
        ids = await asyncio.gather(
            *(
                _bare_api_reply(conns[i], key, model, PROMPTS[i % len(PROMPTS)], max_tokens, streams[i])
                for i in range(n)
            )
        )
        wall = time.perf_counter() - started
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    return Wave(streams, wall), list(ids)


# --- refusals and the resume flood -----------------------------------------------------------------------------


async def _refusals(url: str, origin: str, cookie: str, count: int, interval_s: float, ready) -> list[float]:
    import websockets

    times = []
    async with websockets.connect(url, additional_headers={"Cookie": cookie}, origin=origin) as ws:
        ready.set()
        for _ in range(count):
            started = time.perf_counter()
            await ws.send(json.dumps({"type": "send", "content": "Hello?", "client_id": str(uuid.uuid4())}))
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if frame["type"] == "error":
                    times.append((time.perf_counter() - started) * 1000)
                    break
                if frame["type"] == "queued":  # admitted after all: not a refusal, not counted
                    break
            await asyncio.sleep(interval_s)
    return times


def refusal_probe(url: str, origin: str, cookie: str, count: int, interval_s: float, out, ready) -> None:
    """Entry point of the spawned prober process: connects, sets ``ready`` (a ``multiprocessing.Event``),
    then sends ``count`` frames, one every ``interval_s`` s, as a user whose tier refuses every request at the
    load gate; puts the refusal times (ms, send -> error frame) on ``out`` (:class:`RefusalProber` runs it)."""
    out.put(asyncio.run(_refusals(url, origin, cookie, count, interval_s, ready)))


class RefusalProber:
    """The refusal prober (:func:`refusal_probe`) in a spawned process of its own, so the streaming clients
    of the caller's process do not delay the loop that times the refusals. The constructor returns once the
    process has started and connected, as it begins to send (a new interpreter takes about a core for 0.2 s:
    that start must not land on the waves it probes, so build it right before them); :meth:`finish` returns
    its refusal times (ms). Raises ``RuntimeError`` when it does not connect within 60 s."""

    def __init__(self, url: str, origin: str, cookie: str, count: int, interval_s: float = 0.15):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.out, ready = ctx.Queue(), ctx.Event()
        self.process = ctx.Process(
            target=refusal_probe,
            args=(url, origin, cookie, count, interval_s, self.out, ready),
            daemon=True,  # ends with the run, even one that stops before its result
        )
        self.process.start()
        if not ready.wait(60):
            self.process.kill()
            raise RuntimeError("the refusal prober did not connect within 60 s")

    def running(self) -> bool:
        """Whether it is still sending (no result yet)."""
        return self.process.is_alive() and self.out.empty()

    def finish(self) -> list[float]:
        """Its refusal times (ms, send -> error frame), waiting up to 120 s."""
        try:
            return self.out.get(timeout=120)
        finally:
            self.process.join(10)


async def resume_flood(
    url: str, origin: str, cookie: str, message_id: int, *, rate: float, seconds: float, wait_s: float = 10.0
) -> dict:
    """``rate`` ``resume`` frames per second for ``seconds`` s on one socket, each for the finished reply
    ``message_id`` (so each is answered with its ``done`` frame, or ``rate_limited`` beyond the socket's
    frame budget). The socket answers in order, so the k-th answer is the k-th frame's. Returns counts and
    the answer times (ms)."""
    import websockets

    sent: list[float] = []
    answers: list[tuple[float, str]] = []
    async with websockets.connect(
        url, additional_headers={"Cookie": cookie}, origin=origin, max_size=None
    ) as ws:

        async def reader():
            while True:
                frame = json.loads(await ws.recv())
                if frame["type"] in ("done", "error"):
                    answers.append((time.perf_counter(), frame.get("code") or frame["type"]))

        task = asyncio.ensure_future(reader())
        frame = json.dumps({"type": "resume", "message_id": message_id, "after_seq": -1})
        start = time.perf_counter()
        total = int(rate * seconds)
        for k in range(total):
            await asyncio.sleep(max(0.0, start + k / rate - time.perf_counter()))
            sent.append(time.perf_counter())
            await ws.send(frame)
        deadline = time.perf_counter() + wait_s
        while len(answers) < total and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()
    latencies = [(a - s) * 1000 for s, (a, _) in zip(sent, answers, strict=False)]
    kinds: dict[str, int] = {}
    for _, kind in answers:
        kinds[kind] = kinds.get(kind, 0) + 1
    return {"sent": total, "answered": len(answers), "kinds": kinds, "latencies_ms": latencies}


def vacuum_reply_tables() -> None:
    """``VACUUM (ANALYZE)`` the tables every reply writes or rewrites. A PostgreSQL without autovacuum (as on
    these 2-vCPU machines) carries every earlier run's dead rows into the next run's scans and index lookups,
    so runs taken one after another drift; each run starts from vacuumed tables instead."""
    from django.db import connection

    from billing.models import DailyQuota, QuotaReservation, UsageRecord
    from conversations.models import Conversation, Message
    from safety.models import ModerationVerdict

    tables = (Message, Conversation, DailyQuota, QuotaReservation, UsageRecord, ModerationVerdict)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM (ANALYZE) {', '.join(m._meta.db_table for m in tables)}")
