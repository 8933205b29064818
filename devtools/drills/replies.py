"""A drill's replies as a client sees them: the prompts, the ``send`` frame, waiting for its answer, a reply
streaming, its ``done`` (followed across dropped sockets and lost frames as the page follows it), and the
check that a reply hit by a fault kept what it had streamed. Shared by the fault drills (``faults``) and the
multi-host bed's drills (``cluster``, ``cluster_browser``)."""

from __future__ import annotations

import asyncio
import time
import uuid

from devtools.drills.client import Socket
from devtools.drills.report import DrillResult

LONG_PROMPT = (
    "Write a very long, detailed story about a dragon who learns to bake bread. Use many paragraphs."
)
SHORT_PROMPT = "Say hello in one short sentence."


def send_frame(content: str, conversation_id: int | None = None) -> dict:
    """A ``send`` of ``content`` (a new conversation when ``conversation_id`` is None) with a fresh
    ``client_id``."""
    return {
        "type": "send",
        "conversation_id": conversation_id,
        "content": content,
        "client_id": str(uuid.uuid4()),
    }


def is_answer(frame: dict) -> bool:
    """The answer to a ``send``: ``queued`` (with the stored user message) or an ``error``."""
    return frame["type"] == "error" or (frame["type"] == "queued" and frame.get("user_message_id"))


def done_for(message_id: int):
    """A frame predicate: the ``done`` of reply ``message_id``."""
    return lambda f: f["type"] == "done" and f["message_id"] == message_id


async def start_streaming(socket: Socket, prompt: str = LONG_PROMPT, *, min_seq: int = 2) -> tuple[int, str]:
    """Send ``prompt`` and wait until ``min_seq`` tokens streamed; (reply id, text so far)."""
    await socket.send(send_frame(prompt))
    answer = await socket.until(is_answer, timeout=60)
    if answer["type"] != "queued":
        raise RuntimeError(f"send refused: {answer}")
    message_id = answer["message_id"]
    await socket.until(
        lambda f: f["type"] == "token" and f["message_id"] == message_id and f["seq"] >= min_seq, 240
    )
    text = "".join(f["text"] for f in socket.frames if f["type"] == "token" and f["message_id"] == message_id)
    return message_id, text


def check_final(result: DrillResult, done: dict, streamed: str, label: str) -> None:
    """A reply that ended ``interrupted`` or ``completed`` keeps at least the text streamed before the fault."""
    if done["status"] not in ("completed", "interrupted"):
        result.failures.append(f"{label}: ended {done['status']}")
    elif not (done["content"] or "").startswith(streamed):
        result.failures.append(f"{label}: stored text lost what was streamed")


#: Seconds of silence on an open socket after which a follower asks for the rest of its reply (the page's
#: ``STALL_MS`` in static/chat/chat.js).
STALL_S = 8.0


async def follow_until_done(
    socket: Socket, *, url: str, origin: str, cookie: str, message_id: int, timeout: float
):
    """Follow a reply as the page does: on a dropped socket, reconnect (retrying) and ``resume`` from the last
    ``seq`` seen; on an open socket silent for ``STALL_S`` (frames lost while the channel layer's Redis
    restarted), ``resume`` on it. Returns (its ``done`` frame or None, reconnects made)."""
    import websockets

    deadline = time.monotonic() + timeout
    last_seq, reconnects = -1, 0
    while time.monotonic() < deadline:
        try:
            try:
                frame = await socket.recv(timeout=max(0.05, min(STALL_S, deadline - time.monotonic())))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
                await socket.send({"type": "resume", "message_id": message_id, "after_seq": last_seq})
                continue
            if frame["type"] == "token" and frame["message_id"] == message_id:
                last_seq = max(last_seq, frame["seq"])
            if frame["type"] == "done" and frame["message_id"] == message_id:
                return frame, reconnects
        except websockets.ConnectionClosed:
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                try:
                    socket = await Socket.open(url, origin, cookie)
                    await socket.send({"type": "resume", "message_id": message_id, "after_seq": last_seq})
                    reconnects += 1
                    break
                except (OSError, websockets.InvalidHandshake, websockets.ConnectionClosed, TimeoutError):
                    continue
        except TimeoutError:
            break
    return None, reconnects
