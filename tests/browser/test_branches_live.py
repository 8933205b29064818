"""Chat features where a reply must really stream: edit and regenerate as branches, tab sync, and the
rate-limit countdown. A real Celery worker with the real model answers (short replies to stay fast)."""

import pytest

from billing.models import Tier
from conversations.models import Conversation, Message
from tests.browser.helpers import seed_conversation, wait_last_assistant

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def short_replies(celery_worker, alice):
    Tier.objects.filter(name="free").update(max_reply_tokens=8)


def shown(page):
    return [m.inner_text() for m in page.locator(".message:not([hidden]) .content").all()]


def test_edit_then_switch_branches_then_reload_shows_the_same_branch(open_page, alice, short_replies):
    conversation = seed_conversation(alice, "Edits", [("user", "Say hi"), ("assistant", "Hi there, seeded.")])
    page = open_page(alice)
    page.goto(f"/chat/{conversation.id}/")
    page.locator(".message.user .edit-message").click()
    assert page.input_value("#composer") == "Say hi"
    page.fill("#composer", "Say bye")
    page.press("#composer", "Enter")
    wait_last_assistant(page, "completed")
    assert shown(page)[0] == "Say bye"
    user_nav = page.locator(".message.user .branch-pos")
    user_nav.wait_for()
    assert user_nav.inner_text() == "2/2"

    page.locator(".message.user .branch-prev").click()
    page.wait_for_function("() => document.querySelector('.message.user .branch-pos')?.textContent === '1/2'")
    assert shown(page) == ["Say hi", "Hi there, seeded."]
    page.reload()
    assert shown(page) == ["Say hi", "Hi there, seeded."]
    assert page.locator(".message.user .branch-pos").inner_text() == "1/2"
    conversation.refresh_from_db()
    assert conversation.active_leaf.content == "Hi there, seeded."
    assert Message.objects.filter(conversation=conversation).count() == 4


def test_regenerate_keeps_the_old_reply(open_page, alice, short_replies):
    conversation = seed_conversation(
        alice, "Regen", [("user", "Name a colour"), ("assistant", "Seeded reply.")]
    )
    page = open_page(alice)
    page.goto(f"/chat/{conversation.id}/")
    page.click(".regenerate-button")
    wait_last_assistant(page, "completed")
    nav = page.locator(".message.assistant .branch-pos")
    nav.wait_for()
    assert nav.inner_text() == "2/2"
    assert Message.objects.filter(conversation=conversation, role="assistant").count() == 2
    page.locator(".message.assistant .branch-prev").click()
    page.wait_for_function(
        "() => document.querySelector('.message.assistant .branch-pos')?.textContent === '1/2'"
    )
    assert shown(page) == ["Name a colour", "Seeded reply."]
    assert page.locator(".regenerate-button").count() == 1  # on the last reply only


def test_a_second_tab_shows_new_messages_and_renames(open_page, alice, short_replies):
    conversation = seed_conversation(alice, "Two tabs", [("user", "First"), ("assistant", "First reply.")])
    first, second = open_page(alice), open_page(alice)
    for tab in (first, second):
        tab.goto(f"/chat/{conversation.id}/")
        tab.locator("#connection-status[data-state=open]").wait_for()
    first.fill("#composer", "Second question")
    first.press("#composer", "Enter")
    second.wait_for_function(
        "() => [...document.querySelectorAll('.message.user .content')].some(e => e.textContent === 'Second question')"
    )
    wait_last_assistant(second, "completed")
    wait_last_assistant(first, "completed")
    # Regenerate is offered only on the reply that is now last, in both tabs.
    for tab in (first, second):
        assert tab.locator(".regenerate-button").count() == 1
        assert tab.locator(".message").last.locator(".regenerate-button").count() == 1

    first.fill("#composer", "")
    row = first.locator(f'.conversation-item[data-conversation-id="{conversation.id}"]')
    row.locator(".row-menu-button").click()
    row.locator("input[name=title]").fill("Renamed in tab one")
    row.locator(".rename-form button").click()
    second.wait_for_function(
        "() => document.getElementById('conversation-title').textContent === 'Renamed in tab one'"
    )
    assert Conversation.objects.get(pk=conversation.pk).title == "Renamed in tab one"


def test_continue_appends_to_the_same_reply_bubble(open_page, alice, short_replies):
    conversation = seed_conversation(alice, "Story", [("user", "Tell a long story about a fox.")])
    cut = Message.objects.create(
        conversation=conversation,
        parent=conversation.active_leaf,
        role="assistant",
        content="Once upon a time",
        finish_reason="length",
    )
    Conversation.objects.filter(pk=conversation.pk).update(active_leaf=cut)
    Message.objects.filter(pk=cut.parent_id).update(active_child=cut)
    page = open_page(alice)
    page.goto(f"/chat/{conversation.id}/")
    page.locator("#connection-status[data-state=open]").wait_for()
    page.click(".continue-button")
    page.locator(".message.assistant.continuation[data-status=completed]").wait_for(timeout=120_000)
    continuation = Message.objects.get(conversation=conversation, parent=cut)
    assert continuation.role == "assistant" and continuation.content
    for _ in range(2):  # live, then after a reload
        assert page.locator(".message.assistant .role:visible").count() == 1
        [text] = page.locator(".message.assistant .content:visible").all_inner_texts()
        assert text.startswith("Once upon a time") and len(text) > len("Once upon a time")
        assert page.locator(".message.assistant.continuation").count() == 1
        page.reload()
        page.locator("#connection-status[data-state=open]").wait_for()
