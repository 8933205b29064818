"""The chat page's features that need no model: search, export/import, ChatGPT import, share links, dark
mode, the sidebar menu, long conversations, phone width, axe-core on the log-in, chat, search and share
pages, and the retry countdowns of refused sends. The database is seeded directly; no worker runs."""

import json
import re
import threading

import pytest

from billing.models import Tier
from conversations import sharing
from conversations.models import Conversation, Message, SharedLink
from inference import fleet
from tests.browser.conftest import PHONE, axe_violations
from tests.browser.helpers import seed_conversation, seed_long_conversation, wait_last_assistant

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CODE_REPLY = "Here is code:\n\n```python\ndef add(a, b):\n    return a + b\n```\n"


def test_search_finds_a_word_from_message_text_and_opens_it(open_page, alice, bob):
    seed_conversation(bob, "Bob's", [("user", "the word pomegranate is bob's")])
    older = seed_conversation(
        alice, "Fruit", [("user", "Tell me about pomegranates"), ("assistant", "A pomegranate is a fruit.")]
    )
    seed_conversation(alice, "Other", [("user", "unrelated")])
    page = open_page(alice)
    page.goto("/chat/")
    page.fill("#sidebar-search-q", "pomegranate")
    page.press("#sidebar-search-q", "Enter")
    page.wait_for_url(re.compile(r"/chat/search/\?q=pomegranate"))
    results = page.locator(".search-results li")
    assert results.count() == 1  # bob's text is never searched
    assert page.locator(".search-results mark").first.inner_text().lower() == "pomegranate"
    results.first.locator("a").click()
    page.wait_for_url(re.compile(rf"/chat/{older.id}/\?m=\d+"))
    focused = page.locator(".message.focused")
    assert "pomegranate is a fruit" in focused.inner_text()
    assert focused.is_visible()


def test_export_then_import_round_trips(open_page, alice, tmp_path):
    seed_conversation(alice, "Round trip", [("user", "ping"), ("assistant", "pong")])
    page = open_page(alice)
    page.goto("/chat/import/")
    with page.expect_download() as download:
        page.click("#export-all-json")
    path = tmp_path / "export.json"
    download.value.save_as(path)
    assert json.loads(path.read_text())["format"] == "chatsite.conversations"
    page.set_input_files("#import-file", str(path))
    page.click("#import-submit")
    page.wait_for_url(re.compile(r"/chat/\d+/$"))
    assert [m.inner_text() for m in page.locator(".message .content").all()] == ["ping", "pong"]
    assert Conversation.objects.filter(owner=alice, title="Round trip").count() == 2


def test_a_chatgpt_export_file_imports_and_a_bad_file_is_refused(open_page, alice, tmp_path):
    chatgpt = [
        {
            "title": "Imported from ChatGPT",
            "create_time": 1700000000.0,
            "current_node": "b",
            "mapping": {
                "r": {"id": "r", "message": None, "parent": None, "children": ["a"]},
                "a": {
                    "id": "a",
                    "parent": "r",
                    "children": ["b"],
                    "message": {
                        "author": {"role": "user"},
                        "create_time": 1700000001.0,
                        "content": {"parts": ["Hi GPT"]},
                    },
                },
                "b": {
                    "id": "b",
                    "parent": "a",
                    "children": [],
                    "message": {
                        "author": {"role": "assistant"},
                        "create_time": 1700000002.0,
                        "content": {"parts": ["Hello!"]},
                    },
                },
            },
        }
    ]
    (tmp_path / "conversations.json").write_text(json.dumps(chatgpt))
    (tmp_path / "bad.json").write_text('{"oops": ')
    page = open_page(alice)
    page.goto("/chat/import/")
    page.set_input_files("#import-file", str(tmp_path / "bad.json"))
    page.click("#import-submit")
    assert "Nothing was imported" in page.locator("#import-error").inner_text()
    assert Conversation.objects.filter(owner=alice).count() == 0
    page.set_input_files("#import-file", str(tmp_path / "conversations.json"))
    page.click("#import-submit")
    page.wait_for_url(re.compile(r"/chat/\d+/$"))
    assert page.locator("#conversation-title").inner_text() == "Imported from ChatGPT"
    assert [m.inner_text() for m in page.locator(".message .content").all()] == ["Hi GPT", "Hello!"]


def test_share_link_works_logged_out_and_stops_once_revoked(open_page, alice):
    conversation = seed_conversation(
        alice, "Shareable", [("user", "share me"), ("assistant", "shared reply")]
    )
    page = open_page(alice)
    page.goto(f"/chat/{conversation.id}/")
    page.click(".conversation-tools summary")
    page.click("#share-create")
    url = page.locator(".share-url").first.get_attribute("href")
    assert re.fullmatch(r"/s/[\w-]{32,}/", url)

    anonymous = open_page()
    response = anonymous.goto(url)
    assert response.status == 200 and "shared reply" in anonymous.content()
    assert anonymous.locator('meta[name="robots"]').get_attribute("content").startswith("noindex")
    assert axe_violations(anonymous) == []

    page.click(".conversation-tools summary")
    page.locator(".share-list button.danger").first.click()
    page.wait_for_load_state()
    assert anonymous.goto(url).status == 404
    assert SharedLink.objects.get().revoked_at is not None


