"""``manage.py bench_db_calls``: the database side of the page path, in-process against the configured
database, with and without psycopg's connection pool (``DB_POOL_MAX_SIZE``), rounds interleaved: a ``send``
(``generations.reply_request`` to an existing conversation, rolled back: nothing is stored or dispatched) and a
``resume`` read of a finished reply through ``db_call`` as the consumer makes it (each call closes its
connection, i.e. returns it to the pool). Prints median [min-max] over rounds of each round's p50 (ms). A
benchmark, not a test; ``docs/overhead.md`` holds the figures."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

from django.core.management.base import BaseCommand


class _Rollback(Exception):
    pass


class Command(BaseCommand):
    help = "Time a send's transaction and a resume's db_call read, with and without the connection pool."

    def add_arguments(self, parser):
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--calls", type=int, default=40, help="timed calls per round and variant")
        parser.add_argument("--child", action="store_true", help="internal: measure one variant, print JSON")

    def handle(self, *args, rounds, calls, child, **options):
        if child:
            self.stdout.write(json.dumps(self.measure(calls)))
            return
        results: dict[str, list[dict]] = {"no pool": [], "pool": []}
        for _ in range(rounds):
            for name, size in (("no pool", "0"), ("pool", os.environ.get("DB_POOL_MAX_SIZE", "16"))):
                env = {**os.environ, "DB_POOL_MAX_SIZE": size}
                out = subprocess.run(
                    [sys.executable, "manage.py", "bench_db_calls", "--child", "--calls", str(calls)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        self.stdout.write(
            f"{rounds} rounds x {calls} calls; load average {open('/proc/loadavg').read()[:14]}"
        )
        self.stdout.write("| variant | send transaction p50 ms | resume read (db_call) p50 ms |")
        self.stdout.write("|---|---|---|")
        for name, rows in results.items():
            cells = []
            for key in ("send_p50_ms", "resume_p50_ms"):
                v = [r[key] for r in rows]
                cells.append(f"{statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}]")
            self.stdout.write(f"| {name} | {cells[0]} | {cells[1]} |")

    def measure(self, calls: int) -> dict:
        from django.db import connection, transaction

        from accounts.models import User
        from billing.models import Tier
        from conversations import generations, reply_control
        from conversations.models import Conversation, Message
        from database.connections import db_call

        tier, _ = Tier.objects.get_or_create(
            name="bench-db-calls",
            defaults=dict(
                display_name="DB calls bench",
                model_name=Tier.objects.get(name="paid").model_name,
                requests_per_minute=1_000_000,
                tokens_per_day=1_000_000_000,
                max_reply_tokens=32,
                max_context_tokens=2048,
                max_concurrent_generations=1_000,
                admit_max_wait_s=3600,
            ),
        )
        user, _ = User.objects.get_or_create(username="bench-db-calls", defaults={"tier": tier})
        first = generations.reply_request(user=user, conversation_id=None, content="Hello")
        Message.objects.filter(pk=first.message.pk).update(status=Message.Status.COMPLETED)
        conversation_id, message_id = first.message.conversation_id, first.message.pk

        def send() -> float:
            started = time.perf_counter()
            try:
                with transaction.atomic():
                    generations.reply_request(
                        user=user,
                        conversation_id=conversation_id,
                        content="And then?",
                        client_id=str(uuid.uuid4()),
                    )
                    raise _Rollback
            except _Rollback:
                pass
            return (time.perf_counter() - started) * 1000

        async def resumes() -> list[float]:
            read = db_call(reply_control.reply_for_resume, thread_sensitive=False)
            times = []
            for _ in range(calls + 3):
                started = time.perf_counter()
                await read(user=user, message_id=message_id)
                times.append((time.perf_counter() - started) * 1000)
            return times[3:]

        try:
            sends = [send() for _ in range(calls + 3)][3:]
            connection.close()
            reads = asyncio.run(resumes())
        finally:
            Conversation.objects.filter(pk=conversation_id).delete()
        return {"send_p50_ms": statistics.median(sends), "resume_p50_ms": statistics.median(reads)}
