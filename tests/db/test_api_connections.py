"""A streamed ``/v1/chat/completions`` gives its database connection back once the reply is stored, not
when the stream ends: with psycopg's pool (``DB_POOL_MAX_SIZE`` 16) a connection held for a stream's whole
length kept the 17th concurrent client waiting for one before its key was checked (docs/overhead.md). Tests
run without the pool, so a connection still held is a PostgreSQL backend still open. Django's real ASGI
handler, real database, Redis and broker; no worker, so the reply stays ``queued`` until the client leaves."""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from api.services import api_key_create
from conversations.models import Message
from database.connections import closes_connections
from tests.db.api_asgi import completion_call, completion_opened_and_left

pytestmark = pytest.mark.django_db(transaction=True)


@closes_connections
def backends() -> int:
    """Client backends open on the test database, this probe's own excluded."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@closes_connections
def statuses() -> list[str]:
    return list(Message.objects.filter(role="assistant").values_list("status", flat=True))


async def test_a_streamed_completion_holds_no_database_connection_while_it_streams(alice, redis_clean):
    from django.core.handlers.asgi import ASGIHandler

    key = (await sync_to_async(closes_connections(api_key_create))(user=alice))[1]
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "store": True,
    }
    scope, inbox = completion_call(key, body)
    before = await sync_to_async(backends, thread_sensitive=False)()
    seen: dict = {}

    async def send(message):
        if message["type"] == "http.response.start":
            # The reply is queued and the stream open: count while it streams, then leave.
            seen["status"] = message["status"]
            # The fewest over 0.5 s: the admission warmer, which a completion keeps running for its client
            # (lever 39), holds a connection of its own for the few ms of each pass; a stream that held one
            # would be counted in every sample.
            counts = []
            for _ in range(10):
                counts.append(await sync_to_async(backends, thread_sensitive=False)())
                await asyncio.sleep(0.05)
            seen["during"] = min(counts)
            seen["replies"] = await sync_to_async(statuses, thread_sensitive=False)()
            inbox.put_nowait({"type": "http.disconnect"})

    await asyncio.wait_for(ASGIHandler()(scope, inbox.get, send), timeout=20)
    assert seen["status"] == 200 and seen["replies"] == ["queued"]
    assert seen["during"] == before
    assert await sync_to_async(statuses, thread_sensitive=False)() == ["cancelled"]


async def test_a_completion_checks_its_key_and_stores_its_reply_in_one_hop_on_a_reply_service_thread(
    alice, redis_clean, monkeypatch
):
    """The key check and the reply's transaction run in one call on the reply services' pool (lever 37), as a
    chat socket's send: not two hops on the thread Django's handler gives each request."""
    import threading

    from api import v1

    threads: dict[str, str] = {}

    def on_thread(name, func):
        def call(*args, **kwargs):
            threads[name] = threading.current_thread().name
            return func(*args, **kwargs)

        return call

    monkeypatch.setattr(v1, "user_for_request", on_thread("key check", v1.user_for_request))
    monkeypatch.setattr(v1, "completion_request", on_thread("reply stored", v1.completion_request))
    key = (await sync_to_async(closes_connections(api_key_create))(user=alice))[1]
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert await completion_opened_and_left(key, body) == 200
    assert threads["key check"] == threads["reply stored"]
    assert threads["key check"].startswith("reply-service")
