"""End to end over real PostgreSQL, Redis (channel layer, broker, replay streams) and a real Celery worker
process running the real default model. The consumer runs in-process through ``WebsocketCommunicator``."""

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.urls import reverse

from billing.models import Tier, UsageRecord
from billing.quota import quota_status
from conversations.models import Message
from safety.models import SafetyPolicy
from tests.sockets import open_socket

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

LONG_PROMPT = (
    "Write a very long, detailed story about a dragon who learns to bake bread. Use many paragraphs."
)


@pytest.fixture
def reply_tokens(alice):
    """Set the free tier's reply limit (tokens) for a test, keeping generations short on two CPU cores."""

    def set_limit(n: int):
        Tier.objects.filter(name="free").update(max_reply_tokens=n)

    return set_limit


@pytest.fixture
def output_unmoderated(alice):
    """The free tier's replies go out without the output guard chain. Its tokens are sampled, and a test of
    the stream itself must not depend on whether a sampled reply trips a guard (CI saw one blocked). The worker
    holds no cached policy for this tier row: transactional tests flush the tiers and ``make_user`` recreates them."""
    SafetyPolicy.objects.create(tier=Tier.objects.get(name="free"), moderate_output=False)


@pytest.fixture
def session_cookie(alice, client):
    client.force_login(alice)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


async def receive(ws, timeout=120):
    return await ws.receive_json_from(timeout=timeout)


async def read_until(ws, predicate, timeout=120):
    """Frames until (and including) the first for which ``predicate`` is true."""
    frames, deadline = [], time.monotonic() + timeout
    while True:
        frame = await receive(ws, timeout=max(0.1, deadline - time.monotonic()))
        frames.append(frame)
        if predicate(frame):
            return frames


def tokens_of(frames):
    return [f for f in frames if f["type"] == "token"]


async def stored(message_id):
    return await database_sync_to_async(Message.objects.get)(pk=message_id)


async def test_streamed_reply_arrives_in_order_and_equals_stored_message(
    celery_worker, session_cookie, alice, reply_tokens, redis_clean, output_unmoderated
):
    await database_sync_to_async(reply_tokens)(24)
    ws = await open_socket(session_cookie)
    await ws.send_json_to(
        {"type": "send", "conversation_id": None, "content": "What is the capital of France?"}
    )
    queued = await receive(ws)
    assert queued["type"] == "queued"
    frames = await read_until(ws, lambda f: f["type"] == "done")
    assert frames[0]["type"] == "started"
    tokens, done = tokens_of(frames), frames[-1]
    assert [t["seq"] for t in tokens] == list(range(len(tokens))) and tokens
    assert done["status"] == "completed" and done["finish_reason"] in ("stop", "length")
    text = "".join(t["text"] for t in tokens)
    message = await stored(queued["message_id"])
    assert message.content == text == done["content"] and text.strip()
    assert message.completion_tokens == done["usage"]["completion_tokens"] <= 24
    assert (
        message.prompt_tokens > 0 and message.ttft_ms is not None and message.duration_ms >= message.ttft_ms
    )
    usage = await database_sync_to_async(UsageRecord.objects.get)(message_id=message.id)
    assert (usage.user_id, usage.completion_tokens) == (alice.id, message.completion_tokens)
    await ws.disconnect()


async def test_multi_turn_context_reaches_the_model(celery_worker, session_cookie, reply_tokens, redis_clean):
    await database_sync_to_async(reply_tokens)(8)
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "My name is Zorblax."})
    queued = await receive(ws)
    await read_until(ws, lambda f: f["type"] == "done")
    await ws.send_json_to(
        {"type": "send", "conversation_id": queued["conversation_id"], "content": "What is my name?"}
    )
    second = await receive(ws)
    done = (await read_until(ws, lambda f: f["type"] == "done"))[-1]
    # The reply ran to its end. Its tokens are sampled, so the output guard may flag one (CI saw "blocked" once);
    # that verdict is not this test's subject, the prompt the model saw is.
    assert done["status"] in ("completed", "blocked")
    first_reply = await stored(queued["message_id"])
    second_reply = await stored(second["message_id"])
    # The second prompt holds both user turns and the first reply, under the chat template.
    assert second_reply.prompt_tokens > first_reply.prompt_tokens + first_reply.completion_tokens
    await ws.disconnect()


async def test_stop_keeps_partial_text_as_cancelled(celery_worker, session_cookie, reply_tokens, redis_clean):
    await database_sync_to_async(reply_tokens)(400)
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": LONG_PROMPT})
    message_id = (await receive(ws))["message_id"]
    before = await read_until(ws, lambda f: f["type"] == "token" and f["seq"] >= 2)
    stop_sent = time.monotonic()
    await ws.send_json_to({"type": "stop", "message_id": message_id})
    after = await read_until(ws, lambda f: f["type"] == "done", timeout=30)
    stop_latency = time.monotonic() - stop_sent
    done = after[-1]
    assert done["status"] == "cancelled" and done["finish_reason"] == "cancelled"
    tokens = tokens_of(before + after)
    message = await stored(message_id)
    assert message.status == "cancelled"
    assert message.content == "".join(t["text"] for t in tokens) == done["content"]
    assert 3 <= message.completion_tokens < 400
    assert stop_latency < 5, f"stop took {stop_latency:.2f} s"
    await ws.disconnect()


