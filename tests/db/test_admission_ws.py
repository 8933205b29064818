"""Admission refusals over the WebSocket: ``error`` frames with ``retry_after``, nothing stored."""

import asyncio
from uuid import uuid4

import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from conversations.models import Conversation, Message
from tests.db.conftest import fake_worker, publish_worker
from tests.sockets import open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.real_fleet]


def full_worker(model):
    """A live worker of ``model`` whose running slots are all taken, nothing waiting: queued replies wait for
    slots to free (an engine with free slots starts them at once, so they would not be a wait)."""
    return fake_worker(model, running=32, max_num_seqs=32)


def queue_free_replies(n):
    """``n`` replies of another free user waiting in the queue (``n`` s of expected wait for a free request
    at 100 tokens/s and 100 tokens per reply; none for a paid one, which the broker delivers first)."""
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

    await database_sync_to_async(queue_free_replies)(25)  # 25 s expected wait for a free request
    await database_sync_to_async(publish_worker)(full_worker(settings.INFERENCE_DEFAULT_MODEL))
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
    error = await ws.receive_json_from()
    assert (error["code"], error["retry_after"]) == ("busy", 15)
    assert not await database_sync_to_async(
        Message.objects.filter(conversation__owner__username="alice").exists
    )()

    await database_sync_to_async(Message.objects.filter(status="queued").update)(status="completed")
    await database_sync_to_async(publish_worker)(full_worker(settings.INFERENCE_DEFAULT_MODEL))
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
    queued = await ws.receive_json_from()
    assert queued["type"] == "queued" and queued["model"] == settings.INFERENCE_DEFAULT_MODEL
    await ws.disconnect()


async def test_a_tier_change_applies_to_an_open_socket_at_its_next_send(
    session_cookie, alice, redis_clean, settings
):
    """The socket's user was loaded at connect; an approved upgrade, then an admin's downgrade, decide the
    next sends on the same socket (within ADMISSION_LOAD_CACHE_S), without a reconnect."""
    from billing.models import Tier
    from billing.services import upgrade_request_approve, upgrade_request_create

    settings.ADMISSION_MEAN_REPLY_TOKENS = 100
    settings.ADMISSION_DECODE_TOKENS_PER_S = 100.0
    settings.ADMISSION_LOAD_CACHE_S = 0.3
    await database_sync_to_async(queue_free_replies)(25)  # free: 25 s > 10 s threshold; paid: 0 s
    await database_sync_to_async(publish_worker)(full_worker(settings.INFERENCE_DEFAULT_MODEL), ttl_s=300)
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
    assert (await ws.receive_json_from())["code"] == "busy"

    def upgrade():
        request, _ = upgrade_request_create(user=alice, to_tier=Tier.objects.get(name="paid"))
        upgrade_request_approve(request=request)

    await database_sync_to_async(upgrade)()
    await asyncio.sleep(settings.ADMISSION_LOAD_CACHE_S + 0.1)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
    queued = await ws.receive_json_from()
    assert queued["type"] == "queued", queued
    reply = await database_sync_to_async(Message.objects.select_related("conversation__owner__tier").get)(
        pk=queued["message_id"]
    )
    assert reply.conversation.owner.tier.name == "paid"

    def downgrade():  # as the admin's user list does (list_editable tier)
        alice.tier = Tier.objects.get(name="free")
        alice.save(update_fields=["tier"])

    await database_sync_to_async(downgrade)()
    await asyncio.sleep(settings.ADMISSION_LOAD_CACHE_S + 0.1)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "again"})
    error = await ws.receive_json_from()
    assert (error["type"], error["code"]) == ("error", "busy")
    await ws.disconnect()


def refusals_from_memory() -> float:
    """How many WebSocket refusals this process decided from memory (the histogram's count)."""
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("chatsite:websocket_refusal_seconds_count", {"decided": "memory"}) or 0.0


