"""Fixtures shared by every test layer."""

import os

import pytest

# The live-stack fixtures are defined once for the whole session: imported into both the integration and
# the browser conftest, the session-scoped worker would start twice under one name, and RabbitMQ refuses
# the second one's exclusive pidbox queue (RESOURCE_LOCKED).
from tests.live_stack import (  # noqa: F401
    celery_worker,
    drill_workers,
    live_server_url,
    prepared_model,
    private_model,
    private_redis,
    worker_factory,
)

# Collected only by their own commands: the vLLM layer runs from its own virtualenv (scripts/test_vllm.sh
# sets CHATSITE_TEST_VLLM=1); the multi-host bed's drills need root and network namespaces and take minutes
# (`make test-cluster`, scripts/test-cluster.sh, sets CHATSITE_BED_TESTS=1).
collect_ignore = [] if os.environ.get("CHATSITE_TEST_VLLM") == "1" else ["vllm"]
if os.environ.get("CHATSITE_BED_TESTS") != "1":
    collect_ignore.append("cluster")


@pytest.fixture(scope="session")
def embedder():
    """The packaged sentence-embedding model (all-MiniLM-L6-v2), loaded once for the session (~4 s)."""
    from memory.embedding import Embedder

    return Embedder()


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """Each test gets new channel layer instances. A RedisChannelLayer counts its receivers and binds its
    receive lock to the event loop of the first one; a receive left pending by an earlier test (whose event
    loop pytest-asyncio has closed) would make the next test's first receive reuse that lock and fail with
    "bound to a different event loop"."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


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


def broker_purge() -> None:
    """Drop every message waiting in the model queues of the test broker (declaring them if needed)."""
    from celery import current_app

    with current_app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in current_app.amqp.queues.values():
            bound = queue(channel)
            bound.declare()
            bound.purge()


def broker_take(queue_name: str) -> list[tuple[list, int]]:
    """Consume every message now waiting in ``queue_name``: ``[(task args, priority), ...]`` in delivery order."""
    from celery import current_app

    taken = []
    with current_app.connection_for_write() as conn:
        bound = current_app.amqp.queues[queue_name](conn.default_channel)
        bound.declare()
        while (message := bound.get(no_ack=True)) is not None:
            args = message.decode()[0]
            taken.append((args, message.properties.get("priority", 0)))
    return taken


def broker_take_headers(queue_name: str) -> list[dict]:
    """Consume every message now waiting in ``queue_name``: their headers, in delivery order."""
    from celery import current_app

    taken = []
    with current_app.connection_for_write() as conn:
        bound = current_app.amqp.queues[queue_name](conn.default_channel)
        bound.declare()
        while (message := bound.get(no_ack=True)) is not None:
            taken.append(dict(message.headers))
    return taken


@pytest.fixture
def redis_clean(settings):
    """Empty our keys in the test Redis database (channel layer, replay streams, leases, rate-limit counters; not
    the live workers' fleet status) and the messages waiting in the test broker's model queues (a running
    worker keeps its own consumer)."""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)

    def clean():
        for pattern in ("chatsite*", "asgi*"):
            # Live workers' fleet status stays: admission control refuses everything without it.
            keys = [
                k
                for k in client.scan_iter(match=pattern, count=1000)
                if not k.startswith(b"chatsite:worker:")
            ]
            if keys:
                client.delete(*keys)
        broker_purge()

    clean()
    yield client
    clean()
