"""The fleet's load as one figure per tier: the **expected wait** (seconds) before a new request's prefill.

Inputs, both cached in-process for ``ADMISSION_LOAD_CACHE_S`` (1 s) so that admission under overload costs
no more than a dictionary lookup most of the time:

* the live workers' published status (``inference.fleet.live_workers``: per worker ``waiting``,
  ``running``, ``decode_tokens_per_s``, ``draining``, ``model``), read from Redis; a worker that died
  disappears within its 5 s TTL;
* the replies queued in PostgreSQL for a model (``status = queued``) whose tier priority is at least the new
  request's: the ones a broker priority queue delivers before it. Counted in PostgreSQL rather than asked
  of the broker because the broker's ``message_count`` is per queue, not per priority, and misses replies
  whose dispatch is waiting for a commit (see the README's tiers section for the measurement).

Formula, for a model ``m`` and a request of priority ``p``::

    ahead   = sum(waiting in the engines serving m) + queued(m, priority >= p)
    rate    = sum(decode_tokens_per_s of those engines)           # tokens/s the fleet generates for m
              (ADMISSION_DECODE_TOKENS_PER_S per worker while a worker reports none, e.g. when idle)
    wait(m, p) = ahead * ADMISSION_MEAN_REPLY_TOKENS / rate        # 0 when nothing is ahead

i.e. a request starts when the ``ahead`` requests before it have started, and a continuously batched fleet
finishes (so frees a slot for) ``rate / mean_reply_tokens`` requests per second (Little's law).
Borrowed from the "estimated queue time" admission of LLM serving systems (e.g. Llumnix, OSDI '24;
SGLang's load-aware router): one comparable number per tier, compared with that tier's threshold.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from django.conf import settings

from conversations.models import Message
from inference import fleet

_cache: dict[tuple, tuple[float, object]] = {}
_cache_lock = threading.Lock()
# Requests this process admitted recently: (monotonic time, model, priority). Added to a cached queue count
# taken before them, so a burst inside one cache period cannot all be admitted on the same stale figure.
_recent: list[tuple[float, str, int]] = []


def _cached(key: tuple, compute):
    ttl = settings.ADMISSION_LOAD_CACHE_S
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and now - hit[0] < ttl:
            return hit[1]
    value = compute()
    with _cache_lock:
        _cache[key] = (now, value)
    return value


def clear_cache() -> None:
    """Forget cached fleet and queue reads and recent admissions (tests; an operator's shell)."""
    with _cache_lock:
        _cache.clear()
        _recent.clear()


def note_admitted(*, model_name: str, priority: int) -> None:
    """Record that this process just admitted a request for ``model_name`` (see :func:`queued_ahead`)."""
    now = time.monotonic()
    horizon = now - 2 * settings.ADMISSION_LOAD_CACHE_S - 1
    with _cache_lock:
        _recent[:] = [r for r in _recent if r[0] > horizon]
        _recent.append((now, model_name, priority))


@dataclass(frozen=True)
class ModelLoad:
    """The fleet's load for one model: ``workers`` live, non-draining workers; ``waiting`` / ``running``
    requests in their engines; ``decode_tokens_per_s`` their summed decode rate (tokens/s, with the
    per-worker fallback applied)."""

    model: str
    workers: int
    waiting: int
    running: int
    decode_tokens_per_s: float


def fleet_load() -> dict[str, ModelLoad]:
    """Load per model name from the live, ready, non-draining workers (cached ``ADMISSION_LOAD_CACHE_S``)."""

    def compute() -> dict[str, ModelLoad]:
        by_model: dict[str, list[fleet.WorkerStatus]] = {}
        for worker in fleet.live_workers():
            if worker.ready and not worker.draining:
                by_model.setdefault(worker.model, []).append(worker)
        fallback = settings.ADMISSION_DECODE_TOKENS_PER_S
        return {
            model: ModelLoad(
                model=model,
                workers=len(workers),
                waiting=sum(w.waiting for w in workers),
                running=sum(w.running for w in workers),
                decode_tokens_per_s=sum(w.decode_tokens_per_s or fallback for w in workers),
            )
            for model, workers in by_model.items()
        }

    return _cached(("fleet",), compute)


def queued_ahead(*, model_name: str, priority: int) -> int:
    """Replies queued (not yet claimed by a worker) for ``model_name`` whose tier priority is >= ``priority``:
    those a priority broker queue hands out before a new request of that priority. The count is cached;
    requests this process admitted since the cached read are added to it."""
    key = ("queued", model_name, priority)
    count = _cached(
        key,
        lambda: Message.objects.filter(
            role=Message.Role.ASSISTANT,
            status=Message.Status.QUEUED,
            model_name=model_name,
            conversation__owner__tier__queue_priority__gte=priority,
        ).count(),
    )
    with _cache_lock:
        read_at = _cache[key][0] if key in _cache else time.monotonic()
        since = sum(1 for t, m, p in _recent if t >= read_at and m == model_name and p >= priority)
    return count + since


def expected_wait_s(*, tier, model_name: str | None = None) -> float | None:
    """Seconds a new request of ``tier`` is expected to wait before its prefill on ``model_name`` (default:
    the tier's own model). None when no live worker serves that model. Formula in the module docstring."""
    model_name = model_name or tier.model_name
    load = fleet_load().get(model_name)
    if load is None:
        return None
    ahead = load.waiting + queued_ahead(model_name=model_name, priority=tier.queue_priority)
    if ahead <= 0:
        return 0.0
    return ahead * settings.ADMISSION_MEAN_REPLY_TOKENS / max(load.decode_tokens_per_s, 1e-6)
