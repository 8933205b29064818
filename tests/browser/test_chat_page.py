"""A real browser (Playwright driving Debian's Chromium) against the live stack: daphne, a Celery worker
with the real default model, PostgreSQL and Redis."""

import re

import pytest

from billing.models import Tier
from conversations.models import Message

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LONG_PROMPT = (
    "Write a very long, detailed story about a dragon who learns to bake bread. Use many paragraphs."
)


@pytest.fixture
def page(chromium, live_server_url, celery_worker, redis_clean):
    # The session's one Chromium (tests/browser/conftest.py): a second sync Playwright in the same thread
    # is refused.
    from billing.services import tiers_ensure

    tiers_ensure()  # an earlier transactional test flushed the tiers the data migration made; sign-up needs them
    context = chromium.new_context(base_url=live_server_url)
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    context.close()


def last_assistant(page):
    return page.locator(".message.assistant").last


def plain(text: str) -> str:
    """``text`` without Markdown's inline marks and with its whitespace collapsed: the page renders a reply's
    Markdown (``*smllm*`` shows as an emphasised "smllm"), the database keeps it as the model wrote it."""
    return " ".join(re.sub(r"[*_`~#>]", "", text).split())


def send(page, text):
    page.fill("#composer", text)
    page.press("#composer", "Enter")


def wait_status(page, status, timeout=120_000):
    page.wait_for_function(
        "s => { const m = [...document.querySelectorAll('.message.assistant')].pop(); return m && m.dataset.status === s; }",
        arg=status,
        timeout=timeout,
    )


def test_sign_up_chat_stop_and_resume_after_reload(page, tmp_path):
    # Sign up and land on an empty chat.
    page.goto("/accounts/signup/")
    page.fill("input[name=username]", "browser-user")
    page.fill("input[name=email]", "browser@example.com")
    page.fill("input[name=password1]", "Br0wser-secret-pw")
    page.fill("input[name=password2]", "Br0wser-secret-pw")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/chat/$"))
    Tier.objects.filter(name="free").update(max_reply_tokens=24)

    # Send: the user's message shows at once, tokens stream in, the reply completes and matches the database.
    send(page, "Say hello in one short sentence.")
    page.locator(".message.user").last.wait_for()
    assert "Say hello" in page.locator(".message.user").last.inner_text()
    page.wait_for_function(
        "() => { const m = [...document.querySelectorAll('.message.assistant .content')].pop(); return m && m.textContent.trim().length > 0; }"
    )
    wait_status(page, "completed")
    page.wait_for_url(re.compile(r"/chat/\d+/$"))
    reply_id = int(last_assistant(page).get_attribute("data-message-id"))
    stored = Message.objects.get(pk=reply_id)
    assert stored.status == "completed"
    assert plain(last_assistant(page).locator(".content").inner_text())[:10] in plain(stored.content)

    # Stop a long reply: the partial text stays, marked cancelled.
    Tier.objects.filter(name="free").update(max_reply_tokens=400)
    send(page, LONG_PROMPT)
    wait_status(page, "streaming")
    page.wait_for_function(
        "() => { const m = [...document.querySelectorAll('.message.assistant .content')].pop(); return m && m.textContent.trim().length > 10; }"
    )
    page.click("#stop-button")
    wait_status(page, "cancelled", timeout=30_000)
    stopped = Message.objects.get(pk=int(last_assistant(page).get_attribute("data-message-id")))
    assert stopped.status == "cancelled" and stopped.content and stopped.completion_tokens < 400

    # Reload while another reply streams: the page replays what it missed and continues live.
    Tier.objects.filter(name="free").update(max_reply_tokens=80)
    page.click(".regenerate-button")
    wait_status(page, "streaming")
    page.reload()
    wait_status(page, "completed")
    resumed = Message.objects.get(pk=int(last_assistant(page).get_attribute("data-message-id")))
    assert resumed.status == "completed"
    shown = last_assistant(page).locator(".content").inner_text()
    # Markdown rendering changes whitespace; compare the words.
    assert shown.split()[:5] == resumed.content.split()[:5]
    page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
