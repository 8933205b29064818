"""Celery tasks of the GPU workers. Thin: parse, call the adapter."""

from celery import shared_task
from celery.signals import worker_ready
from django.db import InterfaceError, OperationalError


@shared_task(
    name="inference.generate_reply",
    acks_late=True,
    ignore_result=True,
    # PostgreSQL unreachable before the claim: try again shortly (the claim makes a retry harmless).
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,
    retry_backoff_max=10,
    max_retries=6,
)
def generate_reply(message_id: int) -> str:
    """Generate one queued assistant reply (``message_id``: a ``conversations.Message`` pk)."""
    from inference.adapter import run_generation

    return run_generation(message_id=int(message_id))


@worker_ready.connect
def load_engine_at_start(sender=None, **kwargs):
    """Load the model when the worker starts, not on the first user's request."""
    from inference.worker import get_host

    try:
        queues = [q.name for q in sender.task_consumer.queues]
    except AttributeError:
        queues = []
    get_host(queues=queues)
