"""``manage.py bench_finish_cost``: what a reply's final write costs in-process (``generation_worker.generation_finish``
for a claimed reply of a new conversation, with the allowed output verdict every reply stores, as the GPU worker's
reply thread calls it), its statements, and the CPU of the process per final write (``time.process_time``: every
thread's, and on a VM the time their own system calls take) when the final writes run one after another and when
``--replies`` of them run at once on as many threads, as when a step of the engine ends that many replies together
(a 32-client wave ends in one or two steps). In the one-after-another pass each reply's context record
(``generation_worker.generation_set_context``, written after its first delta) runs before its final write and is
timed on its own: CPU p50 (``time.thread_time``) and its statements.
No worker is needed: an idle worker status is published for the run's own admission and the tasks its sends queue
are purged from the broker afterwards. ``--checkouts A,B`` measures each checkout's product code in turn (this
file run as a script in that directory), alternated ``--rounds`` times, as ``bench_send_cost`` does. A benchmark
that prints figures, not a test; ``docs/overhead-levers.md`` (levers 51, 52, 54, 58) holds them.

    manage.py bench_finish_cost --checkouts ../before,. --rounds 3 --replies 30
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "In-process cost of a reply's final write, one at a time and N at once; --checkouts compares two."

    def add_arguments(self, parser):
        parser.add_argument(
            "--replies", type=int, default=30, help="final writes per batch (threads at once)"
        )
        parser.add_argument("--rounds", type=int, default=3, help="runs per checkout, alternated")
        parser.add_argument("--checkouts", default="", help="comma-separated checkout directories")

    def handle(self, *args, replies, rounds, checkouts, **options):
        from devtools.checkouts import checkout_runs  # here: a --checkouts run imports this file alone

        runs = checkout_runs(__file__, measure, [replies], checkouts=checkouts, rounds=rounds)
        self.stdout.write(
            f"bench_finish_cost: {rounds} run(s) x {replies} final writes per checkout; load average "
            f"{open('/proc/loadavg').read()[:14]}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        self.stdout.write(
            "| checkout | statements | CPU per final write, one at a time, ms | CPU per final write, "
            f"{replies} at once, ms | wall of {replies} at once, ms | context record: CPU p50, ms "
            "(statements) |"
        )
        self.stdout.write("|---|---|---|---|---|---|")
        for d, rows in runs.items():
            cells = []
            for key in ("sequential_cpu_ms", "concurrent_cpu_ms", "concurrent_wall_ms", "context_cpu_ms"):
                v = [r[key] for r in rows]
                cells.append(f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]")
            cells[-1] += f" ({rows[-1]['context_statements']})"
            self.stdout.write(f"| {d} | {rows[-1]['statements']} | {' | '.join(cells)} |")


def measure(replies: int) -> dict:
    """One run: ``replies`` claimed replies written one after another, then ``replies`` more at once on as many
    threads; CPU per final write (ms) each way, the wall time of the concurrent batch, statements of one."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from accounts.models import User
    from conversations import generation_worker, generations, reply_runner
    from conversations.models import Conversation, Message
    from database.connections import close_request_connections
    from devtools.bench_tiers import bench_tier
    from memory.models import AccountMemory
    from safety.chain import Verdict

    helpers = _send_cost_module()  # this checkout's, whichever checkout is measured
    tier_name = "bench-finish-cost"
    helpers.publish_idle_worker(tier_name, max_num_seqs=replies + 1)
    tier = bench_tier(tier_name, display_name="Finish cost bench", max_tokens=32)
    user = User.objects.get_or_create(username=tier_name, defaults={"tier": tier})[0]
    AccountMemory.objects.update_or_create(user=user, defaults={"enabled": False})

    def claimed(n: int) -> list[Message]:
        out = []
        for _ in range(n):
            ticket = generations.reply_request(
                user=user, conversation_id=None, content="Say hello.", client_id=uuid.uuid4(), resend=False
            )
            close_request_connections()
            out.append(generation_worker.generation_start(message_id=ticket.message.pk))
        return out

    def verdict_stored(message: Message) -> dict:
        # As this checkout's reply runner hands it to the final write: a row of its statement (lever 54) or,
        # before, a hook that inserts it in its transaction.
        verdict = Verdict(stage="output", tier=tier_name)
        if hasattr(reply_runner, "_verdict_stored"):
            return reply_runner._verdict_stored(message, verdict, "")
        return {"on_written": reply_runner._recorder(message, verdict, "")}

    def finish(message: Message) -> None:
        generation_worker.generation_finish(
            **verdict_stored(message),
            message=message,
            status=Message.Status.COMPLETED,
            text="Hello there! How can I help you today?",
            finish_reason="length",
            prompt_tokens=36,
            completion_tokens=32,
            ttft_ms=20,
            duration_ms=900,
        )
        close_request_connections()

    def record(message: Message) -> float:
        """The reply's context record, as the runner writes it after the first delta; its CPU in s."""
        cpu = time.thread_time()
        generation_worker.generation_set_context(message=message, omitted=0, prompt_tokens=36)
        cpu = time.thread_time() - cpu
        close_request_connections()
        return cpu

    try:
        first, *batch = claimed(replies + 1)
        with CaptureQueriesContext(connection) as context_queries:
            record(first)
        with CaptureQueriesContext(connection) as queries:
            finish(first)
        contexts = []
        cpu = time.process_time()
        for message in batch:
            contexts.append(record(message))
            finish(message)
        sequential = ((time.process_time() - cpu) - sum(contexts)) * 1000 / len(batch)
        batch = claimed(replies)
        threads = [threading.Thread(target=finish, args=(m,)) for m in batch]
        cpu, wall = time.process_time(), time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        concurrent = (time.process_time() - cpu) * 1000 / len(batch)
        wall = (time.perf_counter() - wall) * 1000
    finally:
        Conversation.objects.filter(owner=user).delete()
        helpers.purge_model_queues()
    return {
        "statements": len(queries.captured_queries),
        "sequential_cpu_ms": sequential,
        "concurrent_cpu_ms": concurrent,
        "concurrent_wall_ms": wall,
        "context_cpu_ms": statistics.median(contexts) * 1000,
        "context_statements": len(context_queries.captured_queries),
    }


def _send_cost_module():
    """``bench_send_cost`` loaded from beside this file: its idle-worker status and queue purge, also when this
    file runs in an older checkout that lacks them."""
    path = Path(__file__).with_name("bench_send_cost.py")
    spec = importlib.util.spec_from_file_location("_bench_send_cost_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":  # a run for --checkouts, in the checkout measured (the working directory)
    sys.path[0] = os.getcwd()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    import django

    django.setup()
    print(json.dumps(measure(int(sys.argv[1]))))
