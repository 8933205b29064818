"""``manage.py drain WORKER``: the worker takes no new task, finishes its running replies, then exits."""

import time

from celery import current_app
from django.core.management.base import BaseCommand, CommandError

from inference import fleet


class Command(BaseCommand):
    help = (
        "Drain a worker (fleet id host:pid, Celery node name, or host when it runs one worker): cancel its "
        "queue consumers, mark it draining, wait for its active replies to finish, then shut it down. "
        "Tasks it had reserved but not started go back to the broker for the other workers."
    )

    def add_arguments(self, parser):
        parser.add_argument("worker")
        parser.add_argument(
            "--timeout", type=float, default=600.0, help="seconds to wait for running replies"
        )
        parser.add_argument("--no-shutdown", action="store_true", help="stop consuming but keep the process")

    def handle(self, *args, worker, timeout, no_shutdown, **options):
        status = self.resolve(worker)
        self.stdout.write(
            f"draining {status.worker_id} ({status.node}), {status.active_replies} active reply(ies)"
        )
        for queue in self.cancel_queues(status):
            self.stdout.write(f"  stopped consuming {queue}")
        self.mark_draining(status)
        remaining = self.wait_idle(status, timeout=timeout)
        if remaining:
            raise CommandError(
                f"{remaining} reply(ies) still running after {timeout:.0f} s; not shutting down"
            )
        if no_shutdown:
            self.stdout.write("idle; left running (--no-shutdown)")
            return
        self.shutdown(status)
        self.stdout.write("idle; shutdown sent")

    # Steps (each testable on its own) ---------------------------------------------------------------------

    @staticmethod
    def resolve(worker: str) -> fleet.WorkerStatus:
        """The live worker named by fleet id, Celery node name or (unambiguous) host."""
        workers = fleet.live_workers()
        exact = [w for w in workers if worker in (w.worker_id, w.node)]
        matches = exact or [w for w in workers if w.host == worker]
        if not matches:
            known = ", ".join(f"{w.worker_id} ({w.node})" for w in workers) or "none"
            raise CommandError(f"no live worker {worker!r}; live: {known}")
        if len(matches) > 1:
            raise CommandError(f"{worker!r} names {len(matches)} workers; use the fleet id (host:pid)")
        if not matches[0].node:
            raise CommandError(f"worker {matches[0].worker_id} has not announced its Celery node name")
        return matches[0]

    @staticmethod
    def cancel_queues(status: fleet.WorkerStatus) -> list[str]:
        """Remote control ``cancel_consumer`` for each queue the worker consumes; returns those confirmed."""
        done = []
        for queue in status.queues:
            replies = current_app.control.cancel_consumer(
                queue, destination=[status.node], reply=True, timeout=5
            )
            if not replies:
                raise CommandError(f"{status.node} did not answer cancel_consumer({queue})")
            done.append(queue)
        return done

    @staticmethod
    def mark_draining(status: fleet.WorkerStatus) -> None:
        """Flag the worker as draining (fleet status, ``/readyz``)."""
        current_app.control.broadcast(
            "chatsite_mark_draining", destination=[status.node], reply=True, timeout=5
        )

    @staticmethod
    def active_replies(status: fleet.WorkerStatus) -> int | None:
        """The worker's active replies from its fleet status; ``None`` once it is gone."""
        for w in fleet.live_workers():
            if w.worker_id == status.worker_id:
                return w.active_replies
        return None

    def wait_idle(self, status: fleet.WorkerStatus, *, timeout: float, poll_s: float = 1.0) -> int:
        """Wait until the worker owns no reply (or vanished); returns the replies still running at timeout."""
        deadline = time.monotonic() + timeout
        while True:
            active = self.active_replies(status)
            if not active:
                return 0
            if time.monotonic() >= deadline:
                return active
            time.sleep(poll_s)

    @staticmethod
    def shutdown(status: fleet.WorkerStatus) -> None:
        """Remote control ``shutdown`` (a warm shutdown of that node)."""
        current_app.control.shutdown(destination=[status.node])
