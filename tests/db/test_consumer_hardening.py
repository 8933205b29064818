"""Bad input over the real consumer (real PostgreSQL, Redis channel layer): every frame class of the
hostile-frame table (``devtools.drills.hostile``, which the ``bad_input`` drill sends too) gets its
documented answer, the socket stays usable and nothing stored changes; sessions that end close sockets;
``send`` with a ``client_id`` is idempotent."""

import asyncio
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.test import Client

from conversations import generation_worker, generations
from conversations.models import Conversation, Message
from devtools.drills.hostile import hostile_frames
from tests.sockets import open_socket, reply_frame

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def cookie_for(user) -> tuple[Client, str]:
    client = Client()
    client.force_login(user)
    return client, f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def snapshot():
    return (
        list(Conversation.objects.order_by("id").values_list("id", "owner_id", "title", "client_id")),
        list(Message.objects.order_by("id").values_list("id", "role", "status", "content", "client_id")),
    )


@pytest.fixture
def world(alice, bob):
    """alice: a conversation with a completed reply; bob: a conversation whose reply is still queued."""
    ticket = generations.reply_request(user=alice, conversation_id=None, content="alice says hi")
    reply = generation_worker.generation_start(message_id=ticket.message.id)
    generation_worker.generation_finish(
        message=reply, status="completed", text="hello alice", finish_reason="stop"
    )
    bob_ticket = generations.reply_request(user=bob, conversation_id=None, content="bob says hi")
    return {
        "alice_conversation": ticket.message.conversation_id,
        "alice_reply": ticket.message.id,
        "bob_conversation": bob_ticket.message.conversation_id,
        "bob_reply": bob_ticket.message.id,
        "bob_user_message": bob_ticket.user_message_id,
    }


async def test_every_bad_frame_gets_its_error_the_socket_stays_usable_and_nothing_changes(
    alice, world, redis_clean
):
    _, cookie = await sync_to_async(cookie_for)(alice)
    before = await database_sync_to_async(snapshot)()
    ws = await open_socket(cookie)
    table = hostile_frames(
        own_reply=world["alice_reply"],
        foreign_conversation=world["bob_conversation"],
        foreign_reply=world["bob_reply"],
        foreign_user_message=world["bob_user_message"],
    )
    for label, text, code in table:
        await ws.send_to(text_data=text)
        answer = await ws.receive_json_from(timeout=5)
        assert (answer["type"], answer["code"]) == ("error", code), label
        assert answer["message"] and "Traceback" not in answer["message"], label
        await asyncio.sleep(1 / settings.WS_FRAMES_PER_S)  # stay under the per-socket frame rate
    await ws.send_to(bytes_data=b"\x00\x01")
    assert (await ws.receive_json_from(timeout=5))["code"] == "invalid_request"
    # Still usable: a valid frame gets its normal answer.
    await ws.send_json_to({"type": "resume", "message_id": world["alice_reply"]})
    done = await ws.receive_json_from(timeout=5)
    assert (done["type"], done["content"]) == ("done", "hello alice")
    assert await database_sync_to_async(snapshot)() == before
    await ws.disconnect()


async def test_one_hundred_frames_a_second_are_each_answered_and_the_excess_is_rate_limited(
    alice, world, redis_clean, settings
):
    settings.WS_FRAMES_PER_S = 2.0  # slow refill, so the bound below holds on a loaded machine too
    _, cookie = await sync_to_async(cookie_for)(alice)
    before = await database_sync_to_async(snapshot)()
    ws = await open_socket(cookie)
    frame = {"type": "resume", "message_id": world["alice_reply"]}
    started = time.monotonic()
    for _ in range(100):
        await ws.send_json_to(frame)
        await asyncio.sleep(0.01)
    answers = [await ws.receive_json_from(timeout=10) for _ in range(100)]
    elapsed = time.monotonic() - started
    kinds = [a["type"] if a["type"] == "done" else a["code"] for a in answers]
    assert set(kinds) == {"done", "rate_limited"}
    # The burst passes, then about WS_FRAMES_PER_S per second; every other frame is refused.
    assert settings.WS_FRAME_BURST <= kinds.count("done") <= settings.WS_FRAME_BURST + 2.0 * elapsed + 1
    retry_after = max(a["retry_after"] for a in answers if a["type"] == "error")
    assert 0 < retry_after <= 1 / 2.0
    assert await ws.receive_nothing(timeout=0.3)  # exactly one answer per frame
    await asyncio.sleep(retry_after)
    await ws.send_json_to(frame)
    assert (await ws.receive_json_from(timeout=5))["type"] == "done"
    assert await database_sync_to_async(snapshot)() == before
    await ws.disconnect()


