"""Drill clients: users of a dedicated ``drills`` tier with ready session cookies, a small WebSocket client,
and the PostgreSQL reads that tell whether every reply reached a final state."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import DatabaseError, close_old_connections

from accounts.sessions import session_cookie_for
from billing.models import Tier
from conversations.models import Message

DRILL_TIER = "drills"


def drill_users(
    count: int, *, max_reply_tokens: int, concurrent: int = 4, prefix: str = "drill"
) -> list[str]:
    """``count`` users of the ``drills`` tier (created or reused; limits high enough that only admission
    control's queue bound refuses), each with a fresh session; returns their ``Cookie`` header values."""
    close_old_connections()  # a database drill may have ended this thread's connection
    base = Tier.objects.get(name="paid")
    fields = {f.name for f in Tier._meta.concrete_fields} - {"id", "name"}
    defaults = {name: getattr(base, name) for name in fields}
    defaults.update(
        display_name="Drills",
        requests_per_minute=100_000,
        tokens_per_day=1_000_000_000,
        max_reply_tokens=max_reply_tokens,
        max_concurrent_generations=concurrent,
    )
    tier, _ = Tier.objects.update_or_create(name=DRILL_TIER, defaults=defaults)
    cookies = []
    for i in range(count):
        user, _ = get_user_model().objects.get_or_create(username=f"{prefix}-{i}", defaults={"tier": tier})
        if user.tier_id != tier.id or not user.is_active:
            user.tier, user.is_active = tier, True
            user.save(update_fields=["tier", "is_active"])
        cookies.append(session_cookie_for(user))
    return cookies


class Socket:
    """One WebSocket chat client (``websockets``) with a frame inbox per message id."""

    def __init__(self, ws):
        self.ws = ws
        self.frames: list[dict] = []

    @classmethod
    async def open(cls, url: str, origin: str, cookie: str) -> Socket:
        import websockets

        ws = await websockets.connect(
            url, additional_headers={"Cookie": cookie}, origin=origin, max_size=None, open_timeout=30
        )
        return cls(ws)

    async def send(self, frame: dict | str) -> None:
        await self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self, timeout: float = 30.0) -> dict:
        frame = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.frames.append(frame)
        return frame

    async def until(self, predicate, timeout: float = 120.0) -> dict:
        """Frames until one matches ``predicate``; returns it (TimeoutError after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while True:
            frame = await self.recv(max(0.05, deadline - time.monotonic()))
            if predicate(frame):
                return frame

    async def close(self) -> None:
        await self.ws.close()


@dataclass
class Settled:
    """Where a set of replies stands in PostgreSQL."""

    final: int
    active: int
    missing: int


def _settled(message_ids: list[int]) -> Settled:
    close_old_connections()
    statuses = dict(Message.objects.filter(pk__in=message_ids).values_list("id", "status"))
    active = sum(1 for s in statuses.values() if s in Message.ACTIVE_STATUSES)
    return Settled(final=len(statuses) - active, active=active, missing=len(set(message_ids) - set(statuses)))


settled = sync_to_async(_settled, thread_sensitive=False)


async def wait_settled(
    message_ids: list[int], *, timeout: float, poll_s: float = 0.5
) -> tuple[Settled, float]:
    """Poll until none of ``message_ids`` is queued/streaming or ``timeout`` passes; (state, seconds)."""
    started = time.monotonic()
    while True:
        try:
            state = await settled(message_ids)
        except DatabaseError:  # PostgreSQL briefly unreachable (or out of connections): poll again
            if time.monotonic() - started > timeout:
                raise
            await asyncio.sleep(poll_s)
            continue
        if state.active == 0 or time.monotonic() - started > timeout:
            return state, time.monotonic() - started
        await asyncio.sleep(poll_s)