async def test_a_refusal_is_decided_from_warm_figures_and_an_ended_session_still_closes_the_socket(
    session_cookie, alice, client, redis_clean, settings
):
    """With the figures warm (as the web process's warmer keeps them for its sockets' users) a busy refusal is
    answered from memory, before any database read; the session check still follows and closes the socket."""
    from conversations import load

    settings.ADMISSION_MEAN_REPLY_TOKENS = 100
    settings.ADMISSION_DECODE_TOKENS_PER_S = 100.0
    settings.ADMISSION_LOAD_CACHE_S = 30.0
    await database_sync_to_async(queue_free_replies)(25)
    await database_sync_to_async(publish_worker)(full_worker(settings.INFERENCE_DEFAULT_MODEL))
    ws = await open_socket(session_cookie)
    await database_sync_to_async(load.warm)(user_ids=[alice.pk])
    before = refusals_from_memory()
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
    assert (await ws.receive_json_from())["code"] == "busy"
    assert refusals_from_memory() == before + 1

    await database_sync_to_async(client.session.flush)()  # the session ends without any event
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
    # The first frame's own session check may run after the flush (it follows its answer), so the socket
    # closes at that check or at the next frame's, after at most this frame's busy refusal.
    frames = [await ws.receive_json_from(timeout=5)]
    if frames[0]["type"] != "session_ended":
        frames.append(await ws.receive_json_from(timeout=5))
    assert frames[-1] == {"type": "session_ended", "reason": "expired"}
    assert all(f.get("code") == "busy" for f in frames[:-1]), frames
    assert (await ws.receive_output(timeout=5))["code"] == 4401
    assert not await database_sync_to_async(
        Message.objects.filter(conversation__owner__username="alice").exists
    )()


async def test_a_keyed_send_is_refused_from_memory_but_a_resend_gets_its_stored_ticket(
    session_cookie, alice, redis_clean, settings
):
    """The page keys every send (client_id): such a send is refused from the warm figures like any other;
    a ``resend`` of a stored one is answered with its ticket even while the tier is refused."""
    from conversations import load

    settings.ADMISSION_MEAN_REPLY_TOKENS = 100
    settings.ADMISSION_DECODE_TOKENS_PER_S = 100.0
    settings.ADMISSION_LOAD_CACHE_S = 0.2
    await database_sync_to_async(publish_worker)(full_worker(settings.INFERENCE_DEFAULT_MODEL), ttl_s=300)
    ws = await open_socket(session_cookie)
    key = "4b0f5d2e-8c1a-4f5e-9a57-0e6c1d2b3a4f"
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello", "client_id": key})
    queued = await ws.receive_json_from()
    assert queued["type"] == "queued", queued

    await database_sync_to_async(queue_free_replies)(25)  # now busy for free
    await asyncio.sleep(0.3)  # the figures cached by that send have expired
    settings.ADMISSION_LOAD_CACHE_S = 30.0
    await database_sync_to_async(load.warm)(user_ids=[alice.pk])
    before = refusals_from_memory()
    other = "9c1d2b3a-4f5e-4a57-8e6c-0e6c1d2b3a4f"
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "again", "client_id": other})
    assert (await ws.receive_json_from())["code"] == "busy"
    assert refusals_from_memory() == before + 1

    frame = {"type": "send", "conversation_id": None, "content": "hello", "client_id": key, "resend": True}
    await ws.send_json_to(frame)
    again = await ws.receive_json_from()
    assert (again["type"], again["message_id"]) == ("queued", queued["message_id"]), again
    assert refusals_from_memory() == before + 1
    stored = await database_sync_to_async(
        Message.objects.filter(conversation__owner__username="alice").count
    )()
    assert stored == 2  # the first send's user message and reply, nothing from the refusal or the resend
    await ws.disconnect()


def rejections(reason: str) -> float:
    from prometheus_client import REGISTRY

    labels = {"tier": "free", "reason": reason}
    return REGISTRY.get_sample_value("chatsite:admission_rejections_total", labels) or 0.0


