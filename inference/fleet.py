"""The fleet registry: every worker process publishes its engine's load to Redis about once a second.

Each worker writes one JSON document under ``chatsite:worker:<worker_id>`` with a TTL of
:data:`STATUS_TTL_S` seconds, refreshed every :data:`PUBLISH_INTERVAL_S`. A worker that dies stops
refreshing, so its key expires and it drops out of :func:`live_workers` within seconds: no explicit
deregistration is needed for correctness (a clean shutdown deletes it at once).

Readers: admission control (expected wait per tier), ``/readyz``, ``manage.py fleet`` and the staff fleet
page. Writer: :class:`inference.worker.WorkerHost`'s publisher thread, via :func:`publish`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

from events import broadcast

logger = logging.getLogger(__name__)

KEY_PREFIX = "chatsite:worker:"
#: Seconds a worker's status lives without a refresh.
STATUS_TTL_S = 5
#: Seconds between two publications of one worker's status.
PUBLISH_INTERVAL_S = 1.0
#: Seconds before the next attempt after a failed publication (Redis unreachable): a restarted Redis, which
#: lost every status, sees the worker again this soon after it is back, not a whole interval later; until
#: then admission control answers ``no_workers``.
PUBLISH_RETRY_S = 0.2


def worker_id() -> str:
    """This process's fleet id, ``<hostname>:<pid>`` (unique while the process lives)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def status_key(worker: str) -> str:
    """Redis key of one worker's published status."""
    return f"{KEY_PREFIX}{worker}"


class DecodeRate:
    """The rate (tokens/s) of an engine's ``decode_tokens_total`` counter over the last ``window_s`` seconds
    of work, for a worker's published ``decode_tokens_per_s``.

    The window restarts whenever the engine is seen idle (nothing running or waiting), so the first
    readings after an idle spell are not diluted by idle seconds: admission learns an engine's capacity
    from the readings taken while requests wait (``conversations/load.py``), and a 5 s window that was 4 s
    idle when a burst arrived read a fifth of the engine's rate; admission then refused at a fifth of the
    load it could take."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._samples: list[tuple[float, int]] = []

    def observe(self, now: float, total: int, *, idle: bool) -> float:
        """Record the counter ``total`` (tokens) read at ``now`` (monotonic s); returns the rate over the
        window (0.0 on the first sample and while idle)."""
        if idle:
            self._samples = []
        self._samples.append((now, total))
        self._samples = [(t, n) for t, n in self._samples if now - t <= self.window_s]
        t0, n0 = self._samples[0]
        return (total - n0) / (now - t0) if now > t0 else 0.0


@dataclass
class WorkerStatus:
    """One worker's published state. Times are Unix seconds; token figures are counts of tokens.

    Attributes:
        worker_id: ``<hostname>:<pid>``.
        host: Host name.
        pid: Process id.
        model: Registered model name served by this worker's engine.
        model_version: Version of that model (``""`` when unversioned).
        queues: Broker queues the worker consumes.
        started_at: When the process started.
        updated_at: When this status was published.
        ready: The engine is loaded and stepping.
        draining: The worker takes no new tasks and finishes its running replies.
        waiting: Requests waiting for admission in the engine.
        running: Requests holding a KV slot.
        kv_used_tokens / kv_total_tokens: KV cache tokens reserved / budget.
        max_num_seqs: The engine's running-request limit.
        decode_tokens_per_s: Tokens generated per second over the last few seconds.
        pending_prompt_tokens: Prompt tokens still to prefill (waiting and partially prefilled requests).
        pending_reply_tokens: Reply tokens still to generate, counted up to each request's max_new_tokens.
        active_replies: Replies this process owns (tasks claimed, waiting or running in the engine).
        metrics_port: Port of this process's Prometheus endpoint (0: none).
        node: Celery node name (``name@host``), the handle of ``manage.py drain``.
        backend: The serving backend, ``native`` or ``vllm`` (docs/serving-backends.md).
        health: ``ok``, or why the engine serves nothing (``engine core died``, ``model failed to load: ...``).
    """

    worker_id: str
    host: str
    pid: int
    model: str
    model_version: str = ""
    queues: list[str] = field(default_factory=list)
    started_at: float = 0.0
    updated_at: float = 0.0
    ready: bool = False
    draining: bool = False
    waiting: int = 0
    running: int = 0
    kv_used_tokens: int = 0
    kv_total_tokens: int = 0
    max_num_seqs: int = 0
    decode_tokens_per_s: float = 0.0
    pending_prompt_tokens: int = 0
    pending_reply_tokens: int = 0
    active_replies: int = 0
    metrics_port: int = 0
    node: str = ""
    backend: str = "native"
    health: str = "ok"

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the KV budget in use, 0.0 .. 1.0."""
        return self.kv_used_tokens / self.kv_total_tokens if self.kv_total_tokens else 0.0

    @property
    def uptime_s(self) -> float:
        """Seconds since the process started."""
        return max(0.0, self.updated_at - self.started_at)

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerStatus:
        """Parse a published document; unknown keys (from newer workers) are ignored."""
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def publish(status: WorkerStatus, *, client=None) -> None:
    """Write ``status`` (stamped with the current time) with a TTL of :data:`STATUS_TTL_S` seconds."""
    client = client or broadcast.redis_client()
    status.updated_at = time.time()
    client.set(status_key(status.worker_id), json.dumps(asdict(status)), ex=STATUS_TTL_S)


def publish_forever(status: Callable[[], WorkerStatus], *, stop, client=None) -> None:
    """Publish ``status()`` every :data:`PUBLISH_INTERVAL_S` seconds until ``stop`` (a
    ``threading.Event``) is set; after a failed attempt (Redis down or restarting) try again every
    :data:`PUBLISH_RETRY_S`. Never raises: an outage must not end the publisher, the key simply expires.
    Logs the first failure of each outage and the recovery."""
    client = client or broadcast.redis_client()
    failing = False
    while not stop.is_set():
        try:
            publish(status(), client=client)
        except Exception:
            if not failing:
                logger.warning("could not publish this worker's load; retrying", exc_info=True)
            failing = True
            stop.wait(PUBLISH_RETRY_S)
            continue
        if failing:
            logger.info("this worker's load is published again")
        failing = False
        stop.wait(PUBLISH_INTERVAL_S)


def unpublish(worker: str, *, client=None) -> None:
    """Remove a worker's status at once (clean shutdown)."""
    client = client or broadcast.redis_client()
    client.delete(status_key(worker))


def live_workers(*, client=None) -> list[WorkerStatus]:
    """Every worker whose status has not expired, sorted by ``worker_id``. Never raises on a malformed
    document (it is skipped and logged)."""
    client = client or broadcast.redis_client()
    keys = sorted(client.scan_iter(match=f"{KEY_PREFIX}*", count=1000))
    if not keys:
        return []
    workers = []
    for raw in client.mget(keys):
        if raw is None:  # expired between SCAN and MGET
            continue
        try:
            workers.append(WorkerStatus.from_json(raw))
        except (ValueError, TypeError):
            logger.warning("skipping a malformed worker status")
    return sorted(workers, key=lambda w: w.worker_id)
