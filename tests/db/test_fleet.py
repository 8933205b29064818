"""The fleet registry in Redis: workers publish their load with a TTL and drop out when they stop."""

import time

import pytest

from inference import fleet

pytestmark = pytest.mark.real_fleet


def test_published_worker_is_live_until_unpublished(redis_clean):
    status = fleet.WorkerStatus(
        worker_id="host-a:1",
        host="host-a",
        pid=1,
        model="m",
        waiting=2,
        running=3,
        kv_used_tokens=50,
        kv_total_tokens=200,
    )
    fleet.publish(status)
    [live] = fleet.live_workers()
    assert (live.worker_id, live.waiting, live.running) == ("host-a:1", 2, 3)
    assert live.kv_cache_usage == 0.25
    assert live.updated_at <= time.time()
    assert 0 < redis_clean.ttl(fleet.status_key("host-a:1")) <= fleet.STATUS_TTL_S
    fleet.unpublish("host-a:1")
    assert fleet.live_workers() == []


def test_malformed_or_newer_documents_do_not_break_the_reader(redis_clean):
    redis_clean.set(fleet.status_key("bad:1"), "{not json", ex=5)
    redis_clean.set(
        fleet.status_key("new:2"),
        '{"worker_id": "new:2", "host": "new", "pid": 2, "model": "m", "some_future_field": 1}',
        ex=5,
    )
    assert [w.worker_id for w in fleet.live_workers()] == ["new:2"]
