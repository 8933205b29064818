"""One Redis connection pool per process for Django's cache (``CACHES["default"]["OPTIONS"]["pool_class"]``).

Django keeps its cache objects in context-local storage (``asgiref.local.Local``): under ASGI every new asyncio
task (each WebSocket's consumer, each HTTP request) gets a new ``RedisCache`` on its first cache call, and
Django's client builds a new ``redis.ConnectionPool`` for each of them. So the first cache call of every socket
and request (the per-minute rate check in admission, django-ratelimit's ``get_usage``) opened a new TCP
connection to Redis, with redis-py's hand-shake, and the old pool's connection stayed open until garbage
collection. With this class as the pool class, every cache object of the process shares one thread-safe pool
per server and options, and a cache call takes an idle pooled connection (docs/overhead-levers.md, lever 23).
"""

from __future__ import annotations

import threading

import redis


class ProcessConnectionPool(redis.ConnectionPool):
    """A ``redis.ConnectionPool`` whose :meth:`from_url` hands out one pool per (URL, options) per process.

    Django's ``RedisCacheClient`` calls ``pool_class.from_url(server, **options)`` once per cache object; this
    returns the process's pool for those arguments, creating it on first use. redis-py's pools are safe to
    share between threads and reset themselves in a forked child (their pid check), so sharing changes which
    connection a call takes, never what it sees. Options must be hashable by ``repr`` (a parser class, ints,
    strings, as Django passes them)."""

    _shared: dict[tuple, ProcessConnectionPool] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs) -> ProcessConnectionPool:
        """The process's pool for ``url`` (``redis://host:port/db``) and ``kwargs`` (redis-py's pool and
        connection options), created by ``redis.ConnectionPool.from_url`` on first use."""
        key = (cls, url, tuple(sorted((name, repr(value)) for name, value in kwargs.items())))
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None:
                pool = cls._shared[key] = super().from_url(url, **kwargs)
            return pool
