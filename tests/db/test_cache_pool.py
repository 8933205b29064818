"""Django's cache shares one Redis connection pool per process (``events.redis_pool.ProcessConnectionPool``,
docs/overhead-levers.md lever 23). Under ASGI each new asyncio task (a WebSocket's consumer, an HTTP request) gets a
new cache object; without the shared pool each of them connected to Redis anew on its first call (the rate
check of every admitted send on a new socket, of every API request)."""

import asyncio
import contextvars

from django.core.cache import caches
from django_ratelimit.core import get_usage

from database.connections import db_call
from events.redis_pool import ProcessConnectionPool


def _cache_call_in_a_new_task(work):
    """``work()`` on a worker thread as the consumer's services run (``db_call``), from a new asyncio task in
    a context that never held a cache object, as daphne's task for each socket and request starts (an empty
    one: a cache an earlier test left in this thread's context would otherwise be inherited)."""

    async def main():
        call = db_call(work, thread_sensitive=False)()
        return await asyncio.create_task(call, context=contextvars.Context())

    return asyncio.run(main())


def _connection_id_after_rate_check(key: str):
    cache = caches["default"]
    usage = get_usage(None, group="cache-pool-test", key=lambda g, r: key, rate="1000/m", increment=True)
    assert usage["count"] >= 1
    client = cache._cache.get_client(write=True)
    return id(cache), client.connection_pool, client.client_id()


def test_every_task_s_cache_takes_a_pooled_connection():
    calls = [_cache_call_in_a_new_task(lambda: _connection_id_after_rate_check("k")) for _ in range(4)]
    cache_ids, pools, connection_ids = zip(*calls, strict=True)
    # The premise: Django built a cache object per task (when it stops doing so this test says nothing).
    assert len(set(cache_ids)) > 1
    assert len({id(pool) for pool in pools}) == 1
    assert isinstance(pools[0], ProcessConnectionPool)
    # Redis saw one connection serve all four tasks: none connected anew.
    assert len(set(connection_ids)) == 1


def test_one_pool_per_server_and_options():
    first = ProcessConnectionPool.from_url("redis://127.0.0.1:6379/3", socket_timeout=5)
    assert ProcessConnectionPool.from_url("redis://127.0.0.1:6379/3", socket_timeout=5) is first
    assert ProcessConnectionPool.from_url("redis://127.0.0.1:6379/4", socket_timeout=5) is not first
    assert ProcessConnectionPool.from_url("redis://127.0.0.1:6379/3", socket_timeout=6) is not first
    assert first.connection_kwargs["db"] == 3
