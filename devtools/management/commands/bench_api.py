"""``manage.py bench_api``: the API's added latency, i.e. TTFT seen by an ``openai`` client streaming from
``/v1/chat/completions`` minus the engine's own TTFT (``Message.ttft_ms``, from the request entering the engine
to its first token), at 1 and 16 concurrent streams against a running stack (``make run``). A benchmark that
prints figures, not a test.

The added latency is everything outside the engine: HTTP + authentication + admission control + the
PostgreSQL transaction, Celery dispatch through the broker, the worker's context assembly, and the
channel-layer hop back to the SSE response. Completions are sent with ``store: true`` so the stored reply
(``chatcmpl-<id>``) can be read back; the command deletes them afterwards.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

from django.core.management.base import BaseCommand, CommandError

from api.services import api_key_create
from conversations.models import Conversation, Message

PROMPT = "In one sentence, what is continuous batching?"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


async def _one_stream(client, model: str, max_tokens: int) -> tuple[int, float]:
    start = time.perf_counter()
    first = None
    completion_id = ""
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        store=True,
    )
    async for chunk in stream:
        completion_id = chunk.id
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
    return int(completion_id.removeprefix("chatcmpl-")), ((first or time.perf_counter()) - start) * 1000


async def _wave(
    base_url: str, key: str, model: str, streams: int, max_tokens: int
) -> list[tuple[int, float]]:
    import openai

    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300) as client:
        return await asyncio.gather(*(_one_stream(client, model, max_tokens) for _ in range(streams)))


class Command(BaseCommand):
    help = "Print the API's added latency (client TTFT minus engine TTFT), p50/p99 at 1 and 16 streams."

    def add_arguments(self, parser):
        parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
        parser.add_argument(
            "--user", required=True, help="username whose tier limits apply (use a paid user)"
        )
        parser.add_argument("--model", default="smollm2-135m-instruct")
        parser.add_argument("--streams", default="1,16", help="comma-separated concurrency levels")
        parser.add_argument("--rounds", type=int, default=5, help="waves per concurrency level")
        parser.add_argument("--max-tokens", type=int, default=8)

    def handle(self, *args, base_url, user, model, streams, rounds, max_tokens, **options):
        import logging

        from django.contrib.auth import get_user_model

        for noisy in ("httpx", "httpx2", "openai"):  # one INFO line per request otherwise
            logging.getLogger(noisy).setLevel(logging.WARNING)

        account = get_user_model().objects.filter(username=user).first()
        if account is None:
            raise CommandError(f"no user {user!r}")
        api_key, key = api_key_create(user=account, name="bench_api")
        rows, created = [], []
        load_before = os.getloadavg()[0]
        try:
            # Warm-up: connections, the first prefill.
            created += [i for i, _ in asyncio.run(_wave(base_url, key, model, 1, max_tokens))]
            for n in [int(s) for s in streams.split(",")]:
                added, client_ttft, engine_ttft, round_p50 = [], [], [], []
                for _ in range(rounds):
                    results = asyncio.run(_wave(base_url, key, model, n, max_tokens))
                    created += [i for i, _ in results]
                    stored = dict(
                        Message.objects.filter(pk__in=[i for i, _ in results]).values_list("id", "ttft_ms")
                    )
                    wave = []
                    for message_id, client_ms in results:
                        engine_ms = stored.get(message_id)
                        if engine_ms is None:
                            continue
                        wave.append(client_ms - engine_ms)
                        client_ttft.append(client_ms)
                        engine_ttft.append(engine_ms)
                    added += wave
                    if wave:
                        round_p50.append(statistics.median(wave))
                rows.append((n, len(added), client_ttft, engine_ttft, added, round_p50))
        finally:
            api_key.delete()
            Conversation.objects.filter(owner=account, messages__id__in=created).delete()
        self.stdout.write(
            f"load average (1 min) before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f} "
            f"on {os.cpu_count()} CPUs; {max_tokens}-token replies, {rounds} waves per level"
        )
        self.stdout.write(
            "| streams | replies | client TTFT p50 / p99 ms | engine TTFT p50 / p99 ms | "
            "added p50 / p99 ms | added p50 per round: median [min-max] ms |"
        )
        self.stdout.write("|---|---|---|---|---|---|")
        for n, count, client_ttft, engine_ttft, added, round_p50 in rows:
            if not added:
                self.stdout.write(f"| {n} | 0 | - | - | - | - |")
                continue
            self.stdout.write(
                f"| {n} | {count} | {percentile(client_ttft, 50):.0f} / {percentile(client_ttft, 99):.0f} | "
                f"{percentile(engine_ttft, 50):.0f} / {percentile(engine_ttft, 99):.0f} | "
                f"{percentile(added, 50):.0f} / {percentile(added, 99):.0f} | "
                f"{statistics.median(round_p50):.0f} [{min(round_p50):.0f}-{max(round_p50):.0f}] |"
            )
