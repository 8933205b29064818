"""Fixtures shared by every test layer."""

import pytest


@pytest.fixture
def make_user(db, django_user_model):
    """``make_user(username, tier="free", password="pw-Secret-123")`` -> a saved user."""
    from billing.models import Tier
    from billing.services import tiers_ensure

    tiers_ensure()  # transactional tests flush the tables the data migration filled

    def make(username: str = "alice", *, tier: str = "free", password: str = "pw-Secret-123", **extra):
        user = django_user_model.objects.create_user(
            username=username, email=f"{username}@example.com", password=password, **extra
        )
        if tier != "free":
            user.tier = Tier.objects.get(name=tier)
            user.save(update_fields=["tier"])
        return user

    return make


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def redis_clean(settings):
    """Empty our keys in the test Redis database: channel layer, replay streams, leases, rate-limit counters
    and the broker's queued messages. Kombu's queue bindings stay, so a running worker keeps receiving."""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)

    def clean():
        for pattern in ("chatsite*", "asgi*", "inference.*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)

    clean()
    yield client
    clean()