async def test_refusals_at_the_gate_are_counted_for_metrics_and_the_staff_page(
    session_cookie, alice, redis_clean, settings
):
    """A refusal decided at the consumer's gate (from memory, or after a read) counts in
    ``admission_rejections_total`` and, within a second or so, in the staff page's per-minute counts, just as a
    refusal decided by the service does."""
    from conversations import load, refusals

    await database_sync_to_async(refusals.refusals_flush)()  # what earlier tests of this process noted
    counted = await database_sync_to_async(refusals.refusals_recent)(minutes=2)
    ws = await open_socket(session_cookie)
    before = rejections("no_workers")
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})  # read at the gate
    assert (await ws.receive_json_from())["code"] == "no_workers"
    assert rejections("no_workers") == before + 1

    settings.ADMISSION_MEAN_REPLY_TOKENS = 100
    settings.ADMISSION_DECODE_TOKENS_PER_S = 100.0
    settings.ADMISSION_LOAD_CACHE_S = 30.0
    await database_sync_to_async(queue_free_replies)(25)
    await database_sync_to_async(publish_worker)(full_worker(settings.INFERENCE_DEFAULT_MODEL))
    await database_sync_to_async(load.warm)(user_ids=[alice.pk])
    before_busy, before_memory = rejections("busy"), refusals_from_memory()
    for _ in range(2):
        await ws.send_json_to({"type": "send", "conversation_id": None, "content": "hello"})
        assert (await ws.receive_json_from())["code"] == "busy"
    assert refusals_from_memory() == before_memory + 2
    assert rejections("busy") == before_busy + 2

    def added(recent, reason):
        return recent.get(("free", reason), 0) - counted.get(("free", reason), 0)

    deadline = asyncio.get_running_loop().time() + refusals.NOTE_FLUSH_S + 5
    while asyncio.get_running_loop().time() < deadline:
        recent = await database_sync_to_async(refusals.refusals_recent)(minutes=2)
        if added(recent, "busy") == 2:
            break
        await asyncio.sleep(0.1)
    assert (added(recent, "no_workers"), added(recent, "busy")) == (1, 2), (counted, recent)
    await ws.disconnect()


@pytest.fixture
def thread_hops(monkeypatch):
    """Counts the consumer's hops onto a worker thread (asgiref's ``sync_to_async`` calls, under
    ``database_sync_to_async`` too) while ``counting`` is set; the calls themselves run unchanged. The
    admission warmer's own task (``conversations/load_warmer.py``) runs beside the socket on its own period
    and is not the send's hop, so its passes are not counted."""
    from asgiref.sync import SyncToAsync

    from conversations.load_warmer import TASK_NAME

    original = SyncToAsync.__call__
    hops = {"counting": False, "calls": []}

    async def counted(self, *args, **kwargs):
        task = asyncio.current_task()
        if hops["counting"] and (task is None or task.get_name() != TASK_NAME):
            hops["calls"].append(getattr(self.func, "__name__", repr(self.func)))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    return hops


async def send_counting_hops(ws, thread_hops) -> dict:
    """Send a keyed ``send`` on ``ws`` and return its ``queued`` answer, counting the thread hops (see
    :func:`thread_hops`) from the frame to that answer."""
    thread_hops["counting"] = True
    await ws.send_json_to(
        {"type": "send", "conversation_id": None, "content": "hello", "client_id": str(uuid4())}
    )
    queued = await ws.receive_json_from(timeout=10)
    thread_hops["counting"] = False
    assert queued["type"] == "queued", queued
    return queued


async def test_a_send_let_through_the_warm_gate_costs_one_thread_hop_session_check_included(
    session_cookie, alice, client, redis_clean, settings, thread_hops, monkeypatch
):
    """The session check and the service run in one worker-thread call, and the ``queued`` frame is built from
    the service's own objects; the check still stops a send whose session ended, storing nothing. (Here the
    warmer never counts as having verified the session; the next test is the case where it has.)"""
    from conversations import load, load_warmer

    monkeypatch.setattr(load_warmer, "session_verified", lambda **_: False)
    settings.ADMISSION_LOAD_CACHE_S = 30.0
    await database_sync_to_async(publish_worker)(fake_worker(settings.INFERENCE_DEFAULT_MODEL), ttl_s=300)
    ws = await open_socket(session_cookie)
    await database_sync_to_async(load.warm)(user_ids=[alice.pk])
    queued = await send_counting_hops(ws, thread_hops)
    assert thread_hops["calls"] == ["reply_request"]  # was: session check, reply_request, the queued frame
    assert await database_sync_to_async(
        Message.objects.filter(pk=queued["message_id"], status="queued").exists
    )()

    await database_sync_to_async(Message.objects.filter(status="queued").update)(status="completed")
    await database_sync_to_async(client.session.flush)()  # the session ends without any event
    await ws.send_json_to(
        {"type": "send", "conversation_id": None, "content": "again", "client_id": str(uuid4())}
    )
    assert await ws.receive_json_from(timeout=10) == {"type": "session_ended", "reason": "expired"}
    assert (await ws.receive_output(timeout=5))["code"] == 4401
    stored = await database_sync_to_async(Message.objects.filter(conversation__owner=alice).count)()
    assert stored == 2  # the first send's user message and reply only