def test_dark_mode_follows_the_system_and_the_toggle_and_code_stays_readable(open_page, alice):
    conversation = seed_conversation(alice, "Code", [("user", "code please"), ("assistant", CODE_REPLY)])
    page = open_page(alice, color_scheme="dark")
    page.goto(f"/chat/{conversation.id}/")
    bg = "() => getComputedStyle(document.body).backgroundColor"
    assert page.evaluate(bg) == "rgb(13, 17, 23)"  # the system says dark
    assert page.locator("link[data-hljs-theme=dark]").get_attribute("media") in (
        "all",
        "(prefers-color-scheme: dark)",
    )
    page.click("#theme-toggle")
    assert page.evaluate(bg) == "rgb(255, 255, 255)"
    assert page.locator("link[data-hljs-theme=light]").get_attribute("media") == "all"
    page.reload()
    assert page.evaluate(bg) == "rgb(255, 255, 255)"  # the choice is kept
    keyword = page.locator(".hljs-keyword").first
    assert keyword.inner_text() == "def"
    assert axe_violations(page) == []  # contrast included, code highlighting too
    page.click("#theme-toggle")
    assert page.evaluate(bg) == "rgb(13, 17, 23)"
    assert axe_violations(page) == []


def test_sidebar_menu_closes_on_outside_click_and_escape_and_delete_keeps_the_current_chat(open_page, alice):
    current = seed_conversation(alice, "Current", [("user", "here")])
    other = seed_conversation(alice, "Other one", [("user", "there")])
    page = open_page(alice)
    page.goto(f"/chat/{current.id}/")
    row = page.locator(f'.conversation-item[data-conversation-id="{other.id}"]')
    row.locator(".row-menu-button").click()
    assert row.locator(".conversation-actions-panel").is_visible()
    page.keyboard.press("Escape")
    assert not row.locator(".conversation-actions-panel").is_visible()
    row.locator(".row-menu-button").click()
    page.click("#message-list")
    assert not row.locator(".conversation-actions-panel").is_visible()

    # Rename keeps the order; delete of another chat keeps this one on screen.
    order = page.locator(".conversation-item").evaluate_all("els => els.map(e => e.dataset.conversationId)")
    row.locator(".row-menu-button").click()
    row.locator("input[name=title]").fill("Renamed")
    row.locator(".rename-form button").click()
    page.wait_for_function(
        f"() => document.querySelector('[data-conversation-id=\"{other.id}\"] .conversation-title').textContent === 'Renamed'"
    )
    assert (
        page.locator(".conversation-item").evaluate_all("els => els.map(e => e.dataset.conversationId)")
        == order
    )
    page.once("dialog", lambda d: d.accept())
    row.locator(".row-menu-button").click()
    row.locator(".delete-form button").click()
    row.wait_for(state="detached")
    assert page.url.endswith(f"/chat/{current.id}/")
    assert not Conversation.objects.filter(pk=other.id).exists()


def test_pasted_text_over_the_limit_is_kept_and_explained(open_page, alice, settings):
    page = open_page(alice)
    page.goto("/chat/")
    limit = int(page.locator("#chat-app").get_attribute("data-max-chars"))
    page.evaluate(
        "n => { const t = document.getElementById('composer'); t.focus(); "
        "const dt = new DataTransfer(); dt.setData('text/plain', 'x'.repeat(n)); "
        "t.value = 'x'.repeat(n); t.dispatchEvent(new ClipboardEvent('paste', {clipboardData: dt})); "
        "t.dispatchEvent(new Event('input')); }",
        limit + 10,
    )
    assert len(page.input_value("#composer")) == limit + 10  # nothing cut
    page.locator("#chat-banner").wait_for()
    assert "10 characters" in page.locator("#chat-banner").inner_text()
    page.press("#composer", "Enter")
    assert Message.objects.count() == 0


def test_long_conversation_opens_at_the_newest_and_loads_older_on_scroll(open_page, alice, shots_dir):
    conversation = seed_long_conversation(alice, 1000)
    page = open_page(alice)
    timings = []
    for _ in range(3):
        page.goto(f"/chat/{conversation.id}/")
        page.wait_for_function("() => window.chatReady")
        timings.append(page.evaluate("() => window.chatReady"))
    timings.sort()
    print(
        f"\n1,000-message chat page interactive: {timings[1]:.0f} ms [{timings[0]:.0f}-{timings[-1]:.0f}] over 3 loads"
    )
    assert page.evaluate("() => document.activeElement.id") == "composer"  # focused on load
    assert "Message number 999" in page.locator(".message").last.inner_text()
    shown = page.locator(".message").count()
    assert shown < 1000
    page.locator("#message-list").evaluate("el => { el.scrollTop = 0; }")
    page.wait_for_function(f"() => document.querySelectorAll('.message').length > {shown}")
    assert "0.8 s" in page.locator(".message.assistant .meta").last.inner_text()  # durations after a reload


