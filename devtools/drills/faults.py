"""The drills. Each is an ``async`` function returning a :class:`DrillResult`; the sync Django work (users,
PostgreSQL checks, cutting the database) runs in threads."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from conversations.models import Message
from devtools.drills.client import Socket, drill_users, wait_settled
from devtools.drills.hostile import hostile_frames
from devtools.drills.processes import DrillWorker
from devtools.drills.replies import (
    SHORT_PROMPT,
    check_final,
    done_for,
    follow_until_done,
    is_answer,
    send_frame,
    start_streaming,
)
from devtools.drills.report import DrillResult
from events import broadcast


async def worker_kill(
    *,
    url: str,
    origin: str,
    workers: list[DrillWorker],
    restart: Callable[[DrillWorker], DrillWorker],
    trials: int,
) -> DrillResult:
    """SIGKILL the worker generating a reply mid-stream, send another message 0.1 s later (while the killed
    process may still be exiting), restart the killed worker. Recovery: seconds from the kill until both
    replies are final. Held when the streaming reply ends ``interrupted`` (with its text) or is regenerated,
    the second reply is served, and nothing is queued/streaming 60 s after the kill."""
    result = DrillResult("worker SIGKILL mid-stream")
    cookies = await sync_to_async(drill_users)(2, max_reply_tokens=32, prefix="drill-kill")
    killed_final: list[float] = []
    interrupted = 0
    for trial in range(trials):
        a, b = await Socket.open(url, origin, cookies[0]), await Socket.open(url, origin, cookies[1])
        try:
            first, streamed = await start_streaming(a)
            holder = (broadcast.redis_client().get(broadcast.lease_key(first)) or b"").decode()
            victim = next((w for w in workers if holder.endswith(f":{w.pid}")), None)
            if victim is None:
                result.notes.append(
                    f"trial {trial + 1}: reply served by a worker this command did not start; skipped"
                )
                await a.until(done_for(first), timeout=300)
                continue
            result.trials += 1
            killed_at = time.monotonic()
            victim.kill()
            await asyncio.sleep(0.1)
            await b.send(send_frame(SHORT_PROMPT))
            answer = await b.until(is_answer, timeout=30)
            second = answer.get("message_id") if answer["type"] == "queued" else None
            restarted = asyncio.create_task(asyncio.to_thread(restart, victim))
            done_a = await a.until(done_for(first), timeout=60)
            killed_final.append(time.monotonic() - killed_at)
            check_final(result, done_a, streamed, "killed reply")
            if done_a["status"] == "interrupted":
                interrupted += 1
            ids = [first] + ([second] if second else [])
            if second:
                try:
                    await b.until(done_for(second), timeout=60)
                except TimeoutError:
                    result.failures.append("the reply sent after the kill had no done frame within 60 s")
            state, _ = await wait_settled(ids, timeout=max(0.0, 60 - (time.monotonic() - killed_at)))
            result.recovery_s.append(time.monotonic() - killed_at)
            result.stuck += state.active
            result.lost += state.missing
            workers[workers.index(victim)] = await restarted
        finally:
            await a.close()
            await b.close()
    if killed_final:
        result.notes.append(
            f"killed reply final (interrupted {interrupted}/{len(killed_final)}, with its text) "
            f"{min(killed_final):.1f}-{max(killed_final):.1f} s after the kill"
        )
    return result


def _admin_connection():
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"] or "postgres",
        password=db["PASSWORD"] or None, dbname="postgres", autocommit=True,
    )  # fmt: skip


def database_cut(name: str) -> None:
    """Refuse new connections to database ``name`` and end its sessions: PostgreSQL is "down" for this
    database only (the machine's other databases, and the server, stay up)."""
    with _admin_connection() as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )


def database_restore(name: str) -> None:
    with _admin_connection() as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


