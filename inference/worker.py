"""The worker host: one per Celery worker process, holding one continuously batched engine.

Celery runs the worker with ``--pool threads``: every task thread submits its request to this process's
single :class:`~inference.engine.LLMEngine`, whose loop thread batches them together. Beside the engine the
host runs three small daemon threads:

* a **cancel listener** (Redis pub/sub on ``broadcast.CANCEL_CHANNEL``) that cancels a local request the
  moment a user presses Stop, so its slot and KV cache are freed at the next engine step;
* a **lease heartbeat** that keeps ``broadcast.lease_key(id)`` alive for every reply this process owns;
* a **reaper** that marks replies whose lease vanished (their worker was killed) as ``interrupted``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import contextmanager

from django.conf import settings
from django.db import close_old_connections

from conversations import broadcast
from conversations.generations import generations_reap_interrupted
from inference.engine import LLMEngine
from inference.registry import engine_config, model_spec

logger = logging.getLogger(__name__)

LEASE_TTL_S = broadcast.LEASE_TTL_S
LEASE_REFRESH_S = 2.0
REAPER_INTERVAL_S = 5.0


class WorkerHost:
    """Owns the engine and the replies this process is generating (``active``: message id -> request id)."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.hostname = socket.gethostname()
        self._active: dict[int, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._redis = broadcast.redis_client()

    def start(self) -> WorkerHost:
        self.engine.start()
        for target, name in (
            (self._cancel_loop, "cancel-listener"),
            (self._heartbeat_loop, "lease-heartbeat"),
            (self._reaper_loop, "reaper"),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()
        return self

    def shutdown(self) -> None:
        self._stop.set()
        self.engine.shutdown(timeout=5)

    @contextmanager
    def track(self, message_id: int):
        """Hold the lease of ``message_id`` while the block runs; yields the engine request id."""
        request_id = f"msg-{message_id}"
        with self._lock:
            self._active[message_id] = request_id
        self._redis.set(broadcast.lease_key(message_id), self.hostname, ex=LEASE_TTL_S)
        try:
            yield request_id
        finally:
            with self._lock:
                self._active.pop(message_id, None)
            self._redis.delete(broadcast.lease_key(message_id))

    def cancel(self, message_id: int) -> bool:
        with self._lock:
            request_id = self._active.get(message_id)
        return request_id is not None and self.engine.cancel(request_id)

    def _cancel_loop(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(broadcast.CANCEL_CHANNEL)
                for item in pubsub.listen():
                    if self._stop.is_set():
                        return
                    try:
                        self.cancel(int(item["data"]))
                    except (TypeError, ValueError):
                        continue
            except Exception:  # Redis restarts must not kill Stop for the rest of the process's life
                logger.exception("cancel listener failed; reconnecting")
                time.sleep(1)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(LEASE_REFRESH_S):
            with self._lock:
                ids = list(self._active)
            if not ids:
                continue
            try:
                pipe = self._redis.pipeline(transaction=False)
                for message_id in ids:
                    pipe.set(broadcast.lease_key(message_id), self.hostname, ex=LEASE_TTL_S)
                pipe.execute()
            except Exception:
                logger.exception("lease heartbeat failed")

    def _reaper_loop(self) -> None:
        while not self._stop.wait(REAPER_INTERVAL_S):
            try:
                close_old_connections()
                reap_interrupted()
            except Exception:
                logger.exception("reaper failed")


def reap_interrupted(grace_s: float = LEASE_TTL_S) -> list[int]:
    """Mark replies whose worker died as ``interrupted`` (see ``generations_reap_interrupted``)."""
    reaped = generations_reap_interrupted(grace_s=grace_s)
    if reaped:
        logger.warning("marked %d reply(ies) interrupted: %s", len(reaped), reaped)
    return reaped


_host: WorkerHost | None = None
_host_lock = threading.Lock()


def get_host() -> WorkerHost:
    """This process's :class:`WorkerHost`, loading the default model on first use (seconds)."""
    global _host
    with _host_lock:
        if _host is None:
            started = time.monotonic()
            engine = LLMEngine.from_spec(model_spec(), engine_config(), settings.MODEL_CACHE_DIR)
            _host = WorkerHost(engine).start()
            logger.info("engine ready in %.1f s", time.monotonic() - started)
        return _host
