"""The worker host: one per Celery worker process, holding one continuously batched engine.

Celery runs the worker with ``--pool threads``: every task thread submits its request to this process's
single engine, a :class:`~inference.backends.base.ServingEngine` (the native engine's loop thread, or vLLM's
engine core process), which batches them together. Beside the engine the host runs small daemon threads:

* a **cancel listener** (Redis pub/sub on ``broadcast.CANCEL_CHANNEL``) that cancels a local request the
  moment a user presses Stop, so its slot and KV cache are freed at the next engine step;
* a **lease heartbeat** that keeps ``broadcast.lease_key(id)`` alive for every reply this process owns;
* a **reaper** that runs, every ``REAPER_INTERVAL_S``, the housekeeping hooks registered with
  :func:`reaper_register` (``conversations.reaper``: mark replies whose lease vanished ``interrupted`` and
  re-dispatch queued replies no broker message may deliver); the hooks live above this layer, so
  ``inference`` never imports ``conversations``;
* a **load publisher** that writes this worker's engine load to Redis once a second (``inference.fleet``),
  and again within a fraction of a second once a restarted Redis is back.

When the engine dies (vLLM's engine core process exits) the host stops announcing its model (``ready``
false, ``health`` says why), lets the replies it owns end (``interrupted`` with their text, or back to
``queued`` when nothing was generated), then asks Celery for a warm shutdown: unacknowledged tasks go back
to the broker, and the process supervisor starts a fresh worker.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from django.conf import settings
from django.db import close_old_connections

from events import broadcast
from inference import fleet
from inference.backends import EngineDead, ServingEngine
from inference.registry import model_version
from observability import tracing

logger = logging.getLogger(__name__)

LEASE_TTL_S = broadcast.LEASE_TTL_S
LEASE_REFRESH_S = 2.0
REAPER_INTERVAL_S = 2.0
#: Seconds a worker whose engine died waits for its replies to be written before it shuts down.
DEATH_GRACE_S = 10.0


class WorkerHost:
    """Owns the engine and the replies this process is generating (``active``: message id -> request id)."""

    def __init__(self, engine: ServingEngine, *, model_name: str = "", model_version: str = "", queues=()):
        self.engine = engine
        self.backend = getattr(engine, "backend", "native")
        self.hostname = socket.gethostname()
        self.worker_id = fleet.worker_id()
        self.model_name = model_name
        self.model_version = model_version
        self.queues = list(queues)
        self.started_at = time.time()
        self.draining = False
        self.metrics_port = 0  # set by inference.workerops when the metrics endpoint is up
        self.step_log = None  # set by inference.workerops when ENGINE_STEP_LOG names a file
        self.node = ""  # Celery node name
        self._decode_rate = fleet.DecodeRate()
        # Tokens streamed by this process's replies: the decode rate's source until the engine counts them.
        self._active: dict[int, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._redis = broadcast.redis_client()

    def start(self) -> WorkerHost:
        self.engine.start()
        if hasattr(self.engine, "on_death"):
            self.engine.on_death(self._engine_died)
        for target, name in (
            (self._cancel_loop, "cancel-listener"),
            (self._heartbeat_loop, "lease-heartbeat"),
            (self._reaper_loop, "reaper"),
            (self._publish_loop, "load-publisher"),
        ):
            threading.Thread(target=_untraced(target), name=name, daemon=True).start()
        return self

    def shutdown(self) -> None:
        self._stop.set()
        try:
            fleet.unpublish(self.worker_id, client=self._redis)
        except Exception:
            logger.warning("could not remove this worker's fleet status")
        try:
            self.engine.shutdown(timeout=5)
        except Exception:  # a dead engine may fail to stop cleanly; the process is leaving anyway
            logger.warning("engine shutdown failed", exc_info=True)

    def status(self) -> fleet.WorkerStatus:
        """This worker's current :class:`~inference.fleet.WorkerStatus` (engine load + identity).

        ``decode_tokens_per_s`` is the rate of the engine's ``decode_tokens_total`` counter over the last
        ~5 s of work (:class:`~inference.fleet.DecodeRate`), and the pending-token figures come from the
        engine's load, where the engine reports them."""
        load = self.engine.load()
        health = self.health()
        now = time.monotonic()
        idle = load.running == 0 and load.waiting == 0
        tps = self._decode_rate.observe(now, load.decode_tokens_total, idle=idle)
        with self._lock:
            active = len(self._active)
        return fleet.WorkerStatus(
            worker_id=self.worker_id,
            host=self.hostname,
            pid=os.getpid(),
            model=self.model_name,
            model_version=self.model_version,
            queues=self.queues,
            started_at=self.started_at,
            ready=not self._stop.is_set() and health == "ok",
            draining=self.draining,
            waiting=load.waiting,
            running=load.running,
            kv_used_tokens=load.kv_used_tokens,
            kv_total_tokens=load.kv_total_tokens,
            max_num_seqs=load.max_num_seqs,
            decode_tokens_per_s=round(tps, 2),
            pending_prompt_tokens=getattr(load, "pending_prefill_tokens", 0),
            pending_reply_tokens=getattr(load, "pending_decode_tokens", 0),
            active_replies=active,
            metrics_port=self.metrics_port,
            node=self.node,
            backend=self.backend,
            health=health,
        )

    def health(self) -> str:
        """``"ok"`` or why this worker's engine serves nothing (:meth:`ServingEngine.health`)."""
        check = getattr(self.engine, "health", None)
        return check() if check is not None else "ok"

    def _engine_died(self, reason: str) -> None:
        """The engine's death listener: leave the fleet's ready set at once, give the replies this process owns
        up to ``DEATH_GRACE_S`` seconds to be written (their streams raise ``EngineDead``), then a warm shutdown
        (SIGTERM to this process: Celery stops consuming and returns unacknowledged tasks to the broker)."""
        logger.error("engine died (%s): leaving the fleet and shutting down", reason)
        try:
            fleet.publish(self.status(), client=self._redis)
        except Exception:
            logger.warning("could not publish this worker's failed status")
        deadline = time.monotonic() + DEATH_GRACE_S
        while time.monotonic() < deadline:
            with self._lock:
                if not self._active:
                    break
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    @contextmanager
    def track(self, message_id: int, *, lease: bool = True):
        """Hold the lease of ``message_id`` while the block runs; yields the engine request id. ``lease``
        False: the caller takes the lease itself in its first Redis round trip (the reply runner, with its
        ``started`` frame: ``broadcast.publish_started``, lever 44); the heartbeat refreshes it from the next
        beat either way, and the lease is released when the block ends."""
        request_id = f"msg-{message_id}"
        with self._lock:
            self._active[message_id] = request_id
        if lease:
            self._redis.set(broadcast.lease_key(message_id), self.worker_id, ex=LEASE_TTL_S)
        try:
            yield request_id
        finally:
            with self._lock:
                self._active.pop(message_id, None)
            try:
                self._redis.delete(broadcast.lease_key(message_id))
            except Exception:  # Redis down: the lease expires by its TTL
                logger.warning("could not release the lease of message %s", message_id)

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
                    pipe.set(broadcast.lease_key(message_id), self.worker_id, ex=LEASE_TTL_S)
                pipe.execute()
            except Exception:
                logger.exception("lease heartbeat failed")

    def _publish_loop(self) -> None:
        fleet.publish_forever(self.status, stop=self._stop, client=self._redis)

    def _reaper_loop(self) -> None:
        while not self._stop.wait(REAPER_INTERVAL_S):
            try:
                close_old_connections()
            except Exception:
                logger.exception("reaper could not close its database connections")
            for hook in list(_reaper_hooks):
                try:
                    hook()
                except Exception:
                    logger.exception("reaper hook %s failed", getattr(hook, "__qualname__", hook))


