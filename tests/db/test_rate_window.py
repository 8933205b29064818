"""Lever 49 (docs/overhead-levers.md): admission's per-minute counter in one Redis round trip
(``conversations/rate_window.py``). It is django-ratelimit's own counter: the same window, key and values, so
``get_usage`` (the API's headers after a refusal, the library's decorators) reads what it counted."""

import pytest
import redis
from django.core.cache import cache
from django_ratelimit.core import get_usage

from conversations.rate_window import rate_hit

pytestmark = pytest.mark.django_db

RATE = "3/m"


def library_hit(value, *, increment=True):
    return get_usage(None, group="generation", key=lambda g, r: value, rate=RATE, increment=increment)


def round_trips(monkeypatch) -> list:
    """A list that gets an entry for each command (or pipeline) redis-py writes to a connection from now on:
    ``Connection.send_packed_command`` wrapped, not replaced."""
    sent = []
    real = redis.connection.Connection.send_packed_command

    def counting(self, command, check_health=True):
        sent.append(command)
        return real(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counting)
    return sent


def test_it_counts_what_the_library_counts_on_the_same_counter(redis_clean):
    counts = []
    for hit in (rate_hit, library_hit, rate_hit, library_hit):
        usage = hit(group="generation", value="user:7", rate=RATE) if hit is rate_hit else hit("user:7")
        counts.append((usage["count"], usage["limit"], usage["should_limit"]))
    assert counts == [(1, 3, False), (2, 3, False), (3, 3, False), (4, 3, True)]
    read = library_hit("user:7", increment=False)
    assert read["count"] == 4 and read["should_limit"]
    assert 0 <= rate_hit(group="generation", value="user:7", rate=RATE)["time_left"] <= 60
    assert rate_hit(group="generation", value="user:8", rate=RATE)["count"] == 1  # another user's window


def test_a_windows_first_hit_creates_the_counter_with_its_expiry(redis_clean):
    rate_hit(group="generation", value="user:9", rate=RATE)
    client = cache._cache.get_client(write=True)
    (key,) = client.keys("*rl:*")
    assert 60 < client.ttl(key) <= 65  # the window's length and django-ratelimit's fudge
    assert int(client.get(key)) == 1


def test_a_hit_is_one_round_trip_where_the_library_takes_two(redis_clean, monkeypatch):
    rate_hit(group="generation", value="user:10", rate=RATE)  # the script is loaded into Redis once
    library_hit("user:10")
    sent = round_trips(monkeypatch)
    rate_hit(group="generation", value="user:10", rate=RATE)
    ours = len(sent)
    library_hit("user:10")
    assert (ours, len(sent) - ours) == (1, 2)
