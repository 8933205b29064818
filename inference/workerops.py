"""Worker-process side of observability and fleet operations, wired to Celery signals by
``inference/worker_signals.py``: the Prometheus endpoint and engine collector, the versioned queue of a
blue-green rollout, and draining (``manage.py drain`` or SIGTERM).

Draining, two ways that behave the same:

* ``manage.py drain WORKER``: remote control ``cancel_consumer`` for each queue of the worker (it takes no
  new task), then :func:`chatsite_mark_draining` (fleet status and ``/readyz`` show it), wait until its
  active replies are 0, then remote ``shutdown``;
* SIGTERM: Celery's warm shutdown stops consuming and waits for running task threads
  (``ThreadPoolExecutor.shutdown``); :func:`on_worker_shutting_down` marks the worker draining at once.

Either way running replies finish; tasks the worker had reserved but not started are not acknowledged
(late acks) and the broker redelivers them to another worker when the connection closes. A worker killed
hard is still handled by the lease and reaper (``inference/worker.py``).
"""

from __future__ import annotations

import logging

from celery.worker.control import control_command
from django.conf import settings

from inference import fleet
from inference.registry import queue_for, queue_options
from observability import metrics, step_log

logger = logging.getLogger(__name__)


def on_worker_ready(consumer, host) -> None:
    """After the engine is loaded: consume this version's queue (when versioned), export the engine's
    gauges, write its step log when ``ENGINE_STEP_LOG`` names a file (one it cannot open is logged as an
    error and the worker serves without it) and serve this process's metrics on ``METRICS_WORKER_PORT``."""
    host.node = getattr(consumer, "hostname", "") or ""
    if host.model_version:
        queue = queue_for(host.model_name, host.model_version)
        if queue not in host.queues:
            options = queue_options(queue)
            consumer.add_task_queue(
                queue,
                exchange=options["exchange"].name,
                exchange_type="direct",
                routing_key=options["routing_key"],
                queue_arguments=options["queue_arguments"],
            )
            host.queues.append(queue)
            logger.info("consuming version queue %s", queue)
    metrics.register_engine(host)
    start_step_log(host)
    if settings.METRICS_WORKER_PORT is not None and not host.metrics_port:
        host.metrics_port = metrics.start_worker_endpoint(
            settings.METRICS_WORKER_PORT, settings.METRICS_WORKER_ADDR
        )
    _publish_now(host)


def start_step_log(host) -> None:
    """Add an :class:`observability.step_log.StepLog` of ``ENGINE_STEP_LOG`` to ``host``'s engine, once (a
    no-op when the setting is empty or the host has one). A file that cannot be opened is logged as an error
    and the worker serves without a step log."""
    if not settings.ENGINE_STEP_LOG or host.step_log is not None:
        return
    try:
        host.step_log = step_log.StepLog(settings.ENGINE_STEP_LOG)
    except OSError:
        logger.error("cannot open ENGINE_STEP_LOG %s; no step log", settings.ENGINE_STEP_LOG, exc_info=True)
        return
    host.engine.add_step_listener(host.step_log)
    logger.info("engine step log: %s", settings.ENGINE_STEP_LOG)


def mark_draining(host) -> int:
    """Flag ``host`` as draining (fleet status, ``/readyz``); returns its active replies."""
    host.draining = True
    _publish_now(host)
    return host.status().active_replies


def _publish_now(host) -> None:
    try:
        fleet.publish(host.status())
    except Exception:
        logger.warning("could not publish the fleet status", exc_info=True)


def on_worker_shutting_down(**_) -> None:
    """Celery ``worker_shutting_down`` (SIGTERM, remote shutdown): this worker is draining."""
    from inference.worker import current_host

    host = current_host()
    if host is not None:
        logger.info("shutting down: draining %d active reply(ies)", mark_draining(host))


def on_worker_shutdown(**_) -> None:
    """Celery ``worker_shutdown`` (after running tasks finished): leave the fleet at once, stop the engine."""
    from inference.worker import current_host

    host = current_host()
    if host is not None:
        host.shutdown()


@control_command()
def chatsite_mark_draining(state):
    """Remote control: flag this worker as draining. Replies ``{"ok": worker_id, "active_replies": n}``."""
    from inference.worker import current_host

    host = current_host()
    if host is None:
        return {"error": "no engine loaded"}
    return {"ok": host.worker_id, "active_replies": mark_draining(host)}
