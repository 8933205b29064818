"""Django's Redis cache backend with ``incr`` in one round trip and one client object per connection pool
(``CACHES["default"]["BACKEND"]``).

Django's ``RedisCacheClient.incr`` asks Redis whether the key exists (``EXISTS``), then increments it
(``INCRBY``): two round trips, so that a missing key raises ``ValueError`` as the cache API promises instead of
being created. django-ratelimit's per-minute counter, which admission runs for every admitted send and API
request (``conversations.admission``), calls ``add`` and then ``incr`` on every request after a window's
first: three round trips. Here ``incr`` is one Lua script that does both steps in Redis (one ``EVALSHA``), so
the rate check costs two (docs/overhead-levers.md, lever 31).

Django's client also builds a new ``redis.Redis`` around its pool for every cache call, and redis-py's
constructor fills a table of some 300 response callbacks each time (0.08 ms of CPU per call on an AMD EPYC
Zen 4, two calls per rate check); here each pool has one ``redis.Redis``, which redis-py documents as safe to
share between threads (a command takes a connection from the pool and gives it back). Everything else is
Django's backend unchanged, plus :meth:`RedisCache.add_then_incr`, django-ratelimit's ``add`` and ``incr`` in one
round trip for admission's per-minute counter (``conversations/rate_window.py``, lever 49).
"""

from __future__ import annotations

import redis
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient

#: ``INCRBY`` when the key exists, else nil: the increment and Django's missing-key check in one round trip.
INCR_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('INCRBY', KEYS[1], ARGV[1])
end
return false
"""


class OneTripIncrClient(RedisCacheClient):
    """Django's ``RedisCacheClient`` whose :meth:`incr` is one round trip (:data:`INCR_IF_EXISTS`) and whose
    :meth:`get_client` hands out one ``redis.Redis`` per connection pool."""

    _script = None  # redis-py's Script object: its SHA1 computed once, loaded into Redis on first use
    #: ``id(pool)`` -> the ``redis.Redis`` on that pool (the pools live as long as the process:
    #: ``events.redis_pool.ProcessConnectionPool``; a pool that is not the one stored gets a new client).
    _clients: dict[int, redis.Redis] = {}

    def get_client(self, key=None, *, write: bool = False) -> redis.Redis:
        """The ``redis.Redis`` for ``key``'s server (the primary when ``write``), shared by every cache
        object of the process that uses the same pool."""
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None or client.connection_pool is not pool:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client

    def incr(self, key: str, delta: int) -> int:
        """The value of the integer at ``key`` (a made key) after adding ``delta`` (may be negative), its
        expiry kept. Raises ``ValueError`` when the key does not exist (nothing is created), and redis-py's
        ``ResponseError`` when it holds no integer, as Django's client does."""
        client = self.get_client(key, write=True)
        script = OneTripIncrClient._script
        if script is None:
            script = OneTripIncrClient._script = client.register_script(INCR_IF_EXISTS)
        value = script(keys=[key], args=[delta], client=client)  # EVALSHA; SCRIPT LOAD once per server
        if value is None:
            raise ValueError(f"Key '{key}' not found.")
        return value


#: ``SET key 0 EX ttl NX`` then ``INCRBY``: the counter of a fixed window created with its expiry on the window's
#: first hit, and incremented, in one round trip (lever 49).
ADD_THEN_INCR = """
redis.call('SET', KEYS[1], 0, 'EX', ARGV[2], 'NX')
return redis.call('INCRBY', KEYS[1], ARGV[1])
"""


class RedisCache(DjangoRedisCache):
    """``django.core.cache.backends.redis.RedisCache`` with :class:`OneTripIncrClient` as its client; the same
    ``LOCATION`` and ``OPTIONS`` (``pool_class`` included)."""

    _add_then_incr = None  # redis-py's Script object for ADD_THEN_INCR, made on first use

    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = OneTripIncrClient

    def add_then_incr(self, key: str, delta: int = 1, timeout: int = 60, version=None) -> int:
        """What ``add(key, 0, timeout)`` then ``incr(key, delta)`` leave (the counter's value after ``delta`` is
        added, created at 0 with ``timeout`` seconds to live when missing, its expiry kept otherwise), in one
        round trip (one ``EVALSHA``) instead of two. The value is stored as Django's serializer stores an int,
        so ``get``, ``incr`` and django-ratelimit read it. Raises redis-py's errors (``ConnectionError``, and
        ``ResponseError`` when ``key`` holds no integer)."""
        key = self.make_and_validate_key(key, version=version)
        client = self._cache.get_client(key, write=True)
        script = RedisCache._add_then_incr
        if script is None:
            script = RedisCache._add_then_incr = client.register_script(ADD_THEN_INCR)
        return int(script(keys=[key], args=[delta, int(timeout)], client=client))
