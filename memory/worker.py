"""The embeddings worker's Celery app: ``celery -A memory.worker worker -Q embeddings.query,embeddings``
(Procfile ``embeddings:``).

A Celery app of its own that discovers only memory's and documents' tasks, so this process never loads a chat engine (the
GPU workers' start-up hook lives in the inference tasks, not imported here). At start it loads the
embedding model and serves its Prometheus metrics on ``EMBEDDINGS_METRICS_PORT``. Scale by running more of
these processes (each loads its own copy of the model, ~90 MB of weights), each with its own
``EMBEDDINGS_METRICS_PORT`` (docs/memory.md, "Scaling the embeddings workers").
"""

import logging
import os

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")

logger = logging.getLogger(__name__)

app = Celery("chatsite-embeddings")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["memory", "documents"])  # documents: processing uploaded files


@worker_ready.connect
def load_model_at_start(sender=None, **kwargs):
    """Load the model before the first task, and export the worker's metrics."""
    from django.conf import settings
    from prometheus_client import start_http_server

    from memory import metrics
    from memory.runtime import get_batcher
    from memory.selectors import store_status
    from observability.gc_pauses import startup_done

    batcher = get_batcher()

    def queue_depths() -> dict[str, int]:
        depths = {}
        with app.connection_for_read() as conn:
            channel = conn.default_channel
            for name in ("embeddings.query", "embeddings"):
                depths[name] = channel.queue_declare(queue=name, passive=True).message_count
        return depths

    def index_size() -> tuple[str, int]:
        from django.db import close_old_connections

        status = store_status()
        close_old_connections()
        return status["backend"], status["vectors"]

    metrics.register_embeddings_collector(
        metrics.EmbeddingsCollector(
            queue_depths=queue_depths, batcher_pending=batcher.pending, index_size=index_size
        )
    )
    if settings.EMBEDDINGS_METRICS_PORT is not None:
        try:
            server, _thread = start_http_server(
                settings.EMBEDDINGS_METRICS_PORT, addr=settings.METRICS_WORKER_ADDR
            )
        except OSError as exc:  # a second worker on this host: give each its own port, or 0 for a free one
            logger.warning(
                "embeddings metrics not served on port %s: %s", settings.EMBEDDINGS_METRICS_PORT, exc
            )
        else:
            logger.info("embeddings metrics on port %s", server.server_port)
    logger.info("embeddings worker ready (%s)", store_status()["backend"])
    startup_done(freeze=settings.GC_FREEZE_AT_START)  # the embedding model's heap: lever 38
