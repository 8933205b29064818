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
from devtools.drills.page_frames import PageFrames
from devtools.drills.replies import LONG_PROMPT
from devtools.drills.report import DrillResult

#: The reply's length. It must still be streaming when the page's new socket resumes it (about 1 s after
#: the kill): 320 tokens take 8-13 s on the bed's 1-thread CPU workers. A reply of 96 tokens (2-3 s here,
#: about 1 s on a faster CPU) sometimes ended first; the page then got only ``done`` (and showed the whole
#: stored reply), which the drill miscounted as missing tokens.
REPLY_TOKENS = 320

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


def record_frames(page) -> PageFrames:
    """Every server frame the page receives from now on, per socket it opens."""
    import json

    log = PageFrames()

    def on_socket(ws):
        number = log.socket_opened()

        def on_frame(payload):
            try:
                frame = json.loads(payload)
            except (TypeError, ValueError):
                return
            if isinstance(frame, dict):
                log.add(number, frame)

        ws.on("framereceived", on_frame)

    page.on("websocket", on_socket)
    return log


def web_kill(*, trials: int = 1) -> DrillResult:
    """SIGKILL the daphne holding a streaming page's socket. Held when the page reconnects through the load
    balancer to the other node by itself and resumes the reply there while it still streams, the tokens it
    took across both sockets are exactly the stored reply (none missing, none twice,
    :meth:`PageFrames.take`), the page shows the stored text, and the reply is stored ``completed``.
    Recovery: from the kill until the page's socket is open again."""
    from playwright.sync_api import sync_playwright

    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # sync Playwright keeps a loop in this thread
    result = DrillResult("web node SIGKILL mid-stream, browser through the LB (bed)")
    cookie = drill_users(1, max_reply_tokens=REPLY_TOKENS, prefix="bed-web")[0]
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
                log = record_frames(page)
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
                take = log.take(message_id, stored_text=stored.content or "")
                if stored.status != "completed":
                    result.failures.append(f"reply stored {stored.status}")
                result.failures.extend(take.failures)
                shown = page.locator(f'.message.assistant[data-message-id="{message_id}"] .content')
                if shown.get_attribute("data-raw") != stored.content:
                    result.failures.append("the page does not show the stored reply")
                result.notes.append(
                    f"trial {trial + 1}: killed daphne-{victim.name}; {log.sockets} sockets, {take.taken} tokens"
                    f" taken ({take.later_tokens} on the later sockets), {take.ignored} frames ignored as"
                    f" already seen; states {page.evaluate('window.connectionStates')}"
                )
                context.close()
                services.web_start(victim)
                wait_lb(victim.name, "UP")
        finally:
            browser.close()
    return result