async def test_deleting_the_chat_while_it_streams_stops_the_reply_and_charges_what_it_generated(
    celery_worker, session_cookie, reply_tokens, client, alice, redis_clean
):
    await database_sync_to_async(reply_tokens)(400)
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": LONG_PROMPT})
    queued = await receive(ws)
    await read_until(ws, lambda f: f["type"] == "token" and f["seq"] >= 2)
    url = reverse("conversations:delete", args=[queued["conversation_id"]])
    deleted = await database_sync_to_async(client.post)(url, headers={"accept": "application/json"})
    deleted_at = time.monotonic()
    assert deleted.status_code == 200
    # The worker stops the reply (the engine frees its slot) and still says it ended to whoever follows it.
    done = (await read_until(ws, lambda f: f["type"] == "done", timeout=30))[-1]
    assert time.monotonic() - deleted_at < 5
    assert (done["message_id"], done["status"]) == (queued["message_id"], "cancelled")
    assert not await database_sync_to_async(Message.objects.filter(pk=queued["message_id"]).exists)()
    record = await database_sync_to_async(UsageRecord.objects.get)(user=alice)
    assert record.message_id is None and 3 <= record.completion_tokens < 400
    quota = await database_sync_to_async(quota_status)(user=alice)
    assert (quota.reserved, quota.used) == (0, record.prompt_tokens + record.completion_tokens)
    await ws.disconnect()


async def test_disconnect_and_resume_replays_and_continues(
    celery_worker, session_cookie, reply_tokens, redis_clean
):
    # Long enough that the reply is still streaming after the 1 s away even on an idle box (batch-1 decode
    # reaches ~75 tokens/s there); a reply that ended meanwhile is answered with ``done`` alone (its
    # content is the whole text), which is not what this test is about.
    await database_sync_to_async(reply_tokens)(300)
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": LONG_PROMPT})
    message_id = (await receive(ws))["message_id"]
    first = tokens_of(await read_until(ws, lambda f: f["type"] == "token" and f["seq"] >= 1))
    await ws.disconnect()  # lost network / closed tab
    await asyncio.sleep(1.0)  # generation goes on meanwhile
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "resume", "message_id": message_id, "after_seq": first[-1]["seq"]})
    frames = await read_until(ws, lambda f: f["type"] == "done")
    done = frames[-1]
    seen = {t["seq"]: t["text"] for t in first + tokens_of(frames)}
    assert sorted(seen) == list(range(len(seen)))
    message = await stored(message_id)
    assert message.status == "completed"
    assert "".join(seen[i] for i in sorted(seen)) == message.content == done["content"]
    assert message.completion_tokens == len(seen) or message.content  # deltas may merge several tokens
    await ws.disconnect()


async def test_killed_worker_leaves_reply_interrupted_not_streaming(
    worker_factory, session_cookie, reply_tokens, redis_clean, settings
):
    from conversations.reaper import reap_interrupted
    from inference.worker import LEASE_TTL_S
    from tests.db.conftest import fake_worker, publish_worker

    # The victim alone serves a queue of its own, so it is certainly the one generating this reply: replies of
    # the free tier name a model whose queue only the victim consumes (its engine serves the default weights).
    await database_sync_to_async(Tier.objects.filter(name="free").update)(model_name="victim")
    victim = await asyncio.to_thread(worker_factory, "victim", "inference.victim")
    # Admission control needs a live worker for "victim": register the name here and publish the victim's
    # status under it (the victim itself publishes the default model's name, the weights it loaded).
    settings.INFERENCE_MODELS = {
        **settings.INFERENCE_MODELS,
        "victim": settings.INFERENCE_MODELS[settings.INFERENCE_DEFAULT_MODEL],
    }
    await asyncio.to_thread(publish_worker, fake_worker("victim"), ttl_s=60)
    await database_sync_to_async(reply_tokens)(400)
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": LONG_PROMPT})
    message_id = (await receive(ws))["message_id"]
    streamed = tokens_of(await read_until(ws, lambda f: f["type"] == "token" and f["seq"] >= 1))
    victim.kill()
    assert (await stored(message_id)).status == "streaming"
    await asyncio.sleep(LEASE_TTL_S + 1)
    # Any live worker's reaper does this within seconds; the test runs the same step itself.
    await database_sync_to_async(reap_interrupted)(grace_s=0)
    done = (await read_until(ws, lambda f: f["type"] == "done", timeout=30))[-1]
    message = await stored(message_id)
    assert done["status"] == "interrupted" and message.status == "interrupted" and message.error
    # The partial text streamed before the crash is kept.
    assert (
        message.content.startswith("".join(t["text"] for t in streamed))
        and message.content == done["content"]
    )
    await ws.disconnect()


async def test_old_turns_left_out_of_a_small_context_are_recorded(
    celery_worker, session_cookie, alice, redis_clean
):
    from conversations import services

    def long_conversation():
        Tier.objects.filter(name="free").update(max_context_tokens=160, max_reply_tokens=8)
        conversation = services.conversation_create(owner=alice, title="long", system_prompt="You are terse.")
        for i in range(6):
            services.message_create(
                conversation=conversation, role="user", content=f"Turn {i}: " + "tell me more " * 8
            )
            services.message_create(conversation=conversation, role="assistant", content="Sure. " * 10)
        return conversation.id

    conversation_id = await database_sync_to_async(long_conversation)()
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": conversation_id, "content": "And finally?"})
    message_id = (await receive(ws))["message_id"]
    frames = await read_until(ws, lambda f: f["type"] == "done")
    started, done = frames[0], frames[-1]
    message = await stored(message_id)
    assert started["type"] == "started" and started["omitted_messages"] == message.omitted_messages > 0
    assert done["omitted_messages"] == message.omitted_messages
    # The prompt that was sent fits the tier's context minus its reply limit.
    assert message.prompt_tokens <= 160 - 8
    await ws.disconnect()
