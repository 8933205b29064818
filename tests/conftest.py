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
    """Empty the test Redis database (channel layer, replay streams, broker queues, rate-limit counters)."""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
