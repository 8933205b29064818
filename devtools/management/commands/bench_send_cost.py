"""``manage.py bench_send_cost``: what a page ``send``'s service costs in-process (``generations.reply_request``
for a new conversation, committed, as the consumer calls it), wall and CPU time (``time.thread_time``, which
on a VM also counts the time the thread's own system calls take) and its SQL statements, p50 per run. No
worker is needed: an idle worker status is published for the run's own admission and the tasks it sends are
purged from the broker afterwards. ``--checkouts A,B`` measures each checkout's product code in turn (this file
run as a script in that directory, so a checkout from before this command was written can be measured too),
one short run after another, so that two versions of the product meet the same drift of a shared machine:
their runs alternate ``--rounds`` times. A benchmark that prints figures, not a test; ``docs/overhead.md``
holds them.

    manage.py bench_send_cost --checkouts ../before,. --rounds 8 --sends 40
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import asdict

from django.core.management.base import BaseCommand

TIER = "bench-send-cost"


class Command(BaseCommand):
    help = "In-process cost of a send's service (wall, CPU, statements); --checkouts compares two checkouts."

    def add_arguments(self, parser):
        parser.add_argument("--sends", type=int, default=40, help="timed sends per run")
        parser.add_argument("--rounds", type=int, default=1, help="runs per checkout, alternated")
        parser.add_argument("--checkouts", default="", help="comma-separated checkout directories")

    def handle(self, *args, sends, rounds, checkouts, **options):
        from devtools.checkouts import checkout_runs  # here: a --checkouts run imports this file alone

        runs = checkout_runs(__file__, measure, [sends], checkouts=checkouts, rounds=rounds)
        self.stdout.write(
            f"bench_send_cost: {rounds} run(s) x {sends} sends per checkout; load average "
            f"{open('/proc/loadavg').read()[:14]}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        self.stdout.write("| checkout | wall p50 ms | CPU p50 ms | statements | per run (wall / CPU) |")
        self.stdout.write("|---|---|---|---|---|")
        for d, rows in runs.items():
            cells = []
            for key in ("wall_ms", "cpu_ms"):
                v = [r[key] for r in rows]
                cells.append(f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]")
            each = ", ".join(f"{r['wall_ms']:.1f}/{r['cpu_ms']:.1f}" for r in rows)
            self.stdout.write(f"| {d} | {cells[0]} | {cells[1]} | {rows[-1]['statements']} | {each} |")


def measure(sends: int) -> dict:
    """One run: ``sends`` timed sends after 5 untimed ones; p50 wall and CPU (ms), statements of the last."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from accounts.models import User
    from conversations import generations
    from conversations.models import Conversation, Message
    from database.connections import close_request_connections
    from devtools.bench_tiers import bench_tier
    from memory.models import AccountMemory

    publish_idle_worker(TIER, max_num_seqs=32)
    tier = bench_tier(TIER, display_name="Send cost bench", max_tokens=32)
    user = User.objects.get_or_create(username=TIER, defaults={"tier": tier})[0]
    AccountMemory.objects.update_or_create(user=user, defaults={"enabled": False})
    walls, cpus, statements = [], [], 0
    try:
        for i in range(sends + 5):
            close_request_connections()  # as each consumer call ends: the pool takes it back
            with CaptureQueriesContext(connection) as queries:
                wall, cpu = time.perf_counter(), time.thread_time()
                ticket = generations.reply_request(
                    user=user,
                    conversation_id=None,
                    content="Say hello.",
                    client_id=uuid.uuid4(),
                    resend=False,
                )
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            Message.objects.filter(pk=ticket.message.pk).update(status=Message.Status.COMPLETED)
            if i >= 5:
                walls.append(wall * 1000)
                cpus.append(cpu * 1000)
                statements = len(queries.captured_queries)
    finally:
        Conversation.objects.filter(owner=user).delete()
        purge_model_queues()
    return {"wall_ms": statistics.median(walls), "cpu_ms": statistics.median(cpus), "statements": statements}


def publish_idle_worker(host: str, *, max_num_seqs: int) -> None:
    """Publish an idle, ready worker status per configured model (for 120 s), as the database tests do, so that
    the run's own sends are admitted without a worker."""
    from django.conf import settings

    from events import broadcast
    from inference import fleet

    for model in settings.INFERENCE_MODELS:
        status = fleet.WorkerStatus(
            worker_id=f"{host}-{model}", host=host, pid=0, model=model, ready=True, max_num_seqs=max_num_seqs
        )
        status.updated_at = time.time()
        broadcast.redis_client().set(fleet.status_key(status.worker_id), json.dumps(asdict(status)), ex=120)


def purge_model_queues() -> None:
    """Drop the tasks the run sent (no worker was meant to take them)."""
    from celery import current_app

    with current_app.connection_for_write() as conn:
        for queue in current_app.amqp.queues.values():
            bound = queue(conn.default_channel)
            bound.declare()
            bound.purge()


if __name__ == "__main__":  # a run for --checkouts, in the checkout measured (the working directory)
    sys.path[0] = os.getcwd()  # the checkout measured, not this file's directory
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    import django

    django.setup()
    print(json.dumps(measure(int(sys.argv[1]))))
