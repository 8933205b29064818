"""What a failed live browser test shows about itself: the page's WebSocket frames, its connection and
banner state, the stored replies, the Redis keys that matter and the tails of the server processes' logs."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conversations.models import Message


class FrameLog:
    """Records every WebSocket frame a Playwright page sends and receives (and each socket's open and
    close), stamped with seconds since the log started. ``FrameLog(page)`` before ``page.goto``.

    The sync Playwright API delivers events only while the test is inside a Playwright call, so frames
    that arrived while the test did something else (e.g. restarted a server) share one later stamp; their
    order is exact."""

    def __init__(self, page, *, limit: int = 400):
        self.started = time.monotonic()
        self.entries: list[str] = []
        self.limit = limit
        page.on("websocket", self._socket)

    def _note(self, text: str) -> None:
        self.entries.append(f"{time.monotonic() - self.started:7.2f}s {text}")

    def _socket(self, ws) -> None:
        self._note(f"open {ws.url}")
        ws.on("framesent", lambda payload: self._note(f"-> {payload}"))
        ws.on("framereceived", lambda payload: self._note(f"<- {_short_frame(payload)}"))
        ws.on("close", lambda _ws: self._note("close"))

    def text(self) -> str:
        """The recorded lines, the last ``limit`` of them (token frames shortened)."""
        kept = self.entries[-self.limit :]
        skipped = len(self.entries) - len(kept)
        return (f"... {skipped} earlier frames\n" if skipped else "") + "\n".join(kept)


def _short_frame(payload) -> str:
    try:
        frame = json.loads(payload)
    except (TypeError, ValueError):
        return str(payload)[:200]
    if frame.get("type") == "done":
        frame["content"] = (frame.get("content") or "")[:40] + "…"
    return json.dumps(frame)[:300]


PAGE_STATE = """() => ({
  connection: document.querySelector('#connection-status')?.dataset.state,
  states: window.connectionStates || null,
  banner: document.querySelector('#chat-banner')?.hidden ? '' : document.querySelector('#chat-banner .banner-text')?.textContent,
  queue: document.querySelector('#queue-status')?.hidden ? '' : document.querySelector('#queue-status')?.textContent.trim(),
  sendDisabled: document.querySelector('#send-button')?.disabled,
  bubbles: [...document.querySelectorAll('.message')].map((m) => ({
    role: m.classList.contains('user') ? 'user' : 'assistant', id: m.dataset.messageId, status: m.dataset.status,
    hidden: m.hidden, text: (m.querySelector('.content')?.textContent || '').trim().slice(0, 40),
  })),
})"""


def tail(path: Path, chars: int = 4000) -> str:
    """The last ``chars`` characters of the file at ``path`` ("" when it does not exist)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def redis_keys(redis_url: str) -> str:
    """The chatsite keys of the Redis at ``redis_url`` with their TTLs (fleet status, leases, streams)."""
    import redis

    try:
        client = redis.Redis.from_url(redis_url, socket_timeout=2)
        keys = sorted(k.decode() for k in client.scan_iter(match="chatsite:*", count=1000))
        return "\n".join(f"{k} ttl={client.ttl(k)}" for k in keys[:50]) or "(none)"
    except Exception as exc:  # the diagnostic must never hide the failure it explains
        return f"(unreadable: {exc!r})"


def failure_report(*, page, frames: FrameLog, logs: dict[str, Path], redis_url: str) -> str:
    """One text explaining a failed live test: page state, frames, replies stored, Redis keys, log tails."""
    try:
        state = json.dumps(page.evaluate(PAGE_STATE), indent=1)
    except Exception as exc:
        state = f"(page unreadable: {exc!r})"
    rows = "\n".join(
        f"{m.pk} {m.role} {m.status} model={m.model_name} finish={m.finish_reason} "
        f"error={m.error!r} created={m.created_at:%H:%M:%S.%f} chars={len(m.content)}"
        for m in Message.objects.order_by("pk")
    )
    parts = [
        ("page", state),
        ("frames", frames.text()),
        ("messages", rows or "(none)"),
        ("redis", redis_keys(redis_url)),
    ]
    parts += [(f"log {name}", tail(path)) for name, path in logs.items()]
    return "\n".join(f"===== {title} =====\n{body}" for title, body in parts)
