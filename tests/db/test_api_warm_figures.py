"""An API client's admission figures are kept warm between its completions, as an open socket's are
(``conversations/load_warmer.py``, lever 39): a completion that comes after the figures' cache period reads the
fleet and the queue from memory, not inline before its admission. Django's real ASGI handler, real database,
Redis and broker; no worker, so each reply stays ``queued`` until its client leaves."""

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from api.services import api_key_create
from conversations import load, load_warmer
from database.connections import closes_connections
from inference import fleet
from tests.db.api_asgi import completion_opened_and_left

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
def fleet_reads(monkeypatch):
    """The threads that read the fleet's status keys (``fleet.live_workers``), in call order."""
    readers: list[str] = []
    original = fleet.live_workers

    def counted(*args, **kwargs):
        readers.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(fleet, "live_workers", counted)
    return readers


async def test_a_completion_after_the_cache_period_reads_warm_figures(
    alice, redis_clean, settings, fleet_reads
):
    settings.ADMISSION_LOAD_CACHE_S = 0.4  # the warmer's pass runs every 0.1 s and re-reads what is 0.2 s old
    load.clear_cache()
    key = (await sync_to_async(closes_connections(api_key_create))(user=alice))[1]
    assert await completion_opened_and_left(key, BODY) == 200
    assert any(not name.startswith(load_warmer.TASK_NAME) for name in fleet_reads)  # the first read inline
    await asyncio.sleep(1.0)  # 2.5 cache periods: without the warmer every figure would be stale now
    assert any(name.startswith(load_warmer.TASK_NAME) for name in fleet_reads)
    fleet_reads.clear()
    assert await completion_opened_and_left(key, BODY) == 200
    inline = [name for name in fleet_reads if not name.startswith(load_warmer.TASK_NAME)]
    assert inline == [], f"the completion read the fleet itself on {inline}"


async def test_an_api_client_is_forgotten_after_the_idle_time(alice, monkeypatch):
    """A client that stops asking leaves the warmer's set at the next completion after ``IDLE_S``, so the
    warmer stops reading for it (and exits once nobody is left)."""
    clock = [1000.0]
    monkeypatch.setattr(load_warmer.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(load_warmer, "note_activity", lambda: None)
    monkeypatch.setattr(load_warmer, "_api_users", {})
    load_warmer.api_request_seen(user_id=alice.pk)
    assert load_warmer._api_users_recent(clock[0]) == {alice.pk}
    clock[0] += load_warmer.IDLE_S
    assert load_warmer._api_users_recent(clock[0]) == set()
    load_warmer.api_request_seen(user_id=alice.pk + 1)
    assert load_warmer._api_users == {alice.pk + 1: clock[0]}
