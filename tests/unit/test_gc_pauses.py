"""A long-lived process's heap built at start-up is frozen out of the collector's full collections, and each
full collection still taken is observed (observability/gc_pauses.py, docs/overhead-levers.md lever 38)."""

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from observability import gc_pauses

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_start_up_done_freezes_the_heap_and_observes_full_collections(unfrozen):
    assert gc.get_freeze_count() == 0
    assert gc_pauses.startup_done(freeze=False) == 0
    assert gc.get_freeze_count() == 0
    held = [[i] for i in range(10_000)]  # alive at the freeze: permanent from then on
    frozen = gc_pauses.startup_done(freeze=True)
    # Frozen objects only leave the permanent generation when freed, which other threads of the test process (an
    # earlier module's idle workers) may do meanwhile: the count now is at most what the freeze reported.
    assert frozen >= gc.get_freeze_count() >= len(held)
    assert _sample("chatsite:gc_frozen_objects") == frozen
    tracked_after = len(gc.get_objects())  # what a full collection still walks
    assert tracked_after < frozen
    count, total = "chatsite:gc_full_collection_seconds_count", "chatsite:gc_full_collection_seconds_sum"
    before = _sample(count), _sample(total)
    gc.collect()
    gc.collect(0)  # a young collection is not a full one
    assert _sample(count) == before[0] + 1
    assert _sample(total) > before[1]
    gc_pauses.observe_full_collections()  # idempotent: one callback
    assert gc.callbacks.count(gc_pauses._on_collection) == 1


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


@pytest.mark.parametrize("freeze", ["true", "false"])
def test_a_web_process_freezes_its_heap_once_the_asgi_application_is_built(freeze):
    code = "import gc, chatsite.asgi; print(gc.get_freeze_count(), len(gc.get_objects()))"
    env = {**os.environ, "GC_FREEZE_AT_START": freeze}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    frozen, tracked = int(out[-2]), int(out[-1])
    if freeze == "true":
        assert frozen > 100_000 and tracked < frozen // 10  # Django, Channels and the guards' tables
    else:
        assert frozen == 0 and tracked > 100_000
