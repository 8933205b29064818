"""The cache's ``incr`` is one round trip to Redis (``events.redis_cache``, docs/overhead-levers.md lever 31) and keeps
Django's contract: a missing key raises ``ValueError`` and stays missing, the expiry is kept, a value that is no
integer is an error. django-ratelimit's counter (admission's per-minute rate) then costs two commands. Real
Redis; the commands are counted on the way out (redis-py's ``execute_command``), not faked."""

import uuid

import pytest
import redis
from django.core.cache import cache
from django_ratelimit.core import get_usage

from events.redis_cache import OneTripIncrClient


@pytest.fixture
def sent(monkeypatch):
    """The Redis commands the cache sends, by name, in order (each still runs against Redis)."""
    names = []
    real = redis.Redis.execute_command

    def counting(self, *args, **options):
        names.append(str(args[0]).upper())
        return real(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", counting)
    return names


@pytest.fixture
def script_loaded():
    """The script loaded into Redis (the first ``incr`` on a server adds a ``SCRIPT LOAD``)."""
    cache.set("incr-warm", 0, timeout=5)
    cache.incr("incr-warm")


def test_incr_is_one_round_trip_and_keeps_the_expiry(script_loaded, sent):
    assert isinstance(cache._cache, OneTripIncrClient)
    cache.set("incr-test", 5, timeout=60)
    sent.clear()
    assert cache.incr("incr-test") == 6
    assert cache.incr("incr-test", 10) == 16
    assert cache.decr("incr-test", 3) == 13
    assert sent == ["EVALSHA"] * 3
    assert cache.get("incr-test") == 13
    ttl = cache._cache.get_client().ttl(cache.make_and_validate_key("incr-test"))
    assert 0 < ttl <= 60  # the increments kept the expiry


def test_every_cache_call_of_the_process_shares_one_client_per_pool():
    from django.core.cache import caches

    from tests.db.test_cache_pool import _cache_call_in_a_new_task

    def client_after_a_call():
        cache = caches["default"]
        cache.get("incr-shared")
        return id(cache), cache._cache.get_client(write=True)

    calls = [_cache_call_in_a_new_task(client_after_a_call) for _ in range(3)]
    cache_ids, clients = zip(*calls, strict=True)
    assert len(set(cache_ids)) > 1  # the premise: a cache object per task, as under daphne
    assert len({id(client) for client in clients}) == 1
    assert clients[0].ping()


def test_incr_of_a_missing_key_raises_and_creates_nothing(sent):
    cache.delete("incr-missing")
    with pytest.raises(ValueError):
        cache.incr("incr-missing")
    assert not cache.has_key("incr-missing")
    cache.set("incr-text", "not a number", timeout=60)
    with pytest.raises(redis.ResponseError):
        cache.incr("incr-text")
    assert cache.get("incr-text") == "not a number"


def test_the_rate_counter_costs_two_commands_and_still_limits(script_loaded, sent):
    key = f"user:{uuid.uuid4()}"
    counts, limited = [], []
    for _ in range(4):
        sent.clear()
        usage = get_usage(None, group="incr-test", key=lambda g, r: key, rate="3/m", increment=True)
        counts.append(usage["count"])
        limited.append(usage["should_limit"])
        # The window's first request: add (stored). Each later one: add (refused), then incr.
        assert sent == (["SET"] if usage["count"] == 1 else ["SET", "EVALSHA"])
    assert counts == [1, 2, 3, 4] and limited == [False, False, False, True]