def _untraced(target):
    """Run a housekeeping loop with the tracing instrumentations off: a Redis or SQL span every second from
    the heartbeat, publisher or reaper would be a trace of its own and bury the replies' traces."""

    def run():
        with tracing.quiet():
            target()

    return run


_reaper_hooks: list[Callable[[], object]] = []


def reaper_register(hook: Callable[[], object]) -> None:
    """Run ``hook()`` (no arguments, result ignored, exceptions logged) on every worker host's reaper
    thread every ``REAPER_INTERVAL_S`` seconds, after this thread's stale database connections are closed.
    Registering the same hook twice runs it once."""
    if hook not in _reaper_hooks:
        _reaper_hooks.append(hook)


_host: WorkerHost | None = None
_host_lock = threading.Lock()


def current_host() -> WorkerHost | None:
    """This process's :class:`WorkerHost` if its engine was loaded (:func:`get_host`), else ``None``;
    never loads one."""
    return _host


def get_host(*, queues: list[str] | None = None) -> WorkerHost:
    """This process's :class:`WorkerHost`, loading the default model on its backend on first use (seconds;
    minutes for vLLM). ``queues``: the broker queues this worker consumes, published with its fleet status.

    Raises:
        EngineDead: the model failed to load (this and every later call; the worker must be restarted).
    """
    global _host, _load_failure
    with _host_lock:
        if _load_failure:
            raise EngineDead(_load_failure)
        if _host is None:
            from inference.backends.build import backend_for, engine_build

            started = time.monotonic()
            name = settings.INFERENCE_DEFAULT_MODEL  # announced as served, an alias included
            try:
                engine = engine_build(name)
            except Exception as exc:
                _load_failure = f"model failed to load: {exc}"
                _publish_failure(name, backend_for(name), queues or [], _load_failure)
                raise EngineDead(_load_failure) from exc
            _host = WorkerHost(
                engine, model_name=name, model_version=model_version(name), queues=queues or []
            ).start()
            logger.info("engine ready in %.1f s (backend %s)", time.monotonic() - started, _host.backend)
            # For `make run`: the last start-up line a newcomer needs.
            logger.info("chatsite is ready: open %s in your browser", settings.SITE_URL)
        return _host


_load_failure = ""


def _publish_failure(model: str, backend: str, queues: list[str], reason: str) -> None:
    """Show a worker whose model failed to load in the fleet (not ready, ``health`` = why) until it exits."""
    try:
        fleet.publish(
            fleet.WorkerStatus(
                worker_id=fleet.worker_id(),
                host=socket.gethostname(),
                pid=os.getpid(),
                model=model,
                queues=queues,
                started_at=time.time(),
                backend=backend,
                health=reason,
            )
        )
    except Exception:
        logger.warning("could not publish this worker's failed status")
