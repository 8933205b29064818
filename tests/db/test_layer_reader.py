"""The channel layer's pub/sub reader stays on its blocking read once a chat socket has opened in the process,
also after every socket closed (events/layer_reader.py). Without the keep-alive subscription the reader of an
unsubscribed connection sleeps 100 ms between looks, and the first frames of the next socket or API stream
waited for the end of that nap (54 ms p50 at one client, docs/overhead.md)."""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from api.services import api_key_create
from database.connections import closes_connections
from events import broadcast
from events.layer_reader import KEEPALIVE_PREFIX, keep_layer_listening
from tests.db.api_asgi import completion_call
from tests.db.test_consumer_hardening import cookie_for
from tests.sockets import connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _shards(layer):
    """The running loop's pub/sub connections of ``layer`` (channels_redis 4.3's ``RedisPubSubLoopLayer``)."""
    return layer._get_layer()._shards


def _subscribed(layer) -> list[str]:
    """The channel names the running loop's connections of ``layer`` are subscribed to."""
    return [name for shard in _shards(layer) for name in shard._subscribed_to]


async def test_a_closed_socket_leaves_the_layer_reader_subscribed(alice, redis_clean):
    layer = get_channel_layer()
    _, cookie = await sync_to_async(cookie_for)(alice)
    ws = connect(cookie)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    await ws.disconnect()

    # The socket left its own channel and its user's group; the keep-alive channel is still there.
    names = set(_subscribed(layer))
    assert [n for n in names if KEEPALIVE_PREFIX in n]
    assert not [n for n in names if broadcast.user_group(alice.pk) in n]
    assert all(shard._pubsub.subscribed for shard in _shards(layer) if shard._subscribed_to)

    # A second socket opened after the first closed gets the frames published to the groups it joins.
    ws = connect(cookie)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    await layer.group_send(
        broadcast.user_group(alice.pk),
        {"type": "user.event", "frame": broadcast.frame_conversation(kind="renamed", conversation_id=1)},
    )
    frame = await ws.receive_json_from(timeout=5)
    assert (frame["type"], frame["kind"]) == ("conversation", "renamed")
    await ws.disconnect()


async def test_an_api_stream_that_ended_leaves_the_layer_reader_subscribed(alice, redis_clean):
    from django.core.handlers.asgi import ASGIHandler

    layer = get_channel_layer()
    key = (await sync_to_async(closes_connections(api_key_create))(user=alice))[1]
    scope, inbox = completion_call(
        key,
        {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    )
    statuses = []

    async def send(message):
        if message["type"] == "http.response.start":  # the stream is open: leave (no worker runs here)
            statuses.append(message["status"])
            inbox.put_nowait({"type": "http.disconnect"})

    await asyncio.wait_for(ASGIHandler()(scope, inbox.get, send), timeout=20)
    assert statuses == [200]
    names = set(_subscribed(layer))
    assert [n for n in names if KEEPALIVE_PREFIX in n]
    assert not [n for n in names if "api." in n]  # the stream's own channel is gone
    assert all(shard._pubsub.subscribed for shard in _shards(layer) if shard._subscribed_to)


@closes_connections
def _queued_reply():
    from conversations.models import Message

    return Message.objects.filter(role="assistant", status="queued").first()


async def test_a_completion_that_ended_leaves_no_channel_of_its_own_subscribed(alice, redis_clean):
    """A completion read to its ``done`` frame had no receive left to cancel, and channels_redis drops a
    pub/sub channel only then: each one left its channel subscribed for the life of the process."""
    from django.core.handlers.asgi import ASGIHandler

    layer = get_channel_layer()
    key = (await sync_to_async(closes_connections(api_key_create))(user=alice))[1]
    scope, inbox = completion_call(
        key,
        {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "store": True},
    )
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    handler = asyncio.ensure_future(ASGIHandler()(scope, inbox.get, send))
    reply = None
    for _ in range(200):  # no worker here: this test plays its part once the reply is queued
        reply = await sync_to_async(_queued_reply, thread_sensitive=False)()
        if reply is not None:
            break
        await asyncio.sleep(0.05)
    assert reply is not None
    names = set(_subscribed(layer))
    assert [n for n in names if "api." in n]  # the request's own channel, while it waits

    reply.content, reply.status, reply.finish_reason = "Hello!", "completed", "stop"
    await asyncio.to_thread(
        broadcast.publish, reply.id, broadcast.frame_token(message_id=reply.id, seq=0, text="Hello!")
    )
    await asyncio.to_thread(broadcast.publish, reply.id, broadcast.frame_done(message=reply))
    await asyncio.wait_for(handler, timeout=20)
    assert sent[0]["status"] == 200
    assert json.loads(sent[1]["body"])["choices"][0]["message"]["content"] == "Hello!"
    names = set(_subscribed(layer))
    assert not [n for n in names if "api." in n or "chat.message" in n]
    assert [n for n in names if KEEPALIVE_PREFIX in n]


async def test_the_keep_alive_channel_is_subscribed_once_per_event_loop(redis_clean):
    layer = get_channel_layer()
    for _ in range(3):
        await keep_layer_listening(layer)
    names = _subscribed(layer)
    assert len([n for n in names if KEEPALIVE_PREFIX in n]) == 1

    # Another event loop (another thread's, or a new process') gets a subscription of its own.
    def other_loop() -> list[str]:
        async def run():
            await keep_layer_listening(layer)
            subscribed = _subscribed(layer)
            await layer.flush()
            return subscribed

        return asyncio.run(run())

    assert [n for n in await asyncio.to_thread(other_loop) if KEEPALIVE_PREFIX in n]


async def test_without_a_layer_nothing_is_subscribed():
    await keep_layer_listening(None)  # a process without a channel layer: nothing to keep awake
