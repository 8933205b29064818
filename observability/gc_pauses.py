"""The Python garbage collector's pauses in a long-lived process (a web process, a GPU or embeddings worker):
the heap that start-up built is frozen out of later collections, and the full collections still taken are
observed as a Prometheus histogram.

A full (generation 2) collection walks every object the collector tracks and holds the GIL while it does, so
every thread of the process stops: in a web process the sends of a burst and every socket's frames, in a GPU
worker the engine's step loop and the relay of its tokens. After start-up a web process tracks about 360,000
objects (Django, Channels, the guard chain's tables) and a GPU worker with the default model loaded about
560,000; a full collection of those heaps took about 170 ms and 275 ms (AMD EPYC Zen 4, 2026-12-05), and one
landed in a 32-send burst every few rounds (docs/overhead-levers.md, lever 38). Almost none of those objects
ever become garbage. :func:`freeze_startup_heap` moves them to the collector's permanent generation, which
collections skip; what requests allocate later is collected as before.

Sources: CPython's ``gc.freeze`` (3.7+), and Instagram Engineering's "Dismissing Python Garbage Collection at
Instagram" (2017), whose follow-up proposed ``gc.freeze`` for long-lived server processes.
"""

from __future__ import annotations

import gc
import time

from prometheus_client import Gauge, Histogram

GC_PAUSE = Histogram(
    "chatsite:gc_full_collection_seconds",
    "Pause of one full (generation 2) garbage collection of this process: every thread waits for it.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)

GC_FROZEN = Gauge(
    "chatsite:gc_frozen_objects",
    "Objects this process moved to the garbage collector's permanent generation once start-up was done.",
)

_started: list[float] = []  # the running full collection's start (perf_counter s); empty between them


def startup_done(*, freeze: bool) -> int:
    """A long-lived process finished starting: when ``freeze`` (the ``GC_FREEZE_AT_START`` setting, default
    on), freeze its heap (:func:`freeze_startup_heap`); then observe its full collections from now on
    (:func:`observe_full_collections`). Returns the objects frozen (0 when not)."""
    frozen = freeze_startup_heap() if freeze else 0
    observe_full_collections()  # after the freeze's own collection, which start-up pays for
    return frozen


def freeze_startup_heap() -> int:
    """Collect once (so no start-up garbage is kept for good), then move every object the process holds into
    the permanent generation (``gc.freeze``). Call once start-up is done: after the ASGI application is built,
    after a worker's model is loaded. Returns how many objects are frozen (``gc.get_freeze_count``), also
    exported as :data:`GC_FROZEN`."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    GC_FROZEN.set(frozen)
    return frozen


def observe_full_collections() -> None:
    """Record the pause of every later full collection in :data:`GC_PAUSE` (seconds). Idempotent; the
    callback ignores the frequent young-generation collections at the cost of one comparison each."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def _on_collection(phase: str, info: dict) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        GC_PAUSE.observe(time.perf_counter() - _started.pop())
