"""The simulated WebSocket clients of ``manage.py overload`` and the figures that judge the measurement.

:func:`run_clients` runs a group of clients on one asyncio loop until a deadline (``time.monotonic()``, the
same clock in every process on Linux) together with a probe of that loop's lag: a 10 ms sleep that wakes up
late means this process was descheduled or busy, and every latency it measured in that moment is inflated
by as much. The command runs the free clients in a process of their own (:func:`run_clients_in_process`),
so the paid clients' token streams do not delay the loop that times the refusals.

:func:`server_refusal_histogram` reads the web process's own refusal timing
(``chatsite:websocket_refusal_seconds``, frame in -> error frame out) from its ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import re
import time
import urllib.request
import uuid
from concurrent.futures import ProcessPoolExecutor

from devtools.management.commands.loadtest import PROMPTS

LAG_PROBE_S = 0.01


async def _next_frame(ws, types: set[str], timeout: float) -> dict:
    end = time.monotonic() + timeout
    while True:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        frame = json.loads(await asyncio.wait_for(ws.recv(), remaining))
        if frame.get("type") in types:
            return frame


async def client(index: int, spec: tuple, deadline: float, o: dict) -> list[dict]:
    """One client (``spec``: ``(tier, cookie, user_id)``) sending until ``deadline``; one result per send:
    ``outcome`` admitted/refused/unanswered, ``refusal_ms`` (just before ``send`` -> the ``error`` frame
    parsed), ``ttft_ms``, ``status``."""
    import websockets

    tier, cookie, _ = spec
    results = []
    await asyncio.sleep(random.random())  # spread the first sends over a second
    async with websockets.connect(
        o["url"], additional_headers={"Cookie": cookie}, origin=o["origin"], max_size=None
    ) as ws:
        n = 0
        while time.monotonic() < deadline:
            prompt = PROMPTS[(index + n) % len(PROMPTS)]
            n += 1
            result = {"tier": tier, "outcome": "unanswered"}
            results.append(result)
            sent = time.monotonic()
            # Keyed like the chat page's sends (a client_id per message), so the path measured is the page's.
            frame = {
                "type": "send",
                "conversation_id": None,
                "content": prompt,
                "client_id": str(uuid.uuid4()),
            }
            await ws.send(json.dumps(frame))
            try:
                frame = await _next_frame(ws, {"queued", "error"}, o["ack_timeout"])
            except TimeoutError:
                continue
            if frame["type"] == "error":
                result.update(
                    outcome="refused", code=frame["code"], refusal_ms=(time.monotonic() - sent) * 1000
                )
                await asyncio.sleep(o["retry_s"])
                continue
            result.update(
                outcome="admitted", message_id=frame["message_id"], degraded=bool(frame.get("notice"))
            )
            try:
                while True:
                    frame = await _next_frame(ws, {"token", "done"}, o["reply_timeout"])
                    if frame["type"] == "token" and "ttft_ms" not in result:
                        result["ttft_ms"] = (time.monotonic() - sent) * 1000
                    if frame["type"] == "done":
                        result["status"] = frame["status"]
                        break
            except TimeoutError:
                result["status"] = "timeout"
    return results


async def _lag_probe(lags: list[float]) -> None:
    while True:
        start = time.monotonic()
        await asyncio.sleep(LAG_PROBE_S)
        lags.append((time.monotonic() - start - LAG_PROBE_S) * 1000)


async def _clients(
    specs: list[tuple], offset: int, deadline: float, o: dict
) -> tuple[list[dict], list[float]]:
    lags: list[float] = []
    probe = asyncio.get_running_loop().create_task(_lag_probe(lags))
    try:
        per_client = await asyncio.gather(*(client(offset + i, s, deadline, o) for i, s in enumerate(specs)))
    finally:
        probe.cancel()
    return [r for rs in per_client for r in rs], lags


def run_clients(specs: list[tuple], offset: int, deadline: float, o: dict) -> tuple[list[dict], list[float]]:
    """Run ``specs``' clients on a new loop until ``deadline``; returns ``(results, loop lags in ms)``."""
    return asyncio.run(_clients(specs, offset, deadline, o))


def run_clients_in_process(specs: list[tuple], offset: int, deadline: float, o: dict):
    """:func:`run_clients` in a forked child process; returns a ``concurrent.futures.Future`` of its result.
    Close the database connections first: the child must not share their sockets."""
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
    future = pool.submit(run_clients, specs, offset, deadline, o)
    pool.shutdown(wait=False)
    return future


_BUCKET = re.compile(r'^chatsite:websocket_refusal_seconds_bucket\{decided="(\w+)",le="([^"]+)"\} (\S+)$')


def server_refusal_histogram(metrics_url: str) -> dict[str, dict[float, float]]:
    """``{decided: {le: cumulative count}}`` of ``chatsite:websocket_refusal_seconds`` at ``metrics_url``
    (the web process's ``/metrics``; {} when it cannot be read)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    out: dict[str, dict[float, float]] = {}
    for line in text.splitlines():
        m = _BUCKET.match(line)
        if m:
            out.setdefault(m[1], {})[float(m[2])] = float(m[3])
    return out


def histogram_quantile(q: float, before: dict, after: dict) -> tuple[float, int]:
    """``(quantile q of the observations between two reads in ms, their count)``, summed over the
    ``decided`` labels, interpolated inside a bucket as Prometheus' ``histogram_quantile`` does."""
    buckets: dict[float, float] = {}
    for label, counts in after.items():
        for le, n in counts.items():
            buckets[le] = buckets.get(le, 0.0) + n - before.get(label, {}).get(le, 0.0)
    edges = sorted(buckets)
    total = buckets[edges[-1]] if edges else 0
    if not total:
        return float("nan"), 0
    rank, lower, below = q * total, 0.0, 0.0
    for le in edges:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower * 1000, int(total)
            return (lower + (le - lower) * (rank - below) / max(buckets[le] - below, 1e-9)) * 1000, int(total)
        lower, below = le, buckets[le]
    return float("nan"), int(total)
