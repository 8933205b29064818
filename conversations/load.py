"""The fleet's load as one figure per tier: the **expected wait** (seconds) before a new request's prefill.

Inputs, both cached in-process for ``ADMISSION_LOAD_CACHE_S`` (1 s) so that admission under overload costs
no more than a dictionary lookup most of the time:

* the live workers' published status (``inference.fleet.live_workers``: per worker ``waiting``,
  ``running``, ``decode_tokens_per_s``, ``draining``, ``model``), read from Redis; a worker that died
  disappears within its 5 s TTL;
* the replies queued in PostgreSQL for a model (``status = queued``) whose tier priority is at least the new
  request's: the ones a broker priority queue delivers before it. Counted in PostgreSQL rather than asked
  of the broker because the broker's ``message_count`` is per queue, not per priority, and misses replies
  whose dispatch is waiting for a commit (see docs/tiers-under-load.md for the measurement).

Formula, for a model ``m`` and a request of priority ``p``::

    ahead   = min(waiting in m's engines, max(0, streaming(m, priority >= p) - running in m's engines))
              + queued(m, priority >= p)
    free    = running slots left in m's engines that have nothing waiting (max_num_seqs - running)
    rate    = capacity per worker x workers, where the capacity is estimated from the decode tokens/s
              measured while the engines had requests waiting (saturated): a higher reading is taken at
              once, a lower one lowers the estimate by at most 10 % per read; it starts from
              ADMISSION_DECODE_TOKENS_PER_S and is kept while unsaturated; an unsaturated fleet's own
              measured rate when higher
    wait(m, p) = max(0, ahead - free) * ADMISSION_MEAN_REPLY_TOKENS / rate   # 0 when the free slots take all

i.e. a request starts when the ``ahead`` requests before it have started; the first ``free`` of them (and it)
take slots that are free now, and beyond those a continuously batched fleet finishes (so frees a slot for)
``rate / mean_reply_tokens`` requests per second (Little's law). Without ``free``, a burst of 32 sends to an
idle engine with 32 slots read as 32 replies' worth of waiting and met the hard cap.
Borrowed from the "estimated queue time" admission of LLM serving systems (e.g. Llumnix, OSDI '24;
SGLang's load-aware router): one comparable number per tier, compared with that tier's threshold.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.conf import settings

from conversations.models import Message
from conversations.selectors import ACTIVE_AT_OR_ABOVE_SQL, USER_TIERS_SQL
from database.sql import fetch_all, fetch_instance, fetch_one
from inference import fleet

_cache: dict[tuple, tuple[float, object]] = {}
_cache_lock = threading.Lock()
# Requests this process admitted recently: (monotonic time, model, priority). Added to a cached queue count
# taken before them, so a burst inside one cache period cannot all be admitted on the same stale figure.
_recent: list[tuple[float, str, int]] = []
# Requests this process let through a cached_only gate whose admission (in the service, on a database
# thread) has not run yet: token -> (model, priority). Counted as queued like _recent, so a burst of frames
# passing the gate on the same figures is refused there at once instead of after waiting for the service.
_pending: dict[int, tuple[str, int]] = {}
_pending_tokens = itertools.count(1)
# Per model: the estimated capacity per worker (decode tokens/s while its engines have requests waiting).
_capacity: dict[str, float] = {}
#: A saturated reading below the estimate lowers it by at most this share per read.
CAPACITY_STEP_DOWN = 0.10


_cached_only: ContextVar[bool] = ContextVar("load_cached_only", default=False)
# Inside warm(): figures older than this (s) are read again, so they never reach their TTL while warmed.
_refresh_after: ContextVar[float | None] = ContextVar("load_refresh_after", default=None)


class CacheMiss(Exception):
    """Raised inside :func:`cached_only` when a figure would need Redis or PostgreSQL."""


@contextmanager
def cached_only():
    """Within this block every read is served from the cache or raises :class:`CacheMiss`: lets an async
    caller (the WebSocket consumer) decide admission on its event loop, without a thread hop, when fresh."""
    token = _cached_only.set(True)
    try:
        yield
    finally:
        _cached_only.reset(token)


def _cached(key: tuple, compute):
    ttl = settings.ADMISSION_LOAD_CACHE_S
    fresh_for = _refresh_after.get()
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and now - hit[0] < (ttl if fresh_for is None else fresh_for):
            return hit[1]
    if _cached_only.get():
        raise CacheMiss(key)
    value = compute()
    with _cache_lock:
        _cache[key] = (now, value)
    return value


def forget_reads() -> None:
    """Forget cached fleet and queue reads and recent admissions; keep the learned capacity."""
    with _cache_lock:
        _cache.clear()
        _recent.clear()


def clear_cache() -> None:
    """Forget everything this process learned about the fleet (tests; an operator's shell)."""
    forget_reads()
    with _cache_lock:
        _capacity.clear()


def note_admitted(*, model_name: str, priority: int) -> None:
    """Record that this process just admitted a request for ``model_name`` (see :func:`queued_ahead`)."""
    now = time.monotonic()
    horizon = now - 2 * settings.ADMISSION_LOAD_CACHE_S - 1
    with _cache_lock:
        _recent[:] = [r for r in _recent if r[0] > horizon]
        _recent.append((now, model_name, priority))


def note_pending(*, model_name: str, priority: int) -> int:
    """Count a request that passed the cached gate until :func:`clear_pending` (its admission is next);
    returns the token to clear it with."""
    token = next(_pending_tokens)
    with _cache_lock:
        _pending[token] = (model_name, priority)
    return token


def clear_pending(token: int | None) -> str | None:
    """Stop counting the request of ``token``; returns the model it was let through to (None or an already
    cleared token: nothing, None)."""
    with _cache_lock:
        entry = _pending.pop(token, None)
    return entry[0] if entry else None


@dataclass(frozen=True)
class ModelLoad:
    """The fleet's load for one model: ``workers`` live, non-draining workers; ``waiting`` / ``running``
    requests in their engines; ``decode_tokens_per_s`` their summed decode rate (tokens/s, with the
    per-worker fallback applied); ``free_slots`` running slots left (``max_num_seqs - running``) in the
    engines with nothing waiting (an engine with waiting requests has none to give: KV budget or slots)."""

    model: str
    workers: int
    waiting: int
    running: int
    decode_tokens_per_s: float
    free_slots: int = 0


def fleet_load() -> dict[str, ModelLoad]:
    """Load per model name from the live, ready, non-draining workers (cached ``ADMISSION_LOAD_CACHE_S``)."""

    def compute() -> dict[str, ModelLoad]:
        by_model: dict[str, list[fleet.WorkerStatus]] = {}
        for worker in fleet.live_workers():
            if worker.ready and not worker.draining:
                by_model.setdefault(worker.model, []).append(worker)
        loads = {}
        for model, workers in by_model.items():
            waiting = sum(w.waiting for w in workers)
            measured = sum(w.decode_tokens_per_s for w in workers)
            if waiting > 0 and measured > 0:
                # Saturated: the measured rate is a reading of the capacity. A window full of prefill (or of a
                # burst's first second) reads low, so a reading above the estimate is taken at once and one
                # below it lowers it by at most CAPACITY_STEP_DOWN per read: a sustained lower rate is learned
                # within ~20 reads, one stray reading moves it 10 %. The estimate starts from
                # ADMISSION_DECODE_TOKENS_PER_S and is kept while the fleet is not saturated: idle time says
                # nothing about capacity. (Before 2026-11-27 the last estimate decayed with wall time, so
                # after an idle minute a burst's first, prefill-heavy reading became the capacity, and one
                # request ahead read as a minute of wait: 503 `busy` on a nearly idle fleet.)
                previous = _capacity.get(model, settings.ADMISSION_DECODE_TOKENS_PER_S)
                _capacity[model] = max(measured / len(workers), (1 - CAPACITY_STEP_DOWN) * previous)
            per_worker = _capacity.get(model, settings.ADMISSION_DECODE_TOKENS_PER_S)
            loads[model] = ModelLoad(
                model=model,
                workers=len(workers),
                waiting=waiting,
                running=sum(w.running for w in workers),
                free_slots=sum(max(0, w.max_num_seqs - w.running) for w in workers if w.waiting == 0),
                # Saturated engines run at their measured rate; a partly idle fleet could run faster.
                decode_tokens_per_s=per_worker * len(workers)
                if waiting > 0 and measured > 0
                else max(measured, per_worker * len(workers)),
            )
        return loads

    return _cached(("fleet",), compute)


def cached_tier(tier_id: int):
    """The :class:`~billing.models.Tier` row ``tier_id`` (cached like the load figures; a fixed statement,
    lever 56). Raises ``Tier.DoesNotExist`` for an id with no row."""
    from billing.models import Tier

    def read():
        tier = fetch_instance(Tier, "id = %s", [tier_id])
        if tier is None:
            raise Tier.DoesNotExist(f"no tier {tier_id}")
        return tier

    return _cached(("tier", tier_id), read)


def current_tier(user_id: int):
    """The :class:`~billing.models.Tier` user ``user_id`` is on now: the user's ``tier_id`` and the tier row,
    each read at most ``ADMISSION_LOAD_CACHE_S`` ago (one indexed query per user per period)."""
    from django.contrib.auth import get_user_model

    def read():
        rows = fetch_all(USER_TIERS_SQL, {"ids": [user_id]})
        if not rows:
            raise get_user_model().DoesNotExist(f"no user {user_id}")
        return rows[0][1]

    return cached_tier(_cached(("user_tier", user_id), read))


def note_user_tier(*, user_id: int, tier_id: int) -> None:
    """Cache ``tier_id`` as user ``user_id``'s tier, read just now (a WebSocket's user row, loaded for its
    handshake)."""
    with _cache_lock:
        _cache[("user_tier", user_id)] = (time.monotonic(), tier_id)


def active_at_or_above(*, model_name: str, priority: int) -> tuple[int, int]:
    """``(queued, streaming)`` replies for ``model_name`` whose tier priority is >= ``priority``: queued ones
    are those a priority broker queue hands out before a new request of that priority; streaming ones are
    in an engine (running or waiting). One indexed query, cached; requests this process admitted since
    the cached read, or let through its cached gate (:func:`note_pending`), are added to ``queued``."""
    key = ("active", model_name, priority)

    def compute() -> tuple[int, int]:
        params = {"model": model_name, "role": Message.Role.ASSISTANT, "priority": priority}
        queued, streaming = fetch_one(ACTIVE_AT_OR_ABOVE_SQL, params)
        return queued, streaming

    queued, streaming = _cached(key, compute)
    with _cache_lock:
        read_at = _cache[key][0] if key in _cache else time.monotonic()
        since = sum(1 for t, m, p in _recent if t >= read_at and m == model_name and p >= priority)
        since += sum(1 for m, p in _pending.values() if m == model_name and p >= priority)
    return queued + since, streaming


def queued_ahead(*, model_name: str, priority: int) -> int:
    """Replies queued for ``model_name`` at priority >= ``priority`` (see :func:`active_at_or_above`)."""
    return active_at_or_above(model_name=model_name, priority=priority)[0]


def expected_wait_s(*, tier, model_name: str | None = None) -> float | None:
    """Seconds a new request of ``tier`` is expected to wait before its prefill on ``model_name`` (default:
    the tier's own model). None when no live worker serves that model. Formula in the module docstring."""
    model_name = model_name or tier.model_name
    load = fleet_load().get(model_name)
    if load is None:
        return None
    queued, streaming = active_at_or_above(model_name=model_name, priority=tier.queue_priority)
    # Engines admit by priority too: requests of priority >= p fill the running slots first, so those of them
    # beyond the running ones are the waiting ones ahead (all waiting ones for the lowest priority).
    ahead = min(load.waiting, max(0, streaming - load.running)) + queued - load.free_slots
    if ahead <= 0:
        return 0.0
    return ahead * settings.ADMISSION_MEAN_REPLY_TOKENS / max(load.decode_tokens_per_s, 1e-6)


def warm(*, user_ids) -> None:
    """Read again every figure admission needs for ``user_ids`` that is older than half
    ``ADMISSION_LOAD_CACHE_S``: their tier ids (one query for all of them), their tiers, and the fleet load
    and queue counts of those tiers' models. Called periodically off the event loop
    (:mod:`conversations.load_warmer`), so that :func:`cached_only` reads of open sockets' users hit."""

    from inference.registry import models_for_tier

    refresh_after = settings.ADMISSION_LOAD_CACHE_S / 2
    token = _refresh_after.set(refresh_after)
    try:
        now = time.monotonic()
        with _cache_lock:
            stale = [
                uid
                for uid in user_ids
                if now - _cache.get(("user_tier", uid), (float("-inf"),))[0] >= refresh_after
            ]
        if stale:
            rows = fetch_all(USER_TIERS_SQL, {"ids": stale})
            with _cache_lock:
                for pk, tier_id in rows:
                    _cache[("user_tier", pk)] = (now, tier_id)
        with _cache_lock:
            tier_ids = {_cache[("user_tier", uid)][1] for uid in user_ids if ("user_tier", uid) in _cache}
        for tier_id in tier_ids:
            tier = cached_tier(tier_id)
            for name in models_for_tier(tier):
                expected_wait_s(tier=tier, model_name=name)
    finally:
        _refresh_after.reset(token)
