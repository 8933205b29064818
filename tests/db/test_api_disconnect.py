"""A ``/v1/chat/completions`` client that leaves before its reply ended cancels the reply, whenever it
leaves: with the request, while the response headers or the first chunk are being sent, or while a
non-streaming request waits. Django's real ASGI handler is driven the way a server drives it, with a ``send``
that waits on the socket (as uvicorn's flow control does; daphne's returns at once, see the integration
layer). Real database, Redis and broker; no worker, so an admitted reply stays ``queued`` until cancelled."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler

from api.services import api_key_create
from conversations.models import Message
from database.connections import closes_connections
from tests.db.api_asgi import completion_call

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "smollm2-135m-instruct"


@pytest.fixture
def key(alice):
    return api_key_create(user=alice)[1]


async def hang_up(key: str, body: dict, *, at: str) -> list[dict]:
    """Send ``body`` to the ASGI app and disconnect ``at``: ``request`` (with the request), ``headers``
    (while ``http.response.start`` is sent), ``first_chunk`` (while the first body chunk is sent) or
    ``waiting`` (once the reply is queued, nothing sent yet). Returns the messages the app sent."""
    scope, inbox = completion_call(key, body)
    if at == "request":
        inbox.put_nowait({"type": "http.disconnect"})
    elif at == "waiting":

        async def when_queued():
            while not await sync_to_async(replies_of)():
                await asyncio.sleep(0.05)
            inbox.put_nowait({"type": "http.disconnect"})

        waiter = asyncio.ensure_future(when_queued())
    sent: list[dict] = []

    async def send(message):
        sent.append(message)
        is_body = message["type"] == "http.response.body"
        if (at == "headers" and not is_body) or (at == "first_chunk" and is_body):
            inbox.put_nowait({"type": "http.disconnect"})
            await asyncio.sleep(0.2)  # the socket is slow to take the bytes: the disconnect is seen here

    await asyncio.wait_for(ASGIHandler()(scope, inbox.get, send), timeout=20)
    if at == "waiting":
        await waiter
    return sent


@closes_connections  # the async test's own ORM thread: leave no session open at teardown
def replies_of():
    return list(Message.objects.filter(role="assistant").values("id", "status"))


@pytest.mark.parametrize("at", ["headers", "first_chunk"])
async def test_streaming_client_gone_while_headers_or_first_chunk_are_sent_cancels_the_reply(
    alice, key, redis_clean, api_logs, at
):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "store": True}
    sent = await hang_up(key, body, at=at)
    start = sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    replies = await sync_to_async(replies_of)()
    assert [r["status"] for r in replies] == ["cancelled"]
    # The log lines of the request carry its x-request-id, the reply and the user.
    request_id = dict(start["headers"])[b"x-request-id"].decode()
    gone = [r for r in api_logs if "client went away" in r.getMessage()]
    assert len(gone) == 1
    assert (gone[0].request_id, gone[0].message_id, gone[0].user_id) == (
        request_id,
        replies[0]["id"],
        alice.pk,
    )


async def test_non_streaming_client_gone_while_waiting_cancels_the_reply(alice, key, redis_clean):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "store": True}
    await hang_up(key, body, at="waiting")
    assert [r["status"] for r in await sync_to_async(replies_of)()] == ["cancelled"]


@pytest.mark.parametrize("stream", [True, False])
async def test_client_gone_with_its_request_leaves_no_reply_to_generate(alice, key, redis_clean, stream):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream, "store": True}
    await hang_up(key, body, at="request")
    assert all(r["status"] == "cancelled" for r in await sync_to_async(replies_of)())


def test_a_subscription_dropped_unclosed_still_cancels_its_reply(alice, redis_clean):
    # Django cancels a request whose client left; landing in the middleware after the view returned, it drops
    # the response without closing it. The subscription's finalizer lets go of the reply then.
    import gc
    import time

    from api.follow import ReplySubscription
    from conversations.completions import completion_request
    from conversations.models import Message

    reply = completion_request(
        user=alice, model=MODEL, messages=[{"role": "user", "content": "hi"}], sampling={}, store=True
    )
    subscription = ReplySubscription(layer=None, channel="none", user=alice, message_id=reply.id)
    del subscription
    gc.collect()
    deadline = time.monotonic() + 10
    while Message.objects.get(pk=reply.pk).status != "cancelled" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Message.objects.get(pk=reply.pk).status == "cancelled"


def test_a_closed_subscription_is_not_let_go_twice_or_of_an_ended_reply(alice, redis_clean):
    from api.follow import ReplySubscription
    from conversations.completions import completion_request
    from conversations.models import Message

    reply = completion_request(
        user=alice, model=MODEL, messages=[{"role": "user", "content": "hi"}], sampling={}, store=True
    )
    subscription = ReplySubscription(layer=None, channel="none", user=alice, message_id=reply.id)
    subscription.ended = True  # the view saw the end: closing must not cancel
    subscription.close()
    del subscription
    assert Message.objects.get(pk=reply.pk).status == "queued"
