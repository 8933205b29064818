"""A reply that a worker claims before the socket joins its group: the consumer catches the socket up.

``watch_ticket`` joins the reply's channel-layer group only after the reply-creating service returned, and
the task is dispatched when that service's transaction commits, so a fast worker may publish ``started``
and the first tokens before the socket listens. The socket must still see ``queued``, ``started``, every
token once in ``seq`` order and ``done``, whatever part of that was published before it joined. Here a
"fast worker" does what ``conversations/reply_runner.py`` does (claim, publish ``started`` and tokens) at the
moment that exposes each case: inside the service call, or right after the join.
"""

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from conversations import generation_worker, generations, reaper
from conversations.consumers import ChatConsumer
from conversations.models import Message
from events import broadcast
from tests.sockets import open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session_cookie(alice, client):
    client.force_login(alice)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def worker_streams(message_id: int, texts: list[str], *, first_seq: int = 0) -> None:
    """What a worker does once it has the task: claim the reply (the first time), publish ``started``, then
    one token per text."""
    if first_seq == 0:
        assert generation_worker.generation_start(message_id=message_id) is not None
        broadcast.publish(message_id, broadcast.frame_started(message_id=message_id))
    for seq, text in enumerate(texts, start=first_seq):
        broadcast.publish(message_id, broadcast.frame_token(message_id=message_id, seq=seq, text=text))


def worker_finishes(message_id: int, text: str) -> Message:
    return generation_worker.generation_finish(
        message=Message.objects.get(pk=message_id),
        status=Message.Status.COMPLETED,
        text=text,
        finish_reason="stop",
        prompt_tokens=3,
        completion_tokens=3,
    )


def finished_reply(user, *, finish_reason: str = "stop") -> Message:
    """A conversation whose reply has finished: the starting point of regenerate, edit and continue."""
    ticket = generations.reply_request(user=user, conversation_id=None, content="Question")
    generation_worker.generation_start(message_id=ticket.message.id)
    return generation_worker.generation_finish(
        message=ticket.message, status="completed", text="Once upon", finish_reason=finish_reason
    )


async def receive_all(ws, n: int) -> list[dict]:
    return [await ws.receive_json_from(timeout=5) for _ in range(n)]


def shape(frames: list[dict]) -> list[tuple]:
    return [(f["type"], f.get("seq"), f.get("text")) for f in frames]


def frame_for(kind: str, reply: Message | None) -> dict:
    if kind == "send":
        return {"type": "send", "conversation_id": None, "content": "Hi"}
    if kind == "regenerate":
        return {"type": "regenerate", "conversation_id": reply.conversation_id}
    if kind == "edit":
        return {"type": "edit", "message_id": reply.parent_id, "content": "Better question"}
    return {"type": "continue", "message_id": reply.id}


SERVICES = {
    "send": "reply_request",
    "regenerate": "reply_regenerate",
    "edit": "reply_edit",
    "continue": "reply_continue",
}


@pytest.mark.parametrize("kind", list(SERVICES))
async def test_reply_started_before_the_socket_joined_is_caught_up(
    kind, session_cookie, alice, monkeypatch, redis_clean
):
    """The worker claims the reply and streams two tokens before the service even returns (so before the
    socket joins the group); the page still gets queued, started, every token once, in order, and done."""
    reply = None
    if kind != "send":
        reply = await database_sync_to_async(finished_reply)(
            alice, finish_reason="length" if kind == "continue" else "stop"
        )
    service = getattr(generations, SERVICES[kind])

    def service_with_a_fast_worker(**kwargs):
        ticket = service(**kwargs)  # committed: the task is in the broker
        worker_streams(ticket.message.id, ["Hel", "lo"])
        return ticket

    monkeypatch.setattr(generations, SERVICES[kind], service_with_a_fast_worker)
    ws = await open_socket(session_cookie)
    await ws.send_json_to(frame_for(kind, reply))
    queued = await ws.receive_json_from(timeout=5)
    assert queued["type"] == "queued"
    message_id = queued["message_id"]
    caught_up = await receive_all(ws, 3)
    assert shape(caught_up) == [("started", None, None), ("token", 0, "Hel"), ("token", 1, "lo")]
    assert all(f["message_id"] == message_id for f in caught_up)
    # Then live, as usual.
    await database_sync_to_async(worker_streams)(message_id, ["!"], first_seq=2)
    await database_sync_to_async(worker_finishes)(message_id, "Hello!")
    token, done = await receive_all(ws, 2)
    assert (token["seq"], token["text"]) == (2, "!")
    assert (done["type"], done["status"], done["content"]) == ("done", "completed", "Hello!")
    assert await ws.receive_nothing(timeout=0.3)
    assert (await database_sync_to_async(Message.objects.get)(pk=message_id)).content == "Hello!"
    await ws.disconnect()