async def test_resent_send_with_the_same_client_id_returns_the_stored_ticket(alice, redis_clean):
    _, cookie = await sync_to_async(cookie_for)(alice)
    ws = await open_socket(cookie)
    client_id = str(uuid.uuid4())
    frame = {"type": "send", "conversation_id": None, "content": "only once", "client_id": client_id}
    await ws.send_json_to(frame)
    first = await ws.receive_json_from(timeout=5)
    await ws.disconnect()  # the network drops before the page saw the answer; it resends on a new socket
    ws = await open_socket(cookie)
    await ws.send_json_to(frame)
    again = await reply_frame(ws, timeout=5)
    assert again["type"] == "queued"
    for key in ("conversation_id", "message_id", "user_message_id"):
        assert again[key] == first[key]
    assert await database_sync_to_async(Conversation.objects.count)() == 1
    assert await database_sync_to_async(Message.objects.count)() == 2
    # Once the reply finished, a late resend gets the ticket and the final text, still storing nothing.
    reply = await database_sync_to_async(generation_worker.generation_start)(message_id=first["message_id"])
    await database_sync_to_async(generation_worker.generation_finish)(
        message=reply, status="completed", text="answer", finish_reason="stop"
    )
    assert (await reply_frame(ws, timeout=5))["type"] == "done"  # live: this socket watches the reply
    await ws.send_json_to(frame)
    assert (await reply_frame(ws, timeout=5))["message_id"] == first["message_id"]
    done = await reply_frame(ws, timeout=5)
    assert (done["type"], done["content"]) == ("done", "answer")
    # A new id in the same conversation is a new message.
    await ws.send_json_to(
        {
            "type": "send",
            "conversation_id": first["conversation_id"],
            "content": "next",
            "client_id": str(uuid.uuid4()),
        }
    )
    assert (await ws.receive_json_from(timeout=5))["message_id"] != first["message_id"]
    assert await database_sync_to_async(Message.objects.count)() == 4
    await ws.disconnect()


async def test_concurrent_resends_store_one_message(alice, redis_clean):
    client_id = uuid.uuid4()

    def send():
        return generations.reply_request(
            user=alice, conversation_id=None, content="race", client_id=client_id
        )

    tickets = await asyncio.gather(
        *(database_sync_to_async(send, thread_sensitive=False)() for _ in range(4))
    )
    assert len({t.message.id for t in tickets}) == 1
    assert sum(not t.duplicate for t in tickets) == 1
    assert await database_sync_to_async(Message.objects.filter(role="user").count)() == 1
    assert await database_sync_to_async(Conversation.objects.count)() == 1


async def expect_closed(ws, reason):
    frame = await ws.receive_json_from(timeout=5)
    assert (frame["type"], frame["reason"]) == ("session_ended", reason)
    assert (await ws.receive_output(timeout=5))["code"] == 4401


async def test_logout_closes_that_sessions_sockets_but_not_another_browsers(alice, redis_clean):
    browser1, cookie1 = await sync_to_async(cookie_for)(alice)
    _, cookie2 = await sync_to_async(cookie_for)(alice)
    ws1, ws2 = await open_socket(cookie1), await open_socket(cookie2)
    await sync_to_async(browser1.post)("/accounts/logout/")
    await expect_closed(ws1, "logged_out")
    assert await ws2.receive_nothing(timeout=0.5)
    await ws2.send_json_to({"type": "send", "conversation_id": None, "content": "still signed in"})
    assert (await ws2.receive_json_from(timeout=5))["type"] == "queued"
    await ws2.disconnect()


async def test_deactivation_closes_every_socket_and_a_stale_socket_refuses_send(alice, redis_clean):
    _, cookie = await sync_to_async(cookie_for)(alice)
    ws = await open_socket(cookie)
    alice.is_active = False
    await database_sync_to_async(alice.save)()
    await expect_closed(ws, "deactivated")
    assert await database_sync_to_async(Message.objects.count)() == 0


async def test_password_change_ends_other_sessions_and_their_frames_are_refused(alice, redis_clean):
    _, cookie = await sync_to_async(cookie_for)(alice)
    ws = await open_socket(cookie)
    alice.set_password("a-new-Secret-456")
    await database_sync_to_async(alice.save)()
    await expect_closed(ws, "password_changed")

    # A socket that never got that push (lost in a Redis restart, say) is refused at its next frame: the
    # password hash its session was signed with no longer matches, so nothing is stored.
    _, cookie = await sync_to_async(cookie_for)(alice)
    ws = await open_socket(cookie)
    changed = make_password("a-third-Secret-789")
    await database_sync_to_async(type(alice).objects.filter(pk=alice.pk).update)(password=changed)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "after the password changed"})
    await expect_closed(ws, "expired")
    assert await database_sync_to_async(Message.objects.count)() == 0


async def test_frame_on_a_socket_whose_session_was_flushed_is_refused(alice, redis_clean):
    browser, cookie = await sync_to_async(cookie_for)(alice)
    ws = await open_socket(cookie)
    await sync_to_async(browser.session.flush)()  # session gone without any event (e.g. expired, cleared)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "after the session ended"})
    await expect_closed(ws, "expired")
    assert await database_sync_to_async(Message.objects.count)() == 0
