"""The chat consumer over the real Redis channel layer (``WebsocketCommunicator``, real PostgreSQL)."""

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from conversations import generation_worker, generations
from conversations.models import Message
from events import broadcast
from tests.sockets import connect, open_socket, reply_frame

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session_cookie(alice, client):
    client.force_login(alice)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


async def test_anonymous_socket_is_closed(redis_clean):
    communicator = connect()
    connected, _ = await communicator.connect()
    assert connected  # accepted, then closed with an application code the page does not retry
    assert (await communicator.receive_output())["code"] == 4401


async def test_foreign_origin_is_rejected(session_cookie, redis_clean):
    communicator = connect(session_cookie, origin=b"http://evil.example")
    connected, _ = await communicator.connect()
    assert not connected


async def test_invalid_frames_get_error_frames_and_socket_stays_open(session_cookie, redis_clean):
    ws = await open_socket(session_cookie)
    await ws.send_to(text_data="not json")
    assert (await ws.receive_json_from())["code"] == "invalid_request"
    await ws.send_json_to({"type": "send", "content": 3})
    error = await ws.receive_json_from()
    assert error["type"] == "error" and error["code"] == "invalid_request" and "content" in error["message"]
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "   "})
    assert (await ws.receive_json_from())["code"] == "invalid_request"
    assert await database_sync_to_async(Message.objects.count)() == 0
    await ws.disconnect()


async def test_send_answers_queued_and_stores_both_messages(session_cookie, alice, redis_clean):
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hello"})
    frame = await ws.receive_json_from()
    assert frame["type"] == "queued" and frame["position"] == 1 and frame["title"] == "Hello"
    reply = await database_sync_to_async(Message.objects.get)(pk=frame["message_id"])
    assert reply.status == "queued" and reply.role == "assistant"
    user_msg = await database_sync_to_async(Message.objects.get)(pk=frame["user_message_id"])
    assert user_msg.content == "Hello" and user_msg.conversation_id == frame["conversation_id"]
    await ws.disconnect()


async def test_second_send_while_reply_active_is_refused_with_retry_after(session_cookie, redis_clean):
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "one"})
    await ws.receive_json_from()
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "two"})
    error = await ws.receive_json_from()
    assert error["code"] == "too_many_generations" and error["retry_after"] > 0
    assert await database_sync_to_async(Message.objects.filter(role="user").count)() == 1
    await ws.disconnect()


async def test_published_tokens_reach_every_watching_tab_in_order(session_cookie, redis_clean):
    tab1 = await open_socket(session_cookie)
    await tab1.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    message_id = (await tab1.receive_json_from())["message_id"]
    tab2 = await open_socket(session_cookie)
    await tab2.send_json_to({"type": "resume", "message_id": message_id, "after_seq": -1})
    queued_again = await reply_frame(tab2)
    assert queued_again["type"] == "queued" and queued_again["message_id"] == message_id
    for seq, text in enumerate(["Hel", "lo", " 🌍"]):
        await sync_to_async(broadcast.publish)(
            message_id, broadcast.frame_token(message_id=message_id, seq=seq, text=text)
        )
    for tab in (tab1, tab2):
        frames = [await reply_frame(tab) for _ in range(3)]
        assert [f["seq"] for f in frames] == [0, 1, 2]
        assert "".join(f["text"] for f in frames) == "Hello 🌍"
    await tab1.disconnect()
    await tab2.disconnect()


async def test_resume_replays_missed_tokens_then_continues_live(session_cookie, redis_clean):
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    message_id = (await ws.receive_json_from())["message_id"]
    await ws.disconnect()  # the tab closes; generation goes on
    await database_sync_to_async(generation_worker.generation_start)(message_id=message_id)
    for seq, text in enumerate(["a", "b", "c"]):
        await sync_to_async(broadcast.publish)(
            message_id, broadcast.frame_token(message_id=message_id, seq=seq, text=text)
        )
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "resume", "message_id": message_id, "after_seq": 0})
    assert (await reply_frame(ws))["type"] == "started"
    replayed = [await reply_frame(ws) for _ in range(2)]
    assert [(f["seq"], f["text"]) for f in replayed] == [(1, "b"), (2, "c")]
    await sync_to_async(broadcast.publish)(
        message_id, broadcast.frame_token(message_id=message_id, seq=3, text="d")
    )
    assert (await reply_frame(ws))["seq"] == 3
    await ws.disconnect()


