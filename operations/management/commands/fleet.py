"""``manage.py fleet``: the live workers, queue depths per tier and replies active by status."""

from django.core.management.base import BaseCommand

from inference import fleet
from inference.models import ModelRollout
from operations import health, selectors


class Command(BaseCommand):
    help = "Show live workers (host, model, backend, health, engine load, tokens/s, uptime), queued replies per tier and active replies."

    def handle(self, *args, **options):
        self.stdout.write(self.workers_table(fleet.live_workers()))
        self.stdout.write("")
        self.stdout.write(
            self.replies_summary(selectors.queued_by_tier(), selectors.active_replies_by_status())
        )
        self.stdout.write(self.broker_summary(self.broker_depths()))
        self.stdout.write(self.vector_store_summary(health.vector_store()))
        for rollout in ModelRollout.objects.order_by("model_name"):
            self.stdout.write(f"rollout {rollout}")

    @staticmethod
    def workers_table(workers: list[fleet.WorkerStatus]) -> str:
        """One line per worker, or a line saying there is none."""
        if not workers:
            return "no live worker"
        header = (
            f"{'worker':<28} {'node':<24} {'model':<32} {'backend':<7} {'state':<9} {'run':>5} {'wait':>5} "
            f"{'kv%':>5} {'tok/s':>7} {'uptime':>8} metrics  health"
        )
        lines = [header]
        for w in workers:
            state = "draining" if w.draining else ("ready" if w.ready else "loading")
            if w.health != "ok":
                state = "failed"
            model = f"{w.model}@{w.model_version}" if w.model_version else w.model
            lines.append(
                f"{w.worker_id:<28} {w.node or '-':<24} {model:<32} {w.backend:<7} {state:<9} {w.running:>5} "
                f"{w.waiting:>5} {w.kv_cache_usage * 100:>5.1f} {w.decode_tokens_per_s:>7.1f} {w.uptime_s:>7.0f}s "
                f"{w.metrics_port or '-':<8} {w.health}"
            )
        return "\n".join(lines)

    @staticmethod
    def broker_depths() -> dict[str, int | None]:
        """Messages ready in each known inference queue (passive declare; ``None`` where it failed)."""
        from celery import current_app

        depths: dict[str, int | None] = {}
        try:
            with current_app.connection_for_write() as conn:
                for name, queue in sorted(current_app.amqp.queues.items()):
                    try:
                        depths[name] = queue(conn.default_channel).queue_declare(passive=True).message_count
                    except Exception:
                        depths[name] = None
        except Exception:
            pass
        return depths

    @staticmethod
    def vector_store_summary(status: dict | str) -> str:
        """One line: memory's vector backend, vectors held and chunks awaiting embedding."""
        if isinstance(status, str):
            return f"vector store: {status}"
        return (
            f"vector store: {status['backend']}, {status['vectors']} vectors, "
            f"{status['pending']} chunks awaiting embedding"
        )

    @staticmethod
    def broker_summary(depths: dict[str, int | None]) -> str:
        """One line: messages waiting in each broker queue."""
        parts = [f"{name}={'?' if n is None else n}" for name, n in depths.items()]
        return "broker queues: " + (", ".join(parts) or "unreachable")

    @staticmethod
    def replies_summary(queued_by_tier: dict[str, int], active: dict[str, int]) -> str:
        """Queue depth per tier and active replies by status."""
        tiers = ", ".join(f"{tier}={n}" for tier, n in sorted(queued_by_tier.items())) or "none"
        states = ", ".join(f"{status}={n}" for status, n in active.items())
        return f"queued per tier: {tiers}\nactive replies: {states}"
