"""Celery tasks of the GPU workers that belong to a reply's life. Thin: parse, call the reply runner.

The task keeps the name ``inference.generate_reply`` under which the web processes send it
(``reply_dispatch.GENERATE_TASK``), so messages already queued under that name still route. The worker's own
lifecycle (engine load, draining, shutdown) is wired in ``inference/worker_signals.py``.
"""

from celery import shared_task
from celery.signals import worker_init
from django.db import InterfaceError, OperationalError


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
    from celery.exceptions import Reject

    from conversations.reply_runner import run_generation
    from inference.backends import EngineDead
    from observability.logs import log_context

    with log_context(request_id=getattr(self.request, "request_id", None) or None):
        try:
            return run_generation(message_id=int(message_id))
        except EngineDead as exc:
            # This worker's engine is gone and the reply is (still or again) queued: the message goes back to
            # the broker for a live worker, never acknowledged as done.
            raise Reject(str(exc), requeue=True) from exc


@worker_init.connect
def register_reaper(sender=None, **kwargs):
    """Before the worker starts: its host's reaper thread runs :func:`conversations.reaper.reap_interrupted`
    every ``REAPER_INTERVAL_S`` (imported here, not at module level, so web processes that send this
    module's task never import the engine)."""
    from conversations.reaper import reap_interrupted
    from inference.worker import reaper_register

    reaper_register(reap_interrupted)


@worker_init.connect
def load_guards(sender=None, **kwargs):
    """Before the worker starts: the output guard chain (:func:`safety.chain.guards_loaded`), so a
    misconfigured guard stops the worker and the first reply's first sentence does not wait for the load."""
    from safety.chain import guards_loaded

    guards_loaded()
