"""Consumer frames of round 2: ``edit`` and ``continue`` over the socket, and tab sync through the user's
group (another tab hears about new messages; the tab that sent them does not get its own echo)."""

import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from conversations import generation_worker
from conversations.models import Message
from tests.sockets import open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session_cookie(alice, client):
    client.force_login(alice)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def _finish(message_id, text, finish_reason="stop"):
    message = generation_worker.generation_start(message_id=message_id)
    return generation_worker.generation_finish(
        message=message, status="completed", text=text, finish_reason=finish_reason
    )


async def test_edit_and_continue_frames_and_tab_sync(session_cookie, alice, redis_clean):
    sender, other = await open_socket(session_cookie), await open_socket(session_cookie)
    await sender.send_json_to({"type": "send", "conversation_id": None, "content": "Question"})
    queued = await sender.receive_json_from(timeout=15)
    assert queued["type"] == "queued"
    synced = await other.receive_json_from(timeout=15)
    assert synced == {
        "type": "conversation",
        "kind": "messages",
        "conversation_id": queued["conversation_id"],
        "title": "Question",
    }
    await database_sync_to_async(_finish)(queued["message_id"], "Once upon", "length")
    assert (await sender.receive_json_from(timeout=15))["type"] == "done"

    await sender.send_json_to({"type": "continue", "message_id": queued["message_id"]})
    cont = await sender.receive_json_from(timeout=15)
    assert cont["type"] == "queued"
    assert (await database_sync_to_async(Message.objects.get)(pk=cont["message_id"])).parent_id == queued[
        "message_id"
    ]
    await database_sync_to_async(_finish)(cont["message_id"], "a time")
    assert (await sender.receive_json_from(timeout=15))["type"] == "done"

    await sender.send_json_to(
        {"type": "edit", "message_id": queued["user_message_id"], "content": "Better question"}
    )
    edited = await sender.receive_json_from(timeout=15)
    assert edited["type"] == "queued" and edited["user_message_id"] != queued["user_message_id"]
    new_user = await database_sync_to_async(Message.objects.get)(pk=edited["user_message_id"])
    assert new_user.content == "Better question" and new_user.parent_id is None  # a sibling of the first
    # The sending socket got no echo of its own changes; the other tab got one per change.
    assert await sender.receive_nothing(timeout=0.5)
    kinds = [(await other.receive_json_from(timeout=15))["kind"] for _ in range(2)]
    assert kinds == ["messages", "messages"]
    await sender.disconnect()
    await other.disconnect()


async def test_edit_of_an_assistant_message_is_refused(session_cookie, alice, redis_clean):
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    queued = await ws.receive_json_from(timeout=15)
    await database_sync_to_async(_finish)(queued["message_id"], "Hello")
    await ws.receive_json_from(timeout=15)  # done
    await ws.send_json_to({"type": "edit", "message_id": queued["message_id"], "content": "x"})
    error = await ws.receive_json_from(timeout=15)
    assert error["type"] == "error" and error["code"] == "invalid_request"
    assert await database_sync_to_async(Message.objects.count)() == 2
    await ws.disconnect()