async def test_resume_of_finished_reply_sends_done_from_the_database(session_cookie, redis_clean):
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    message_id = (await ws.receive_json_from())["message_id"]
    message = await database_sync_to_async(generation_worker.generation_start)(message_id=message_id)
    await database_sync_to_async(generation_worker.generation_finish)(
        message=message,
        status="completed",
        text="Done text",
        finish_reason="stop",
        prompt_tokens=5,
        completion_tokens=2,
    )
    done = await ws.receive_json_from()  # live, through the group
    assert (
        done["type"] == "done" and done["content"] == "Done text" and done["usage"]["completion_tokens"] == 2
    )
    await ws.send_json_to({"type": "resume", "message_id": message_id, "after_seq": -1})
    again = await ws.receive_json_from()
    assert again == done
    await ws.disconnect()


async def test_stop_of_queued_reply_sends_done_cancelled(session_cookie, redis_clean):
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    message_id = (await ws.receive_json_from())["message_id"]
    await ws.send_json_to({"type": "stop", "message_id": message_id})
    done = await ws.receive_json_from()
    assert done["type"] == "done" and done["status"] == "cancelled"
    assert (await database_sync_to_async(Message.objects.get)(pk=message_id)).status == "cancelled"
    await ws.disconnect()


async def test_other_users_message_is_not_found(session_cookie, bob, redis_clean):
    ticket = await database_sync_to_async(generations.reply_request)(
        user=bob, conversation_id=None, content="secret"
    )
    ws = await open_socket(session_cookie)
    for frame in (
        {"type": "resume", "message_id": ticket.message.id, "after_seq": -1},
        {"type": "stop", "message_id": ticket.message.id},
        {"type": "send", "conversation_id": ticket.message.conversation_id, "content": "intrude"},
        {"type": "regenerate", "conversation_id": ticket.message.conversation_id},
    ):
        await ws.send_json_to(frame)
        assert (await ws.receive_json_from())["code"] == "not_found"
    assert (await database_sync_to_async(Message.objects.get)(pk=ticket.message.id)).status == "queued"
    assert await database_sync_to_async(Message.objects.count)() == 2
    await ws.disconnect()


async def test_idle_socket_survives_longer_than_a_redis_socket_timeout(session_cookie, redis_clean):
    """A tab that waits in silence (queued behind others) must still get the next frame."""
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    message_id = (await ws.receive_json_from())["message_id"]
    await asyncio.sleep(7)  # redis-py 8's default socket_timeout is 5 s
    await sync_to_async(broadcast.publish)(
        message_id, broadcast.frame_token(message_id=message_id, seq=0, text="late")
    )
    assert (await ws.receive_json_from(timeout=5))["text"] == "late"
    await ws.disconnect()


async def test_resume_of_a_reply_whose_worker_died_answers_interrupted(session_cookie, redis_clean):
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    message_id = (await ws.receive_json_from())["message_id"]
    await ws.disconnect()
    await database_sync_to_async(generation_worker.generation_start)(message_id=message_id)
    await sync_to_async(broadcast.publish)(
        message_id, broadcast.frame_token(message_id=message_id, seq=0, text="par")
    )
    # No lease was ever taken (as after a SIGKILL once it expired); make the reply look stale.
    await database_sync_to_async(
        lambda: Message.objects.filter(pk=message_id).update(updated_at=timezone.now() - timedelta(minutes=1))
    )()
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "resume", "message_id": message_id, "after_seq": -1})
    # The resume's read settles it and answers its done; the settling's own done was published before this
    # socket joined the reply's group (joined only for a reply that may still change), so it comes once.
    frame = await ws.receive_json_from(timeout=15)
    assert frame["type"] == "done" and frame["status"] == "interrupted" and frame["content"] == "par"
    assert (await database_sync_to_async(Message.objects.get)(pk=message_id)).status == "interrupted"
    await ws.disconnect()


async def test_user_group_reaches_every_open_socket_and_session_ended_closes_them(
    session_cookie, alice, redis_clean
):
    first, second = await open_socket(session_cookie), await open_socket(session_cookie)
    await sync_to_async(broadcast.publish_to_user)(alice.pk, {"type": "ping_test"})
    assert (await first.receive_json_from(timeout=5))["type"] == "ping_test"
    assert (await second.receive_json_from(timeout=5))["type"] == "ping_test"
    await sync_to_async(broadcast.publish_to_user)(alice.pk, {"type": "session_ended"})
    for socket in (first, second):
        assert (await socket.receive_json_from(timeout=5))["type"] == "session_ended"
        assert (await socket.receive_output(timeout=5))["code"] == 4401
