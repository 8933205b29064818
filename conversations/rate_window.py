"""The per-minute request counter admission control runs for every admitted send and API request: django-ratelimit's
fixed window, counted in one Redis round trip (docs/overhead-levers.md, lever 49).

``django_ratelimit.core.get_usage(increment=True)`` calls the cache's ``add`` (the window's first hit) and then
``incr`` (every later one): two round trips. :func:`rate_hit` computes the same window and cache key with the
library's own helpers (django-ratelimit 4.1.0, pinned in requirements.txt; ``tests/db/test_rate_window.py``
checks that ``get_usage`` reads the counter it writes) and counts with the cache's ``add_then_incr``
(``events.redis_cache``), one ``EVALSHA``. A cache without ``add_then_incr`` gets ``get_usage`` itself.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.core.cache import caches
from django_ratelimit import ALL
from django_ratelimit.core import EXPIRATION_FUDGE, _get_window, _make_cache_key, _split_rate, get_usage


def rate_hit(*, group: str, value: str, rate: str) -> dict | None:
    """Count one request of ``value`` (e.g. ``"user:42"``) in ``group`` against ``rate`` (``"20/m"``) and return
    django-ratelimit's usage dict (``count``, ``limit``, ``should_limit``: count above limit, ``time_left``: s
    until the window ends), as ``get_usage(None, group=group, key=..., rate=rate, increment=True)`` returns it;
    None when ``RATELIMIT_ENABLE`` is off. Raises the cache's errors (a Redis outage: redis-py's
    ``ConnectionError``), as ``get_usage`` does."""
    if not getattr(settings, "RATELIMIT_ENABLE", True):
        return None
    cache = caches[getattr(settings, "RATELIMIT_USE_CACHE", "default")]
    if not hasattr(cache, "add_then_incr"):
        return get_usage(None, group=group, key=lambda g, r: value, rate=rate, increment=True)
    limit, period = _split_rate(rate)
    window = _get_window(value, period)
    count = cache.add_then_incr(
        _make_cache_key(group, window, rate, value, ALL), timeout=period + EXPIRATION_FUDGE
    )
    return {
        "count": count,
        "limit": limit,
        "should_limit": count > limit,
        "time_left": window - int(time.time()),
    }
