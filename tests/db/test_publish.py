"""``events.broadcast.publish`` on the deployed pub/sub channel layer: the replay stream (or the progress key)
and the group's frame go out in one Redis pipeline from the calling thread, in that order, and a consumer in
the reply's group receives the frame as channels_redis delivers any group message; on another layer the group
send takes the layer's own path (docs/overhead-levers.md, lever 14). ``publish_to_user`` sends from the calling
thread too (lever 45). Real Redis."""

import asyncio

import pytest
from channels.layers import get_channel_layer

from events import broadcast

MESSAGE_ID = 987_654


@pytest.fixture
def no_layer_loop(monkeypatch):
    """Fails a publish that hops onto the process's channel-layer loop thread."""

    def refused(*args, **kwargs):
        raise AssertionError("the frame went through the channel-layer loop thread")

    monkeypatch.setattr(broadcast._layer_loop, "run", refused)


@pytest.mark.asyncio
async def test_a_token_and_its_replay_entry_go_out_in_one_pipeline_to_the_group(redis_clean, no_layer_loop):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(broadcast.message_group(MESSAGE_ID), channel)
    frame = broadcast.frame_token(message_id=MESSAGE_ID, seq=0, text="Hel")

    await asyncio.to_thread(broadcast.publish, MESSAGE_ID, frame)

    event = await asyncio.wait_for(layer.receive(channel), timeout=5)
    assert event == {"type": "chat.frame", "frame": frame}
    entries = broadcast.redis_client().xrange(broadcast.stream_key(MESSAGE_ID))
    assert [(e[b"seq"], e[b"text"]) for _, e in entries] == [(b"0", b"Hel")]
    assert broadcast.redis_client().ttl(broadcast.stream_key(MESSAGE_ID)) > 0
    await layer.group_discard(broadcast.message_group(MESSAGE_ID), channel)


@pytest.mark.asyncio
async def test_started_and_done_mark_progress_before_the_group_hears_them(redis_clean, no_layer_loop):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(broadcast.message_group(MESSAGE_ID), channel)
    assert not await broadcast.reply_progressed(MESSAGE_ID)

    await asyncio.to_thread(broadcast.publish, MESSAGE_ID, broadcast.frame_started(message_id=MESSAGE_ID))

    event = await asyncio.wait_for(layer.receive(channel), timeout=5)
    assert event["frame"]["type"] == "started"
    assert await broadcast.reply_progressed(MESSAGE_ID)
    await layer.group_discard(broadcast.message_group(MESSAGE_ID), channel)


def test_the_pipeline_is_used_only_on_the_pubsub_layer_of_redis_url(settings):
    group = broadcast.message_group(MESSAGE_ID)
    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    assert broadcast._pubsub_group_channel(group) == f"{prefix}__group__{group}"

    other_redis = {**settings.CHANNEL_LAYERS["default"]["CONFIG"], "hosts": ["redis://127.0.0.1:6390/0"]}
    settings.CHANNEL_LAYERS = {"default": {**settings.CHANNEL_LAYERS["default"], "CONFIG": other_redis}}
    assert broadcast._pubsub_group_channel(group) is None

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [settings.REDIS_URL]},
        }
    }
    assert broadcast._pubsub_group_channel(group) is None


@pytest.mark.asyncio
async def test_on_the_list_layer_the_frame_takes_the_layers_own_group_send(redis_clean, settings):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [settings.REDIS_URL], "prefix": "chatsite-test-list"},
        }
    }
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(broadcast.message_group(MESSAGE_ID), channel)
    frame = broadcast.frame_token(message_id=MESSAGE_ID, seq=0, text="Hi")

    await asyncio.to_thread(broadcast.publish, MESSAGE_ID, frame)

    assert await asyncio.wait_for(layer.receive(channel), timeout=5) == {"type": "chat.frame", "frame": frame}
    await layer.group_discard(broadcast.message_group(MESSAGE_ID), channel)


@pytest.mark.asyncio
async def test_a_frame_to_a_users_sockets_goes_out_from_the_calling_thread(redis_clean, no_layer_loop):
    """``publish_to_user`` (tab sync, session ends) on the pub/sub layer: the group's PUBLISH from the caller's
    thread, received as the layer's own group send delivers it (lever 45)."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(broadcast.user_group(4242), channel)
    frame = broadcast.frame_conversation(kind="messages", conversation_id=7, title="Hello")

    await asyncio.to_thread(broadcast.publish_to_user, 4242, frame, session="verify")

    event = await asyncio.wait_for(layer.receive(channel), timeout=5)
    assert event == {"type": "user.event", "frame": frame, "session": "verify"}
    await layer.group_discard(broadcast.user_group(4242), channel)
