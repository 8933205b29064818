"""An API completion's view joins its reply's group after the reply is stored and its task sent
(docs/overhead-levers.md, lever 33), so a fast worker may publish before the join: ``api.follow.reply_frames``
catches up on those frames from the replay stream and the progress key, once each and in order. Real
database, Redis and the deployed pub/sub channel layer; the worker's publishing is ``broadcast.publish``."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from api import follow
from api.follow import reply_frames
from conversations.completions import completion_request
from conversations.models import Message
from database.connections import close_request_connections, closes_connections
from events import broadcast

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "smollm2-135m-instruct"


@closes_connections
def _queued_reply(user) -> Message:
    return completion_request(
        user=user, model=MODEL, messages=[{"role": "user", "content": "hi"}], sampling={}, store=True
    )


@closes_connections
def _complete(reply: Message, text: str) -> dict:
    Message.objects.filter(pk=reply.pk).update(status=Message.Status.COMPLETED, content=text)
    return broadcast.frame_done(message=Message.objects.get(pk=reply.pk))


def _token(reply: Message, seq: int, text: str) -> None:
    broadcast.publish(reply.id, broadcast.frame_token(message_id=reply.id, seq=seq, text=text))


async def _follow(layer, channel: str, reply: Message) -> list[tuple]:
    frames = [f async for f in reply_frames(layer, channel, reply.id)]
    await sync_to_async(close_request_connections)()  # the stored done frame's read, as the view's end does
    return [(f["type"], f.get("content")) for f in frames]


async def test_tokens_published_before_the_join_are_caught_up_once_and_in_order(alice, redis_clean):
    reply = await sync_to_async(_queued_reply)(alice)
    layer = get_channel_layer()
    channel = await layer.new_channel("api.")
    assert await broadcast.reply_progress(reply.id) is None
    publish = sync_to_async(broadcast.publish, thread_sensitive=False)
    token = sync_to_async(_token, thread_sensitive=False)
    # A fast worker: started and two tokens before the view joined the group.
    await publish(reply.id, broadcast.frame_started(message_id=reply.id))
    await token(reply, 0, "Hel")
    await token(reply, 1, "lo")
    await layer.group_add(broadcast.message_group(reply.id), channel)
    # After the join, before the view reads: a token that reaches it both live and in the replay.
    await token(reply, 2, " there")
    frames = reply_frames(layer, channel, reply.id)
    caught_up = [await asyncio.wait_for(anext(frames), 10) for _ in range(3)]
    await publish(reply.id, await sync_to_async(_complete)(reply, "Hello there"))
    live = [f async for f in frames]
    assert [(f["type"], f["seq"], f["text"]) for f in caught_up] == [
        ("token", 0, "Hel"),
        ("token", 1, "lo"),
        ("token", 2, " there"),
    ]
    # The live copy of token 2 was dropped: the end follows.
    assert [(f["type"], f["content"]) for f in live] == [("done", "Hello there")]


async def test_a_reply_that_ended_before_the_join_gets_its_stored_done_frame_at_once(
    alice, redis_clean, monkeypatch
):
    monkeypatch.setattr(follow, "IDLE_CHECK_S", 3600)  # not the quiet stream's database check: the catch-up
    reply = await sync_to_async(_queued_reply)(alice)
    layer = get_channel_layer()
    channel = await layer.new_channel("api.")
    publish = sync_to_async(broadcast.publish, thread_sensitive=False)
    await publish(reply.id, broadcast.frame_started(message_id=reply.id))
    await sync_to_async(_token, thread_sensitive=False)(reply, 0, "Done.")
    await publish(reply.id, await sync_to_async(_complete)(reply, "Done."))
    await layer.group_add(broadcast.message_group(reply.id), channel)
    assert await asyncio.wait_for(_follow(layer, channel, reply), 10) == [("done", "Done.")]
