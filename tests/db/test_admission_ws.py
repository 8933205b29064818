"""Admission refusals over the WebSocket: ``error`` frames with ``retry_after``, nothing stored."""

import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from conversations.models import Conversation, Message
from tests.db.conftest import fake_worker, publish_worker
from tests.db.test_consumer import open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.real_fleet]


@pytest.fixture
def session_cookie(alice, client):
    client.force_login(alice)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


async def test_no_worker_alive_answers_no_workers_at_once(session_cookie, redis_clean):
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
    error = await ws.receive_json_from()
    assert (error["type"], error["code"]) == ("error", "no_workers") and error["retry_after"] > 0
    assert not await database_sync_to_async(Conversation.objects.exists)()
    await ws.disconnect()


async def test_busy_free_user_gets_busy_with_retry_after_then_is_admitted_when_load_falls(
    session_cookie, redis_clean, settings
):
    settings.ADMISSION_MEAN_REPLY_TOKENS = 100
    settings.ADMISSION_DECODE_TOKENS_PER_S = 100.0

    def queue_free_replies(n):
        from billing.models import Tier
        from conversations import services

        filler = Tier.objects.get(name="free").users.create(username="filler")
        conversation = services.conversation_create(owner=filler)
        for _ in range(n):
            services.message_create(
                conversation=conversation,
                role="assistant",
                content="",
                status="queued",
                model_name=settings.INFERENCE_DEFAULT_MODEL,
            )

    await database_sync_to_async(queue_free_replies)(25)  # 25 s expected wait for a free request
    await database_sync_to_async(publish_worker)(fake_worker(settings.INFERENCE_DEFAULT_MODEL))
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
    error = await ws.receive_json_from()
    assert (error["code"], error["retry_after"]) == ("busy", 15)
    assert not await database_sync_to_async(
        Message.objects.filter(conversation__owner__username="alice").exists
    )()

    await database_sync_to_async(Message.objects.filter(status="queued").update)(status="completed")
    await database_sync_to_async(publish_worker)(fake_worker(settings.INFERENCE_DEFAULT_MODEL))
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
    queued = await ws.receive_json_from()
    assert queued["type"] == "queued" and queued["model"] == settings.INFERENCE_DEFAULT_MODEL
    await ws.disconnect()
