"""``manage.py loadtest``: many WebSocket clients against the running stack (not a test; prints figures).

Each client is a user of a dedicated ``loadtest`` tier (created here, routed to the paid queue, limits high
enough not to interfere). Every client sends ``--messages`` prompts one after another over its own socket
and measures the time from ``send`` to the first ``token`` frame (the TTFT a user sees). The ``done`` frame
carries the engine's own TTFT (from the request entering the engine to its first token), so

    pipeline overhead = client TTFT - engine TTFT

is what Channels, PostgreSQL, Celery dispatch, context assembly and the Redis channel layer add.
Start the stack first (``make run``); this command only talks to it over ws://.
"""

import asyncio
import json
import statistics
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from accounts.models import User
from accounts.sessions import session_cookie_for
from billing.models import Tier

PROMPTS = [
    "Explain what a KV cache is in two sentences.",
    "Give me three tips for learning to cook.",
    "What is the capital of Japan, and what is it known for?",
    "Write a haiku about the sea.",
    "Summarize the plot of a heist movie in a few sentences.",
    "List four prime numbers and explain why they are prime.",
]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


class Command(BaseCommand):
    help = "Open many WebSocket chat clients against the running stack and report TTFT p50/p99 and overhead."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="ws://127.0.0.1:8000/ws/chat/")
        parser.add_argument("--origin", default="http://127.0.0.1:8000")
        parser.add_argument("--clients", type=int, default=16)
        parser.add_argument(
            "--messages", type=int, default=2, help="prompts per client, sent one after another"
        )
        parser.add_argument("--max-tokens", type=int, default=64, help="reply limit of the loadtest tier")
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds per reply")
        parser.add_argument("--json", dest="json_path", help="also write the raw figures here")
        parser.add_argument(
            "--model", default="", help="registered model the loadtest tier uses (default: the paid tier's)"
        )

    def handle(
        self, *args, clients, messages, max_tokens, url, origin, timeout, json_path, model="", **options
    ):
        if clients < 1 or messages < 1 or max_tokens < 1:
            raise CommandError("--clients, --messages and --max-tokens must be >= 1")
        if model and model not in settings.INFERENCE_MODELS:
            raise CommandError(f"--model {model!r} is not a registered model")
        cookies = self.prepare_users(clients, max_tokens, model)
        started = time.monotonic()
        results = asyncio.run(self.run_clients(cookies, messages, url, origin, timeout))
        wall = time.monotonic() - started
        summary = self.summarize(results, wall)
        self.print_summary(summary, clients, messages, max_tokens)
        if json_path:
            with open(json_path, "w") as fh:
                json.dump({"summary": summary, "replies": results}, fh, indent=2)

    def prepare_users(self, clients: int, max_tokens: int, model: str = "") -> list[str]:
        paid = Tier.objects.get(name="paid")
        tier, _ = Tier.objects.update_or_create(
            name="loadtest",
            defaults=dict(
                display_name="Load test",
                model_name=model or paid.model_name,
                requests_per_minute=10_000,
                tokens_per_day=100_000_000,
                max_reply_tokens=max_tokens,
                max_context_tokens=paid.max_context_tokens,
                queue_priority=paid.queue_priority,
                max_concurrent_generations=1,
                admit_max_wait_s=paid.admit_max_wait_s,
            ),
        )
        cookies = []
        for i in range(clients):
            user, _ = User.objects.get_or_create(username=f"loadtest-{i}", defaults={"tier": tier})
            if user.tier_id != tier.id:
                user.tier = tier
                user.save(update_fields=["tier"])
            cookies.append(session_cookie_for(user))
        return cookies

    async def run_clients(self, cookies, messages, url, origin, timeout):
        per_client = await asyncio.gather(
            *(self.client(i, cookie, messages, url, origin, timeout) for i, cookie in enumerate(cookies))
        )
        return [reply for replies in per_client for reply in replies]

    async def client(self, index, cookie, messages, url, origin, timeout):
        import websockets

        replies = []
        async with websockets.connect(
            url, additional_headers={"Cookie": cookie}, origin=origin, max_size=None
        ) as ws:
            conversation_id = None
            for n in range(messages):
                prompt = PROMPTS[(index + n) % len(PROMPTS)]
                sent = time.monotonic()
                await ws.send(
                    json.dumps({"type": "send", "conversation_id": conversation_id, "content": prompt})
                )
                reply = {"client": index, "ttft_ms": None, "tokens": 0}
                while True:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
                    if frame["type"] == "queued":
                        conversation_id = frame["conversation_id"]
                    elif frame["type"] == "token":
                        if reply["ttft_ms"] is None:
                            reply["ttft_ms"] = (time.monotonic() - sent) * 1000
                        reply["tokens"] += 1
                    elif frame["type"] == "done":
                        reply.update(
                            status=frame["status"],
                            engine_ttft_ms=frame["ttft_ms"],
                            completion_tokens=frame["usage"]["completion_tokens"],
                            total_ms=(time.monotonic() - sent) * 1000,
                        )
                        break
                    elif frame["type"] == "error":
                        reply.update(
                            status="error", error=frame["code"], total_ms=(time.monotonic() - sent) * 1000
                        )
                        break
                replies.append(reply)
        return replies

    def summarize(self, results, wall):
        ok = [r for r in results if r.get("status") == "completed" and r["ttft_ms"] is not None]
        ttft = [r["ttft_ms"] for r in ok]
        engine = [r["engine_ttft_ms"] for r in ok if r["engine_ttft_ms"] is not None]
        overhead = [r["ttft_ms"] - r["engine_ttft_ms"] for r in ok if r["engine_ttft_ms"] is not None]
        tokens = sum(r.get("completion_tokens", 0) for r in results)
        return {
            "replies": len(results),
            "completed": len(ok),
            "errors": sorted({r.get("error", r.get("status")) for r in results if r not in ok}),
            "wall_s": round(wall, 2),
            "output_tokens_per_s": round(tokens / wall, 1) if wall else 0.0,
            "client_ttft_ms": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99)},
            "engine_ttft_ms": {"p50": percentile(engine, 50), "p99": percentile(engine, 99)},
            "pipeline_overhead_ms": {
                "p50": percentile(overhead, 50),
                "p99": percentile(overhead, 99),
                "mean": statistics.fmean(overhead) if overhead else float("nan"),
            },
        }

    def print_summary(self, s, clients, messages, max_tokens):
        self.stdout.write(f"clients={clients} messages/client={messages} max_tokens={max_tokens}")
        self.stdout.write(
            f"replies: {s['completed']}/{s['replies']} completed in {s['wall_s']} s; errors: {s['errors']}"
        )
        self.stdout.write(f"output tokens/s (all clients): {s['output_tokens_per_s']}")
        self.stdout.write(f"{'':24}{'p50 ms':>10}{'p99 ms':>10}")
        for label, key in (
            ("client TTFT", "client_ttft_ms"),
            ("engine TTFT", "engine_ttft_ms"),
            ("pipeline overhead", "pipeline_overhead_ms"),
        ):
            self.stdout.write(f"{label:24}{s[key]['p50']:>10.1f}{s[key]['p99']:>10.1f}")
