"""The multi-host bed's chat and HTTP clients, through its load balancer (TLS with the bed's self-signed
certificate): a chat socket (:func:`open_socket`), a reply's stored state (:func:`stored_reply`), and the
rolling-restart drill's load (:class:`LoadClient` chat users, :func:`http_load` requests). Used by
``devtools/drills/cluster.py``."""

from __future__ import annotations

import asyncio
import ssl
import time

from asgiref.sync import sync_to_async

from conversations.models import Message
from devtools.bed.topology import LB
from devtools.drills.client import Socket
from devtools.drills.replies import SHORT_PROMPT, is_answer, send_frame

URL = f"wss://{LB.addr}/ws/chat/"
ORIGIN = f"https://{LB.addr}"


async def open_socket(cookie: str) -> Socket:
    """A chat socket through the load balancer (TLS with the bed's self-signed certificate)."""
    import websockets

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ws = await websockets.connect(
        URL, ssl=ctx, additional_headers={"Cookie": cookie}, origin=ORIGIN, max_size=None, open_timeout=30
    )
    return Socket(ws)


async def stored_reply(message_id: int) -> tuple[str, str]:
    """``(status, content)`` of a stored reply."""
    msg = await sync_to_async(Message.objects.get)(pk=message_id)
    return msg.status, msg.content or ""


class LoadClient:
    """One chat user of the rolling-deploy load: sends a short message, reads its reply to ``done``; when
    the socket drops it reconnects through the load balancer and resumes after the last seq it took (as
    the page does). A reply is *broken* when it never reaches ``done`` or the tokens taken differ from the
    stored text."""

    def __init__(self, cookie: str):
        self.cookie = cookie
        self.completed = self.broken = self.reconnects = 0
        self.ids: list[int] = []

    async def run(self, stop: asyncio.Event) -> None:
        socket = await open_socket(self.cookie)
        try:
            while not stop.is_set():
                socket = await self.one_reply(socket)
        finally:
            await socket.close()

    async def one_reply(self, socket: Socket) -> Socket:
        import websockets

        frame = send_frame(SHORT_PROMPT)
        while True:  # a send cut by a restart is sent again with its client_id: stored once (idempotent)
            try:
                await socket.send(frame)
                answer = await socket.until(is_answer, timeout=60)
                break
            except (websockets.ConnectionClosed, OSError):
                socket = await self.reconnect()
        if answer["type"] != "queued":
            await asyncio.sleep(float(answer.get("retry_after") or 1))
            return socket
        mid, last, text = answer["message_id"], -1, []
        self.ids.append(mid)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                frame = await socket.recv(timeout=max(0.1, deadline - time.monotonic()))
            except (websockets.ConnectionClosed, OSError):
                socket = await self.reconnect()
                try:
                    await socket.send({"type": "resume", "message_id": mid, "after_seq": last})
                except (websockets.ConnectionClosed, OSError):
                    pass
                continue
            except TimeoutError:
                break
            if frame.get("message_id") != mid:
                continue
            if frame["type"] == "token" and frame["seq"] == last + 1:
                text.append(frame["text"])
                last = frame["seq"]
            elif frame["type"] == "done":
                # The page shows the tokens it took, then the done frame's final text: intact when what it
                # took is the start of that text and that text is what is stored.
                stored = (await stored_reply(mid))[1]
                content = frame.get("content") or ""
                if frame["status"] == "completed" and content == stored and stored.startswith("".join(text)):
                    self.completed += 1
                else:
                    self.broken += 1
                return socket
        self.broken += 1
        return socket

    async def reconnect(self) -> Socket:
        self.reconnects += 1
        for _ in range(60):
            try:
                return await open_socket(self.cookie)
            except Exception:  # the LB answers 503 for a moment while both checks settle: try again
                await asyncio.sleep(0.5)
        raise RuntimeError("could not reconnect through the load balancer for 30 s")


async def http_load(stop: asyncio.Event, counts: dict[str, int]) -> None:
    """GET /healthz and the login page through the load balancer, back to back; counts ok and failed."""
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    async with httpx.AsyncClient(base_url=ORIGIN, verify=False, timeout=15) as http:
        while not stop.is_set():
            for path in ("/healthz", "/accounts/login/"):
                try:
                    response = await http.get(path)
                    ok = response.status_code < 400
                except httpx.HTTPError:
                    ok = False
                counts["ok" if ok else "failed"] += 1
            await asyncio.sleep(0.05)