async def db_outage(*, url: str, origin: str, outage_s: float = 10.0, trials: int = 1) -> DrillResult:
    """PostgreSQL refuses connections for ``outage_s`` seconds while a reply streams. Sends during the
    outage must get ``unavailable`` (nothing stored); the streaming reply must end completed (final write
    retried) or interrupted with its text. Recovery: seconds from the database's return until a send is
    ``queued`` again."""
    result = DrillResult(f"PostgreSQL unavailable {outage_s:.0f} s")
    name = settings.DATABASES["default"]["NAME"]
    cookies = await sync_to_async(drill_users)(2, max_reply_tokens=48, prefix="drill-db")
    for _ in range(trials):
        result.trials += 1
        a, b = await Socket.open(url, origin, cookies[0]), await Socket.open(url, origin, cookies[1])
        try:
            first, streamed = await start_streaming(a)
            stored_before = await user_messages(cookies[1])
            await asyncio.to_thread(database_cut, name)
            try:
                cut_at, answers = time.monotonic(), []
                while time.monotonic() - cut_at < outage_s:
                    await b.send(send_frame(SHORT_PROMPT))
                    answers.append(await b.until(is_answer, timeout=30))
                    await asyncio.sleep(1.0)
            finally:
                await asyncio.to_thread(database_restore, name)
            restored_at = time.monotonic()
            codes = sorted({f.get("code") or f["type"] for f in answers})
            if codes != ["unavailable"]:
                result.failures.append(f"sends during the outage were answered {codes}")
            result.notes.append(f"{len(answers)} sends during the outage, answered {codes}")
            replies = [first]
            while True:
                await b.send(send_frame(SHORT_PROMPT))
                answer = await b.until(is_answer, timeout=30)
                if answer["type"] == "queued":
                    result.recovery_s.append(time.monotonic() - restored_at)
                    replies.append(answer["message_id"])
                    break
                if time.monotonic() - restored_at > 60:
                    result.failures.append("sends still refused 60 s after the database returned")
                    break
                await asyncio.sleep(0.5)
            done_a = await a.until(done_for(first), timeout=180)
            check_final(result, done_a, streamed, "reply in flight")
            state, _ = await wait_settled(replies, timeout=120)
            result.stuck += state.active
            result.lost += state.missing
            stored = await user_messages(cookies[1]) - stored_before
            if stored != len(replies) - 1:
                result.failures.append(f"{stored} user messages stored for {len(replies) - 1} accepted sends")
        finally:
            await a.close()
            await b.close()
    return result


def _user_messages(cookie: str) -> int:
    """How many user messages the cookie's user has stored."""
    from django.contrib.sessions.backends.db import SessionStore

    close_old_connections()
    user_id = SessionStore(cookie.split("=", 1)[1]).get("_auth_user_id")
    return Message.objects.filter(conversation__owner_id=user_id, role=Message.Role.USER).count()


user_messages = sync_to_async(_user_messages, thread_sensitive=False)