@pytest.fixture
def worker_right_after_join(monkeypatch):
    """``worker_right_after_join(step)``: run ``step(message_id)`` (sync, in a thread) as soon as the socket
    joined a reply's group, before the consumer reads the reply back: every frame it publishes reaches the
    socket live *and* is covered by the catch-up."""

    def install(step):
        join = ChatConsumer.watch

        async def watch(self, message_id: int):
            await join(self, message_id)
            await database_sync_to_async(step)(message_id)

        monkeypatch.setattr(ChatConsumer, "watch", watch)

    return install


async def test_live_frames_the_catch_up_covered_are_not_sent_twice(
    session_cookie, worker_right_after_join, redis_clean
):
    worker_right_after_join(lambda message_id: worker_streams(message_id, ["a", "b", "c"]))
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    queued = await ws.receive_json_from(timeout=5)
    assert queued["type"] == "queued"
    message_id = queued["message_id"]
    frames = await receive_all(ws, 4)
    assert shape(frames) == [("started", None, None), ("token", 0, "a"), ("token", 1, "b"), ("token", 2, "c")]
    # The live started and tokens 0-2 are still queued for this socket: they must be dropped, so the next
    # frames are the new token and the done.
    await database_sync_to_async(worker_streams)(message_id, ["d"], first_seq=3)
    await database_sync_to_async(worker_finishes)(message_id, "abcd")
    token, done = await receive_all(ws, 2)
    assert (token["type"], token["seq"]) == ("token", 3)
    assert (done["type"], done["content"]) == ("done", "abcd")
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_a_resume_mid_stream_sends_each_token_once(
    session_cookie, alice, worker_right_after_join, redis_clean
):
    """A page whose web node died reconnects to another node and resumes after the last seq it took; tokens
    the worker publishes between the join and the replay's read reach the new socket in the replay, and
    their live copies are dropped (the page would ignore them, but a thousand sockets resuming at once
    would each get them twice)."""
    ticket = await database_sync_to_async(generations.reply_request)(
        user=alice, conversation_id=None, content="Hi"
    )
    message_id = ticket.message.id
    # The page took seq 0 on the dead node.
    await database_sync_to_async(worker_streams)(message_id, ["a", "b"])
    worker_right_after_join(lambda mid: worker_streams(mid, ["c", "d"], first_seq=2))
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "resume", "message_id": message_id, "after_seq": 0})
    frames = await receive_all(ws, 4)
    assert shape(frames) == [("started", None, None), ("token", 1, "b"), ("token", 2, "c"), ("token", 3, "d")]
    await database_sync_to_async(worker_streams)(message_id, ["e"], first_seq=4)
    await database_sync_to_async(worker_finishes)(message_id, "abcde")
    token, done = await receive_all(ws, 2)
    assert (token["type"], token["seq"]) == ("token", 4)
    assert (done["type"], done["content"]) == ("done", "abcde")
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_a_reply_finished_before_the_catch_up_ends_with_one_done(
    session_cookie, worker_right_after_join, redis_clean
):
    def stream_and_finish(message_id):
        worker_streams(message_id, ["a", "b"])
        worker_finishes(message_id, "ab")

    worker_right_after_join(stream_and_finish)
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    assert (await ws.receive_json_from(timeout=5))["type"] == "queued"
    done = await ws.receive_json_from(timeout=5)
    assert (done["type"], done["status"], done["content"]) == ("done", "completed", "ab")
    # The live started, tokens and done it covered are dropped: no token after the done, no second done.
    assert await ws.receive_nothing(timeout=0.5)
    await ws.disconnect()


