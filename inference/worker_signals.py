"""A GPU worker's lifecycle, wired to Celery signals: load the engine at start, then
:mod:`inference.workerops` (version queue, metrics endpoint, draining, shutdown). Imported by the worker's
autodiscovery (``chatsite/celery.py``: ``related_name="worker_signals"``)."""

from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

from inference import workerops  # registers the chatsite_mark_draining remote-control command


@worker_ready.connect
def load_engine_at_start(sender=None, **kwargs):
    """Load the model when the worker starts, not on the first user's request."""
    import logging
    import os
    import signal

    from django.conf import settings

    from inference.backends import EngineDead
    from inference.worker import get_host
    from observability.gc_pauses import startup_done

    try:
        queues = [q.name for q in sender.task_consumer.queues]
    except AttributeError:
        queues = []
    try:
        host = get_host(queues=queues)
    except EngineDead:
        # The fleet shows why (health); a warm shutdown hands every reserved task back to the broker, and the
        # process supervisor decides whether to try again.
        logging.getLogger(__name__).exception("the model failed to load; shutting down")
        os.kill(os.getpid(), signal.SIGTERM)
        return
    workerops.on_worker_ready(sender, host)
    # The model's and start-up's heap out of the garbage collector's full collections, which paused the
    # engine's step loop (lever 38). After this worker has published its status: the freeze's own collection
    # (~275 ms) must not hold back the status that admission waits for once the engine is ready.
    startup_done(freeze=settings.GC_FREEZE_AT_START)


worker_shutting_down.connect(workerops.on_worker_shutting_down)
worker_shutdown.connect(workerops.on_worker_shutdown)
