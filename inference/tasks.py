"""Celery tasks of the GPU workers. Thin: parse, call the adapter."""

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown, worker_shutting_down
from django.db import InterfaceError, OperationalError

from observability import workerops  # registers the chatsite_mark_draining remote-control command


@shared_task(
    name="inference.generate_reply",
    acks_late=True,
    ignore_result=True,
    bind=True,
    # PostgreSQL unreachable before the claim: try again shortly (the claim makes a retry harmless).
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,
    retry_backoff_max=10,
    max_retries=6,
)
def generate_reply(self, message_id: int) -> str:
    """Generate one queued assistant reply (``message_id``: a ``conversations.Message`` pk). The web
    request's ``request_id`` header goes into this task's log context."""
    from inference.adapter import run_generation
    from observability.logs import log_context

    with log_context(request_id=getattr(self.request, "request_id", None) or None):
        return run_generation(message_id=int(message_id))


@worker_ready.connect
def load_engine_at_start(sender=None, **kwargs):
    """Load the model when the worker starts, not on the first user's request."""
    from inference.worker import get_host

    try:
        queues = [q.name for q in sender.task_consumer.queues]
    except AttributeError:
        queues = []
    workerops.on_worker_ready(sender, get_host(queues=queues))


worker_shutting_down.connect(workerops.on_worker_shutting_down)
worker_shutdown.connect(workerops.on_worker_shutdown)