async def test_a_send_from_a_session_the_warmer_just_verified_reads_no_session_and_a_stale_one_does(
    session_cookie, alice, client, redis_clean, settings, thread_hops, monkeypatch
):
    """The warmer found the socket's session current less than ``ADMISSION_LOAD_CACHE_S`` ago: the send runs
    no session read of its own (docs/overhead-levers.md, lever 16). Once that verification is older, the send's
    service checks the session again, and a session ended meanwhile stores nothing."""
    from accounts import sessions
    from conversations import consumer_admission, consumers, load, load_warmer

    settings.ADMISSION_LOAD_CACHE_S = 30.0
    reads = []
    real_check = sessions.session_is_current

    def counted_check(**kwargs):
        reads.append(kwargs)
        return real_check(**kwargs)

    for module in (consumer_admission, consumers):  # the check in the service's thread, or the frame's own
        monkeypatch.setattr(module, "session_is_current", counted_check)
    await database_sync_to_async(publish_worker)(fake_worker(settings.INFERENCE_DEFAULT_MODEL), ttl_s=300)
    ws = await open_socket(session_cookie)
    settings.ADMISSION_LOAD_CACHE_S = 0.0  # the pass below reads every session again
    await database_sync_to_async(
        load_warmer.warm_once
    )()  # the warmer's pass: this socket's session is current
    settings.ADMISSION_LOAD_CACHE_S = 30.0
    await database_sync_to_async(load.warm)(user_ids=[alice.pk])
    assert load_warmer.session_verified(session_key=client.session.session_key, user_id=alice.pk)
    await send_counting_hops(ws, thread_hops)
    assert (thread_hops["calls"], reads) == (["reply_request"], [])

    await database_sync_to_async(Message.objects.filter(status="queued").update)(status="completed")
    await database_sync_to_async(client.session.flush)()  # ended without any event...
    settings.ADMISSION_LOAD_CACHE_S = 0.0  # ...and the verification is now too old
    await ws.send_json_to(
        {"type": "send", "conversation_id": None, "content": "again", "client_id": str(uuid4())}
    )
    assert await ws.receive_json_from(timeout=10) == {"type": "session_ended", "reason": "expired"}
    assert len(reads) == 1
    stored = await database_sync_to_async(Message.objects.filter(conversation__owner=alice).count)()
    assert stored == 2


async def test_sends_run_on_the_reply_service_threads_and_leave_the_default_pool_to_other_frames(
    session_cookie, alice, redis_clean, settings, monkeypatch
):
    """A send's service runs on ``reply_service_pool``'s threads: a burst of sends filled the event loop's
    default executor, where a refusal's session check then queued (docs/overhead-levers.md, lever 13). While every
    reply-service thread is held by a send, the socket's other frames are still answered."""
    import threading

    from conversations import generations

    settings.REPLY_SERVICE_THREADS = 1
    await database_sync_to_async(publish_worker)(fake_worker(settings.INFERENCE_DEFAULT_MODEL), ttl_s=300)
    original, threads, release = generations.reply_request, [], threading.Event()

    def held_reply_request(**kwargs):
        threads.append(threading.current_thread().name)
        if len(threads) == 1:
            release.wait(10)  # the first send holds the only reply-service thread
        return original(**kwargs)

    monkeypatch.setattr(generations, "reply_request", held_reply_request)
    first, second = await open_socket(session_cookie), await open_socket(session_cookie)
    await first.send_json_to(
        {"type": "send", "conversation_id": None, "content": "one", "client_id": str(uuid4())}
    )
    for _ in range(100):
        if threads:
            break
        await asyncio.sleep(0.05)
    # The other socket's resume of an unknown reply reads the database on the default pool: answered now.
    await second.send_json_to({"type": "resume", "message_id": 10**9, "after_seq": -1})
    assert (await second.receive_json_from(timeout=10))["code"] == "not_found"
    release.set()
    assert (await first.receive_json_from(timeout=10))["type"] == "queued"
    assert threads and all(name.startswith("reply-service") for name in threads), threads
    await first.disconnect()
    await second.disconnect()
