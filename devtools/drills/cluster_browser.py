"""The browser drill of the multi-host bed: a web node SIGKILLed under a chat page that is streaming a reply
through the load balancer (Playwright driving Debian's Chromium, on the bed's client host)."""

from __future__ import annotations

import os
import shutil
import signal
import time

from conversations.models import Message
from devtools.bed import services
from devtools.bed.topology import LB, WEB
from devtools.drills.client import drill_users
from devtools.drills.faults import LONG_PROMPT
from devtools.drills.report import DrillResult

STREAMING_WITH_TEXT = """() => {
  const m = [...document.querySelectorAll('.message.assistant')].filter((e) => !e.hidden).pop();
  return m && m.dataset.status === 'streaming' && m.dataset.messageId
    && m.querySelector('.content').textContent.trim().length > 0;
}"""
RECORD_CONNECTION_STATES = """() => {
  const el = document.querySelector('#connection-status');
  window.connectionStates = [el.dataset.state];
  new MutationObserver(() => window.connectionStates.push(el.dataset.state))
    .observe(el, { attributes: true, attributeFilter: ['data-state'] });
}"""


def wait_lb(server: str, status: str, *, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while services.lb_server_states().get(server, "").split()[0] != status:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{server} not {status} at the load balancer: {services.lb_server_states()}")
        time.sleep(0.2)


class TokenLog:
    """Token frames the page received, on every socket it opened: ``(message_id, seq, text)`` in order."""

    def __init__(self, page):
        import json

        self.tokens: list[tuple[int, int, str]] = []
        self.sockets = 0

        def on_socket(ws):
            self.sockets += 1

            def on_frame(payload):
                try:
                    frame = json.loads(payload)
                except (TypeError, ValueError):
                    return
                if frame.get("type") == "token":
                    self.tokens.append((frame["message_id"], frame["seq"], frame["text"]))

            ws.on("framereceived", on_frame)

        page.on("websocket", on_socket)

    def accepted(self, message_id: int) -> tuple[str, int, int]:
        """What the page assembles (a token is taken only when its seq is the next one, as chat.js does):
        ``(text, tokens taken, frames ignored as already seen)``."""
        last, text, taken, dup = -1, [], 0, 0
        for mid, seq, piece in self.tokens:
            if mid != message_id:
                continue
            if seq <= last:
                dup += 1
            elif seq == last + 1:
                text.append(piece)
                last, taken = seq, taken + 1
        return "".join(text), taken, dup


def web_kill(*, trials: int = 1) -> DrillResult:
    """SIGKILL the daphne holding a streaming page's socket. Held when the page reconnects through the load
    balancer to the other node by itself, the tokens it took across both sockets are exactly the stored
    reply (none missing, none twice), and the reply is stored ``completed``. Recovery: from the kill until
    the page's socket is open again."""
    from playwright.sync_api import sync_playwright

    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # sync Playwright keeps a loop in this thread
    result = DrillResult("web node SIGKILL mid-stream, browser through the LB (bed)")
    cookie = drill_users(1, max_reply_tokens=96, prefix="bed-web")[0]
    name, value = cookie.split("=", 1)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            for trial in range(trials):
                victim, survivor = WEB[trial % 2], WEB[(trial + 1) % 2]
                # The page's socket lands on the victim: the survivor takes no new connection meanwhile.
                services.lb_command(f"set server web/{survivor.name} state drain")
                context = browser.new_context(ignore_https_errors=True, base_url=f"https://{LB.addr}")
                context.add_cookies([{"name": name, "value": value, "domain": LB.addr, "path": "/",
                                      "secure": True, "httpOnly": True}])  # fmt: skip
                page = context.new_page()
                page.set_default_timeout(60_000)
                log = TokenLog(page)
                page.goto("/chat/")
                page.wait_for_selector("#connection-status[data-state=open]")
                services.lb_command(f"set server web/{survivor.name} state ready")
                page.evaluate(RECORD_CONNECTION_STATES)
                page.fill("#composer", LONG_PROMPT)
                page.press("#composer", "Enter")
                page.wait_for_function(STREAMING_WITH_TEXT, timeout=240_000)
                message_id = int(page.locator(".message.assistant").last.get_attribute("data-message-id"))
                result.trials += 1
                killed_at = time.monotonic()
                services.signal_proc(f"daphne-{victim.name}", signal.SIGKILL)
                page.wait_for_function(
                    "() => window.connectionStates.some((s) => s !== 'open')"
                    " && document.querySelector('#connection-status').dataset.state === 'open'",
                    timeout=60_000,
                )
                result.recovery_s.append(time.monotonic() - killed_at)
                page.wait_for_function(
                    'id => { const m = document.querySelector(`.message.assistant[data-message-id="${id}"]`);'
                    " return m && ['completed', 'interrupted', 'failed'].includes(m.dataset.status); }",
                    arg=message_id,
                    timeout=240_000,
                )
                stored = Message.objects.get(pk=message_id)
                text, taken, dup = log.accepted(message_id)
                if stored.status != "completed":
                    result.failures.append(f"reply stored {stored.status}")
                if text != stored.content:
                    result.failures.append(
                        f"page took {taken} tokens ({len(text)} chars) != stored {len(stored.content or '')} chars"
                    )
                if log.sockets < 2:
                    result.failures.append("the page did not open a second socket")
                result.notes.append(
                    f"trial {trial + 1}: killed daphne-{victim.name}; {log.sockets} sockets, {taken} tokens taken,"
                    f" {dup} replayed frames ignored; states {page.evaluate('window.connectionStates')}"
                )
                context.close()
                services.web_start(victim)
                wait_lb(victim.name, "UP")
        finally:
            browser.close()
    return result
