"""``manage.py load_signal_bench [--rounds 200]``: what each input of admission control costs to read.

Prints median [min-max] and p99 in milliseconds, over ``--rounds`` reads, of:

* the fleet read (Redis SCAN + MGET of every worker's status, ``inference.fleet.live_workers``);
* the queued/streaming count per priority in PostgreSQL (``conversations.load.active_at_or_above``'s query);
* the broker's queue depth (RabbitMQ passive ``queue_declare`` through kombu: ``message_count``);
* one whole admission load decision through the 1 s cache (``admission.load_gate`` on a warm cache).

Run it against the stack it should describe (same settings as the web process).
"""

import statistics
import time

from celery import current_app
from django.conf import settings
from django.core.management.base import BaseCommand

from billing.models import Tier
from conversations import load
from conversations.admission import AdmissionRefused, load_gate
from inference import fleet
from inference.registry import queue_for


def _figures(samples_ms: list[float]) -> str:
    ordered = sorted(samples_ms)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * len(ordered) + 0.5)) - 1)]
    return f"{statistics.median(ordered):8.3f} [{ordered[0]:.3f}-{ordered[-1]:.3f}]  p99 {p99:8.3f}"


class Command(BaseCommand):
    help = "Time the reads admission control is built from (fleet in Redis, PostgreSQL count, broker depth)."

    def add_arguments(self, parser):
        parser.add_argument("--rounds", type=int, default=200)
        parser.add_argument(
            "--model", default=None, help="registered model (default INFERENCE_DEFAULT_MODEL)"
        )

    def handle(self, *args, rounds, model, **options):
        model = model or settings.INFERENCE_DEFAULT_MODEL
        tier = Tier.objects.get(name="free")

        def gate():
            try:
                load_gate(tier=tier)
            except AdmissionRefused:
                pass

        with current_app.connection_for_write() as conn:
            queue = current_app.amqp.queues[queue_for(model)](conn.default_channel)

            def broker_depth():
                return queue.queue_declare(passive=True).message_count

            probes = {
                "fleet read (Redis SCAN+MGET)": fleet.live_workers,
                "PostgreSQL queued/streaming count": lambda: (
                    load.forget_reads(),
                    load.active_at_or_above(model_name=model, priority=0),
                ),
                "RabbitMQ passive queue_declare": broker_depth,
                "admission load gate, warm 1 s cache": gate,
            }
            self.stdout.write(f"{rounds} rounds; ms: median [min-max]  p99")
            for label, probe in probes.items():
                probe()  # warm connections
                if label.startswith("admission"):
                    load.forget_reads()
                    gate()
                samples = []
                for _ in range(rounds):
                    started = time.perf_counter()
                    probe()
                    samples.append((time.perf_counter() - started) * 1000)
                self.stdout.write(f"{label:40} {_figures(samples)}")
            self.stdout.write(
                f"live workers: {len(fleet.live_workers())}; broker depth now: {broker_depth()}"
            )