async def test_a_later_done_than_the_caught_up_one_still_arrives(
    session_cookie, worker_right_after_join, redis_clean
):
    """The reaper marked the reply interrupted (its worker looked dead) before the catch-up read it; the
    worker was alive after all and its finish writes the final state: that done is new and goes out."""

    def stream_then_reaped(message_id):
        worker_streams(message_id, ["par"])
        Message.objects.filter(pk=message_id).update(updated_at=timezone.now() - timedelta(minutes=1))
        assert reaper.generations_reap_interrupted(message_ids=[message_id], is_alive=lambda _id: False)

    worker_right_after_join(stream_then_reaped)
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    message_id = (await ws.receive_json_from(timeout=5))["message_id"]
    interrupted = await ws.receive_json_from(timeout=5)
    assert (interrupted["type"], interrupted["status"], interrupted["content"]) == (
        "done",
        "interrupted",
        "par",
    )
    await database_sync_to_async(worker_finishes)(message_id, "partial")
    final = await ws.receive_json_from(timeout=5)
    assert (final["type"], final["status"], final["content"]) == ("done", "completed", "partial")
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_a_reply_redispatched_after_a_worker_died_streams_live_in_full(session_cookie, redis_clean):
    """A worker that took the task and died before claiming the reply: the reply stays queued, the reaper
    dispatches it again, and the next worker's claim streams from seq 0 with one started, all live."""
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    message_id = (await ws.receive_json_from(timeout=5))["message_id"]
    await database_sync_to_async(
        lambda: Message.objects.filter(pk=message_id).update(
            created_at=timezone.now() - timedelta(minutes=2), updated_at=timezone.now() - timedelta(minutes=1)
        )
    )()
    assert await database_sync_to_async(reaper.generations_redispatch_queued)(after_s=30) == [message_id]
    await database_sync_to_async(worker_streams)(message_id, ["x", "y"])
    await database_sync_to_async(worker_finishes)(message_id, "xy")
    frames = await receive_all(ws, 4)
    assert shape(frames)[:3] == [("started", None, None), ("token", 0, "x"), ("token", 1, "y")]
    assert (frames[3]["type"], frames[3]["content"]) == ("done", "xy")
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_a_resend_whose_reply_finished_meanwhile_gets_its_done(
    session_cookie, alice, monkeypatch, redis_clean
):
    """A resend finds the stored ticket while its reply streams; the reply finishes before the socket joins:
    the page gets queued and the done (not a started that nothing would ever end)."""
    ticket = await database_sync_to_async(generations.reply_request)(
        user=alice, conversation_id=None, content="Hi", client_id="7c9e6679-7425-40de-944b-e07fc1f90ae7"
    )
    message_id = ticket.message.id
    await database_sync_to_async(worker_streams)(message_id, ["a"])
    join = ChatConsumer.watch

    async def finish_then_watch(self, message_id):
        await database_sync_to_async(worker_finishes)(message_id, "a")
        await join(self, message_id)

    monkeypatch.setattr(ChatConsumer, "watch", finish_then_watch)
    ws = await open_socket(session_cookie)
    await ws.send_json_to(
        {
            "type": "send",
            "conversation_id": None,
            "content": "Hi",
            "client_id": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            "resend": True,
        }
    )
    queued = await ws.receive_json_from(timeout=5)
    assert (queued["type"], queued["message_id"]) == ("queued", message_id)
    done = await ws.receive_json_from(timeout=5)
    assert (done["type"], done["status"], done["content"]) == ("done", "completed", "a")
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()