def test_phone_width_every_page_is_usable(open_page, alice, shots_dir):
    conversation = seed_conversation(
        alice, "Phone", [("user", "Hello from a phone"), ("assistant", CODE_REPLY)]
    )
    link = sharing.share_create(conversation=conversation)
    page = open_page(alice, viewport=PHONE)
    page.emulate_media(reduced_motion="reduce")  # the drawer opens without its slide, for the screenshot
    page.goto(f"/chat/{conversation.id}/")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    page.screenshot(path=str(shots_dir / "phone-chat.png"))
    page.click("#sidebar-toggle")
    page.locator("#sidebar").wait_for(state="visible")
    page.screenshot(path=str(shots_dir / "phone-sidebar.png"))
    page.keyboard.press("Escape")
    page.goto("/chat/search/?q=phone")
    assert page.locator(".search-results li").count() == 2  # the title and the message
    page.screenshot(path=str(shots_dir / "phone-search.png"))
    page.goto(f"/s/{link.token}/")
    assert page.locator(".share-page .hljs-keyword").first.inner_text() == "def"  # markdown rendered
    page.screenshot(path=str(shots_dir / "phone-share.png"))
    page.goto("/accounts/profile/")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    page.screenshot(path=str(shots_dir / "phone-profile.png"), full_page=True)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_serious_violations_on_login_chat_search_and_share(open_page, alice, scheme):
    conversation = seed_conversation(alice, "Axe", [("user", "Check me"), ("assistant", CODE_REPLY)])
    link = sharing.share_create(conversation=conversation)
    anonymous = open_page(color_scheme=scheme)
    anonymous.goto("/accounts/login/")
    found = {"login": axe_violations(anonymous)}
    anonymous.goto(f"/s/{link.token}/")
    found["share"] = axe_violations(anonymous)
    page = open_page(alice, color_scheme=scheme)
    page.goto(f"/chat/{conversation.id}/")
    page.locator("#connection-status[data-state=open]").wait_for()
    found["chat"] = axe_violations(page)
    page.goto("/chat/search/?q=check")
    found["search"] = axe_violations(page)
    assert found == {"login": [], "share": [], "chat": [], "search": []}


def test_rate_limited_message_counts_down_and_cancel_keeps_the_text(open_page, alice):
    from django_ratelimit.core import get_usage

    Tier.objects.filter(name="free").update(requests_per_minute=1)
    page = open_page(alice)
    page.goto("/chat/")
    page.locator("#connection-status[data-state=open]").wait_for()
    # This minute's one request is used up (as by a message just sent), so the next send is refused.
    get_usage(None, group="generation", key=lambda g, r: f"user:{alice.pk}", rate="1/m", increment=True)
    page.fill("#composer", "Two")
    page.press("#composer", "Enter")
    page.wait_for_function(
        "() => /retrying in \\d+ s/.test(document.querySelector('#queue-status').textContent)"
    )
    assert page.locator("#queue-status").get_attribute("aria-live") == "polite"
    assert page.input_value("#composer") == ""  # the text is in the pending bubble, not sent twice
    assert page.locator(".message.user").last.inner_text().endswith("Two")
    page.click(".queue-cancel")
    assert page.input_value("#composer") == "Two"
    assert page.locator(".message.user").count() == 0
    assert Message.objects.count() == 0


def test_send_refused_no_workers_is_retried_every_few_seconds_and_queued_once_a_worker_publishes(
    open_page, alice, private_model
):
    # After a Redis restart the page can reconnect and send before any worker has republished its status.
    private_model("loaddrill")  # every tier routes to a model no running worker serves
    page = open_page(alice)
    page.goto("/chat/")
    page.locator("#connection-status[data-state=open]").wait_for()
    page.fill("#composer", "Anyone there?")
    page.press("#composer", "Enter")
    # The server's retry_after (5 s), not the free tier's back-off (10, 20, 40 ... s).
    page.wait_for_function(
        "() => /No model worker is available — retrying in [1-5] s/"
        ".test(document.querySelector('#queue-status').textContent)"
    )
    assert Message.objects.count() == 0 and page.locator("#chat-banner").is_hidden()

    status = fleet.WorkerStatus(
        worker_id="browser-test:1", host="browser-test", pid=1, model="loaddrill", ready=True
    )
    stop = threading.Event()
    publisher = threading.Thread(target=fleet.publish_forever, args=(lambda: status,), kwargs={"stop": stop})
    publisher.start()
    try:
        wait_last_assistant(page, "queued", timeout=20_000)
    finally:
        stop.set()
        publisher.join(5)
        fleet.unpublish(status.worker_id)
    reply = Message.objects.get(role="assistant")
    assert (reply.status, reply.model_name) == ("queued", "loaddrill")
    assert page.locator(".message.user .content").last.inner_text() == "Anyone there?"
