"""The chat page rides out a Redis restart by itself: a real browser against a daphne and a Celery worker
whose channel layer is a Redis server of this test's own, which the test restarts (with data loss)
mid-stream; the reply in flight ends and the next message streams, without a reload."""

import pytest
from django.conf import settings
from django.test import Client

from billing.models import Tier
from conversations.models import Message
from tests.browser.diagnostics import FrameLog, failure_report
from tests.live_stack import daphne_server

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LONG_PROMPT = (
    "Write a very long, detailed story about a dragon who learns to bake bread. Use many paragraphs."
)

# Records every state #connection-status goes through (the page sets data-state), so a drop that is over
# before the next poll is still seen.
RECORD_CONNECTION_STATES = """() => {
  const el = document.querySelector('#connection-status');
  window.connectionStates = [el.dataset.state];
  new MutationObserver(() => window.connectionStates.push(el.dataset.state))
    .observe(el, { attributes: true, attributeFilter: ['data-state'] });
}"""

LAST_REPLY_STREAMING_WITH_TEXT = """() => {
  const m = [...document.querySelectorAll('.message.assistant')].filter((e) => !e.hidden).pop();
  return m && m.dataset.status === 'streaming' && m.dataset.messageId
    && m.querySelector('.content').textContent.trim().length > 0;
}"""


def last_reply(page):
    return page.locator(".message.assistant").last


def reply_status(page, status, timeout=180_000):
    page.wait_for_function(
        "s => { const m = [...document.querySelectorAll('.message.assistant')].filter((e) => !e.hidden).pop();"
        " return m && m.dataset.status === s && m.dataset.messageId; }",
        arg=status,
        timeout=timeout,
    )


def send(page, text):
    page.fill("#composer", text)
    page.press("#composer", "Enter")


def test_page_rides_out_a_redis_restart_and_the_next_message_streams(
    chromium, private_redis, private_model, drill_workers, make_user, tmp_path
):
    port, restart = private_redis
    redis_url = f"redis://127.0.0.1:{port}/0"
    worker = drill_workers("redis-browser", private_model("redisdrill"), TEST_REDIS_URL=redis_url)
    Tier.objects.update(max_reply_tokens=48)
    user = make_user("reconnecting")
    client = Client()
    client.force_login(user)
    with daphne_server(tmp_path / "daphne.log", TEST_REDIS_URL=redis_url) as base:
        context = chromium.new_context(base_url=base)
        context.add_cookies(
            [
                {
                    "name": settings.SESSION_COOKIE_NAME,
                    "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
                    "url": base,
                }
            ]
        )
        page = context.new_page()
        page.set_default_timeout(60_000)
        frames = FrameLog(page)
        try:
            page.goto("/chat/")
            page.wait_for_selector("#connection-status[data-state=open]")
            page.evaluate(RECORD_CONNECTION_STATES)

            # A reply streams; Redis restarts (channel layer, replay streams, leases, fleet status all lost).
            send(page, LONG_PROMPT)
            page.wait_for_function(LAST_REPLY_STREAMING_WITH_TEXT, timeout=180_000)
            in_flight = int(last_reply(page).get_attribute("data-message-id"))
            restart()

            # The reply in flight ends, nobody reloading the page: with the pub/sub channel layer the socket
            # outlives the restart (redis-py reconnects and subscribes again) and the page asks for the
            # tokens it missed (a gap in seq -> resume); with the list-based layer the socket drops and the
            # page reconnects by itself.
            page.wait_for_function(
                'id => { const m = document.querySelector(`.message.assistant[data-message-id="${id}"]`);'
                " return m && ['completed', 'interrupted'].includes(m.dataset.status); }",
                arg=in_flight,
                timeout=180_000,
            )
            stored = Message.objects.get(pk=in_flight)
            assert stored.status in ("completed", "interrupted") and stored.content

            # A message sent afterwards streams token by token on the reconnected socket and completes. Sent at
            # once after a reconnect it may be refused no_workers (the restart lost the worker's status, back
            # within a second): the page re-sends it after retry_after (5 s) by itself.
            page.wait_for_selector("#send-button:not([disabled])")
            send(page, "Now write a long poem about bread, with many verses.")
            page.wait_for_function(LAST_REPLY_STREAMING_WITH_TEXT, timeout=120_000)
            reply_status(page, "completed")
            after = Message.objects.get(pk=int(last_reply(page).get_attribute("data-message-id")))
            assert after.pk != in_flight and after.status == "completed"
            shown = last_reply(page).locator(".content").inner_text()
            assert shown.split()[:3] == after.content.split()[:3]
            states = page.evaluate("window.connectionStates")
            assert states[0] == "open" and states[-1] == "open", states
            page.screenshot(path=str(tmp_path / "reconnected.png"), full_page=True)
        except Exception as exc:
            logs = {"worker": worker.log_path, "daphne": tmp_path / "daphne.log"}
            report = failure_report(page=page, frames=frames, logs=logs, redis_url=redis_url)
            (tmp_path / "failure.txt").write_text(report)
            raise AssertionError(f"{exc}\n{report}") from exc
        finally:
            (tmp_path / "frames.txt").write_text(frames.text())
            context.close()