async def overload(
    *,
    url: str,
    origin: str,
    sends: int = 200,
    clients: int = 50,
    max_reply_tokens: int = 16,
    timeout: float = 900,
) -> DrillResult:
    """A burst of ``sends`` messages from ``clients`` sockets at once (about 10x what one worker's engine
    runs at a time). Every send must be answered ``queued`` or with an error frame, and every stored
    reply must reach a final state. Recovery: seconds from the burst until the last reply is final."""
    result = DrillResult(f"overload: burst of {sends} sends")
    per_client = max(1, sends // clients)
    cookies = await sync_to_async(drill_users)(
        clients, max_reply_tokens=max_reply_tokens, concurrent=per_client, prefix="drill-load"
    )
    sockets = await asyncio.gather(*(Socket.open(url, origin, c) for c in cookies))
    result.trials = per_client * clients
    burst_at = time.monotonic()
    try:
        for s in sockets:
            for n in range(per_client):
                await s.send(send_frame(f"{SHORT_PROMPT} (#{n})"))

        async def answers(s: Socket) -> list[dict]:
            got = []
            while len(got) < per_client:
                frame = await s.recv(timeout=120)
                if is_answer(frame):
                    got.append(frame)
            return got

        all_answers = [f for got in await asyncio.gather(*(answers(s) for s in sockets)) for f in got]
        queued = [f["message_id"] for f in all_answers if f["type"] == "queued"]
        errors: dict[str, int] = {}
        for f in all_answers:
            if f["type"] == "error":
                errors[f["code"]] = errors.get(f["code"], 0) + 1
        result.notes.append(
            f"{len(queued)} queued, errors {errors or 'none'}; unanswered {result.trials - len(all_answers)}"
        )
        result.lost += result.trials - len(all_answers)
        state, _ = await wait_settled(queued, timeout=timeout, poll_s=1.0)
        result.recovery_s.append(time.monotonic() - burst_at)
        result.stuck += state.active
        result.lost += state.missing
    finally:
        await asyncio.gather(*(s.close() for s in sockets))
    return result


async def bad_input(*, url: str, origin: str, trials: int = 1) -> DrillResult:
    """Every hostile frame class, with another user's ids, then 100 frames in one second: each must get
    its documented answer (one per frame), the socket must stay open, and nothing stored may change."""
    result = DrillResult("bad input")
    own_cookie, other_cookie = await sync_to_async(drill_users)(2, max_reply_tokens=4, prefix="drill-bad")
    other = await Socket.open(url, origin, other_cookie)
    await other.send(send_frame(SHORT_PROMPT))
    foreign = await other.until(is_answer, timeout=30)
    await other.close()
    me = await Socket.open(url, origin, own_cookie)
    await me.send(send_frame(SHORT_PROMPT))
    mine = await me.until(is_answer, timeout=30)
    await me.until(done_for(mine["message_id"]), timeout=300)
    await wait_settled([foreign["message_id"]], timeout=300)
    before = await sync_to_async(_snapshot, thread_sensitive=False)()
    for _ in range(trials):
        for label, text, code in hostile_frames(
            own_reply=mine["message_id"],
            foreign_conversation=foreign["conversation_id"],
            foreign_reply=foreign["message_id"],
            foreign_user_message=foreign["user_message_id"],
        ):
            result.trials += 1
            await me.send(text)
            try:
                answer = await me.recv(timeout=10)
            except TimeoutError:
                result.failures.append(f"{label}: no answer")
                continue
            if answer.get("code") != code:
                result.failures.append(
                    f"{label}: answered {answer.get('code') or answer['type']}, not {code}"
                )
            await asyncio.sleep(1 / settings.WS_FRAMES_PER_S)
    flood = {"type": "resume", "message_id": mine["message_id"]}
    for _ in range(100):
        await me.send(flood)
        await asyncio.sleep(0.01)
    kinds = [(await me.recv(timeout=10))["type"] for _ in range(100)]
    result.trials += 100
    result.notes.append(
        f"100 frames in ~1 s: {kinds.count('done')} answered, {kinds.count('error')} rate_limited"
    )
    for label, payload, code in (
        ("2 MiB frame", ("x" * (2 * 1024 * 1024)).encode(), 1009),
        ("text frame that is not UTF-8", b'{"type": "send", "content": "\xff\xfe"}', 1007),
    ):
        result.trials += 1
        closed = await close_code_after(url, origin, own_cookie, payload)
        if closed != code:
            result.failures.append(f"{label}: closed with {closed}, not {code}")
    if await sync_to_async(_snapshot, thread_sensitive=False)() != before:
        result.failures.append("stored conversations or messages changed")
    await me.close()
    return result


async def close_code_after(url: str, origin: str, cookie: str, payload: bytes) -> int | None:
    """Send ``payload`` as one raw *text* frame on a new socket; the close code the server answers with."""
    import websockets

    socket = await Socket.open(url, origin, cookie)
    try:
        await socket.ws.send(payload, text=True)
        while True:
            await asyncio.wait_for(socket.ws.recv(), 10)
    except websockets.ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None
    except TimeoutError:
        return None
    finally:
        await socket.close()


def _snapshot():
    from conversations.models import Conversation

    close_old_connections()
    return (
        Conversation.objects.count(),
        list(Message.objects.order_by("id").values_list("id", "status", "content")),
    )


async def redis_restart(
    *, url: str, origin: str, command: str | Callable[[], None], trials: int = 1
) -> DrillResult:
    """Run ``command`` (a shell command or a callable that restarts the stack's Redis, losing its data) while a reply streams to an
    open socket. Recovery: seconds from the restart until a new send is ``queued``. The socket must either
    keep following the reply or be closed so that a reconnect and ``resume`` (what the page does) brings
    it to the reply's ``done``; the reply must reach a final state with at least its streamed text."""
    result = DrillResult("Redis restart mid-stream")
    cookies = await sync_to_async(drill_users)(2, max_reply_tokens=48, prefix="drill-redis")
    for _ in range(trials):
        result.trials += 1
        a = await Socket.open(url, origin, cookies[0])
        first, streamed = await start_streaming(a)
        restarted_at = time.monotonic()
        if callable(command):
            await asyncio.to_thread(command)
        else:
            await asyncio.to_thread(subprocess.run, command, shell=True, check=True)
        follower = asyncio.create_task(
            follow_until_done(a, url=url, origin=origin, cookie=cookies[0], message_id=first, timeout=300)
        )
        replies = [first]
        while time.monotonic() - restarted_at < 60:
            try:
                b = await Socket.open(url, origin, cookies[1])
                await b.send(send_frame(SHORT_PROMPT))
                answer = await b.until(is_answer, timeout=10)
                await b.close()
                if answer["type"] == "queued":
                    result.recovery_s.append(time.monotonic() - restarted_at)
                    replies.append(answer["message_id"])
                    break
            except Exception:  # noqa: BLE001 - refused or dropped while Redis comes back
                pass
            await asyncio.sleep(0.5)
        else:
            result.failures.append("no send accepted within 60 s of the restart")
        done, reconnects = await follower
        result.notes.append(f"the open socket reconnected {reconnects} time(s)")
        if done is None:
            result.failures.append("the socket following the reply never got its done frame")
        else:
            check_final(result, done, streamed, "reply in flight")
        state, _ = await wait_settled(replies, timeout=120)
        result.stuck += state.active
        result.lost += state.missing
    return result
