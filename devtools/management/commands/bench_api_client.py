"""``manage.py bench_api_client``: how much of the API path's TTFT is the client's own work. The same streamed
completion (``/v1/chat/completions``, ``store: true``) is sent alternately through the ``openai`` SDK
(``AsyncOpenAI``, the client ``bench_overhead`` and most users use), through raw ``httpx`` streaming of a
pre-encoded body, and through a bare asyncio socket that writes the request's bytes and reads the chunked body
with no HTTP library, each on a kept connection, in rotating order, against a running stack (``make run``);
printed: time from the call to the first content chunk, p50 per round for each client, and the SDK's excess over
the other two, median [min-max] over rounds. The differences are work the product cannot remove: request
building, HTTP and SSE parsing and the chunk objects, on the same CPUs as the stack. A benchmark that prints
figures, not a test.

    manage.py bench_api_client --origin http://127.0.0.1:8000 --requests 30 --rounds 3
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from devtools.bare_http import BareHttpConnection, completion_body, first_choice

TIER = "bench-api-client"


async def _sdk_first_chunk(client, model: str, prompt: str, max_tokens: int) -> float | None:
    """ms from the SDK call to its first content chunk (None when no content came)."""
    started = time.perf_counter()
    stream = await client.chat.completions.create(**completion_body(model, prompt, max_tokens))
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = (time.perf_counter() - started) * 1000
    return first


async def _raw_first_chunk(
    client, url: str, key: str, model: str, prompt: str, max_tokens: int
) -> float | None:
    """ms from the raw POST to the first SSE event carrying content (None when none did)."""
    body = json.dumps(completion_body(model, prompt, max_tokens)).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    started = time.perf_counter()
    first = None
    async with client.stream("POST", url, content=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {"):
                if first_choice(json.loads(line[6:])).get("delta", {}).get("content"):
                    first = (time.perf_counter() - started) * 1000
    return first


async def _bare_first_chunk(conn, key: str, model: str, prompt: str, max_tokens: int) -> float | None:
    """ms from writing the POST on a kept connection to the first SSE event carrying content (None when none
    did): :class:`devtools.bare_http.BareHttpConnection`, no HTTP library."""
    payload = completion_body(model, prompt, max_tokens)
    await conn.open()
    started = time.perf_counter()
    first = None
    async for event in conn.post_events("/v1/chat/completions", key, payload):
        if first is None and first_choice(event).get("delta", {}).get("content"):
            first = (time.perf_counter() - started) * 1000
    return first


async def _round(origin: str, key: str, model: str, requests: int, max_tokens: int) -> dict[str, list[float]]:
    import httpx
    import openai

    out: dict[str, list[float]] = {"sdk": [], "raw": [], "socket": []}
    url = f"{origin}/v1/chat/completions"
    sock = BareHttpConnection(origin)
    async with (
        openai.AsyncOpenAI(base_url=f"{origin}/v1", api_key=key, max_retries=0, timeout=120) as sdk,
        httpx.AsyncClient(timeout=120) as raw,
    ):
        await _sdk_first_chunk(sdk, model, "Say hello.", max_tokens)  # connections opened, not timed
        await _raw_first_chunk(raw, url, key, model, "Say hello.", max_tokens)
        await _bare_first_chunk(sock, key, model, "Say hello.", max_tokens)
        order = ("sdk", "raw", "socket")
        for i in range(requests):
            prompt = f"Say hello number {i}."
            for name in order[i % 3 :] + order[: i % 3]:
                if name == "sdk":
                    first = await _sdk_first_chunk(sdk, model, prompt, max_tokens)
                elif name == "raw":
                    first = await _raw_first_chunk(raw, url, key, model, prompt, max_tokens)
                else:
                    first = await _bare_first_chunk(sock, key, model, prompt, max_tokens)
                if first is not None:
                    out[name].append(first)
    await sock.close()
    return out


class Command(BaseCommand):
    help = "The openai SDK's own share of the API path's TTFT: SDK against raw httpx, alternated."

    def add_arguments(self, parser):
        parser.add_argument("--origin", default="http://127.0.0.1:8000")
        parser.add_argument("--requests", type=int, default=30, help="completions per client and round")
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--max-tokens", type=int, default=8)

    def handle(self, *args, origin, requests, rounds, max_tokens, **options):
        from accounts.models import User
        from api.models import ApiKey
        from api.services import api_key_create
        from conversations.models import Conversation
        from devtools.bench_tiers import bench_tier
        from memory.models import AccountMemory

        origin = origin.rstrip("/")
        tier = bench_tier(TIER, display_name="API client bench", max_tokens=max_tokens)
        user = User.objects.get_or_create(username=TIER, defaults={"tier": tier})[0]
        AccountMemory.objects.update_or_create(user=user, defaults={"enabled": False})
        key = api_key_create(user=user, name=TIER)[1]
        model = settings.INFERENCE_DEFAULT_MODEL
        per_round = []
        try:
            for r in range(rounds):
                per_round.append(asyncio.run(_round(origin, key, model, requests, max_tokens)))
                self.stderr.write(f"round {r + 1}/{rounds} done")
        finally:
            Conversation.objects.filter(owner=user).delete()
            ApiKey.objects.filter(user=user).delete()

        def mr(values):
            return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"

        sdk = [statistics.median(x["sdk"]) for x in per_round]
        raw = [statistics.median(x["raw"]) for x in per_round]
        sock = [statistics.median(x["socket"]) for x in per_round]
        w = self.stdout.write
        w(
            f"bench_api_client: {rounds} rounds x {requests} completions per client, {max_tokens}-token replies; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        w("| client | first content chunk p50 ms, median [min-max] over rounds |")
        w("|---|---|")
        w(f"| openai SDK (AsyncOpenAI) | {mr(sdk)} |")
        w(f"| raw httpx stream | {mr(raw)} |")
        w(f"| bare socket, no HTTP library | {mr(sock)} |")
        w(f"| SDK's excess over httpx | {mr([a - b for a, b in zip(sdk, raw, strict=True)])} |")
        w(f"| SDK's excess over the bare socket | {mr([a - b for a, b in zip(sdk, sock, strict=True)])} |")
