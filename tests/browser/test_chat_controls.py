"""The chat page driven as a person would, without a model: the keyboard alone reaches every main action
(with a visible focus ring and live regions for the streaming reply and busy notices), the plan's model
picker, and a continued reply shown joined to the reply it continues.

A fake idle worker status is published for the plan's models, so admission control admits; no worker
consumes the queued replies, so a reply stays ``queued`` until Stop cancels it (at once, in the database)."""

import json
import re
import time
from dataclasses import asdict

import pytest

from billing.models import Tier
from conversations import services
from conversations.models import Conversation, Message
from events import broadcast
from inference import fleet
from tests.browser.conftest import axe_violations
from tests.browser.helpers import seed_conversation, wait_last_assistant

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Aliases of the default weights registered by the test settings, whose queues no test worker consumes (the
# session's real worker serves the default model's queue and would stream these replies at once).
OWN = "page-own"
LIGHT = "page-light"


@pytest.fixture
def idle_workers(redis_clean):
    """An idle worker status for the plan's models (only these keys are removed afterwards: a live worker of
    another test keeps its own)."""
    client = broadcast.redis_client()
    keys = []
    for model in (OWN, LIGHT):
        status = fleet.WorkerStatus(
            worker_id=f"browser-fake-{model}", host="test", pid=0, model=model, ready=True, max_num_seqs=32
        )
        status.updated_at = time.time()
        keys.append(fleet.status_key(status.worker_id))
        client.set(keys[-1], json.dumps(asdict(status)), ex=300)
    yield
    client.delete(*keys)


# ---------- keyboard ----------

FOCUS_RING = """() => {
  const el = document.activeElement;
  const s = getComputedStyle(el);
  if (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0) return true;
  if (s.boxShadow && s.boxShadow !== 'none') return true;
  // The composer's textarea shows focus on its frame (.composer:focus-within takes the accent colour).
  const frame = el.closest('.composer');
  if (!frame) return false;
  const probe = document.createElement('span');
  probe.style.color = 'var(--accent)';
  document.body.append(probe);
  const accent = getComputedStyle(probe).color;
  probe.remove();
  return getComputedStyle(frame).borderTopColor === accent;
}"""


def tab_to(page, selector, *, back=False, limit=120):
    """Press Tab (Shift+Tab with ``back``) until the focused element matches ``selector``; every element
    focused on the way (and the target) must show a focus ring."""
    key = "Shift+Tab" if back else "Tab"
    for _ in range(limit):
        # One evaluate: what is focused, whether it shows a ring and whether it is the target.
        seen = page.evaluate(
            "s => { const e = document.activeElement;"
            " if (!e || e === document.body) return {body: true};"
            " return {where: e.outerHTML.slice(0, 160), ring: ("
            + FOCUS_RING
            + ")(), match: e.matches(s)}; }",
            selector,
        )
        if not seen.get("body"):
            assert seen["ring"], f"no visible focus on {seen['where']}"
            if seen["match"]:
                return
        page.keyboard.press(key)
    raise AssertionError(f"{selector} not reachable with {key}")


def test_every_main_action_is_reachable_with_the_keyboard_alone(open_page, alice, idle_workers):
    Tier.objects.filter(name="free").update(model_name=OWN, degrade_to_model="")
    other = seed_conversation(alice, "Other chat", [("user", "Elsewhere"), ("assistant", "Quiet here.")])
    conversation = seed_conversation(
        alice, "Keys", [("user", "Name a fruit"), ("assistant", "Apple, first answer.")]
    )
    question = conversation.messages.get(role="user")
    services.message_create(
        conversation=conversation, role="assistant", content="Pear, second answer.", parent=question
    )
    page = open_page(alice)
    page.goto(f"/chat/{conversation.id}/")
    page.locator("#connection-status[data-state=open]").wait_for()
    assert page.evaluate("() => document.activeElement.id") == "composer"  # focused on load

    # Live regions: the busy/countdown notices and the banner.
    assert page.locator("#queue-status").get_attribute("aria-live") == "polite"
    assert page.locator("#chat-banner").get_attribute("role") == "alert"

    # Branch switch: ‹ on the reply's "2/2".
    tab_to(page, ".message.assistant .branch-prev", back=True)
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.querySelector('.message.assistant .branch-pos')?.textContent === '1/2'"
    )
    assert "Apple" in page.locator(".message.assistant .content").inner_text()

    # Edit: Enter opens the message in the composer, Escape leaves edit mode, Enter again and send.
    tab_to(page, ".message.user .edit-message")
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.id") == "composer"
    assert page.input_value("#composer") == "Name a fruit"
    page.keyboard.press("Escape")
    assert page.locator("#edit-note").is_hidden() and page.input_value("#composer") == ""
    tab_to(page, ".message.user .edit-message", back=True)
    page.keyboard.press("Enter")
    page.keyboard.press("Control+A")
    page.keyboard.type("Name a vegetable")
    page.keyboard.press("Enter")
    wait_last_assistant(page, "queued", timeout=30_000)
    # The reply being generated is a live region.
    assert page.locator(".message.assistant").last.locator(".content").get_attribute("aria-live") == "polite"

    # Stop (reachable from the composer), then Regenerate on the stopped reply, then Stop again.
    tab_to(page, "#stop-button")
    page.keyboard.press("Enter")
    wait_last_assistant(page, "cancelled", timeout=30_000)
    tab_to(page, ".message.assistant .regenerate-button", back=True)
    page.keyboard.press("Enter")
    wait_last_assistant(page, "queued", timeout=30_000)
    tab_to(page, "#stop-button")
    page.keyboard.press("Enter")
    wait_last_assistant(page, "cancelled", timeout=30_000)

    # Send from the composer.
    tab_to(page, "#composer", back=True)
    page.keyboard.type("And a nut?")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.message.user .content')].some(e => e.textContent === 'And a nut?')"
    )
    wait_last_assistant(page, "queued", timeout=30_000)
    tab_to(page, "#stop-button")
    page.keyboard.press("Enter")
    wait_last_assistant(page, "cancelled", timeout=30_000)
    assert Message.objects.filter(conversation=conversation, status="cancelled").count() == 3

    # Open another conversation from the sidebar.
    tab_to(page, f'.conversation-item[data-conversation-id="{other.id}"] a', back=True)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(rf"/chat/{other.id}/$"))
    page.locator("#connection-status[data-state=open]").wait_for()

    # Search, and open a hit.
    tab_to(page, "#sidebar-search-q", back=True)
    page.keyboard.type("vegetable")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/chat/search/\?q=vegetable"))
    tab_to(page, f'a[href*="/chat/{conversation.id}/"]')
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(rf"/chat/{conversation.id}/\?m=\d+"))

    # New chat.
    tab_to(page, "a.new-chat", back=True)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/chat/$"))
    assert page.locator("#conversation-title").inner_text() == "New chat"


# ---------- model choice ----------


def test_plan_with_two_models_picks_one_that_answers_and_survives_reload(open_page, alice, idle_workers):
    Tier.objects.filter(name="free").update(model_name=OWN, degrade_to_model=LIGHT)
    page = open_page(alice)
    page.goto("/chat/")
    page.locator("#connection-status[data-state=open]").wait_for()
    assert page.locator("#model-select option").all_inner_texts()[1:] == [OWN, LIGHT]
    assert page.input_value("#model-select") == ""  # automatic: the plan's routing
    assert axe_violations(page) == []
    page.select_option("#model-select", LIGHT)
    page.fill("#composer", "Hi there")
    page.press("#composer", "Enter")
    wait_last_assistant(page, "queued", timeout=30_000)
    assert page.locator(".message.assistant").last.get_attribute("data-model") == LIGHT
    conversation = Conversation.objects.get(owner=alice)
    assert conversation.model_name == LIGHT
    assert conversation.messages.get(role="assistant").model_name == LIGHT
    page.click("#stop-button")
    wait_last_assistant(page, "cancelled", timeout=30_000)
    page.reload()
    assert page.input_value("#model-select") == LIGHT
    assert LIGHT in page.locator(".message.assistant .meta").inner_text()

    # A model the plan does not offer (a tampered option) is refused: banner, text back, nothing stored.
    page.locator("#connection-status[data-state=open]").wait_for()
    page.evaluate(
        "() => document.querySelector('#model-select').add(new Option('dbdrill', 'dbdrill', true, true))"
    )
    page.fill("#composer", "Sneaky")
    page.press("#composer", "Enter")
    page.locator("#chat-banner:not([hidden])").wait_for()
    assert "dbdrill" in page.locator("#chat-banner .banner-text").inner_text()
    assert page.locator("#chat-banner .banner-retry").is_hidden()
    assert page.input_value("#composer") == "Sneaky"
    assert Message.objects.filter(conversation=conversation).count() == 2
    assert Conversation.objects.get(pk=conversation.pk).model_name == LIGHT


def test_plan_with_one_model_shows_it_without_a_picker(open_page, alice):
    Tier.objects.filter(name="free").update(model_name=OWN, degrade_to_model="")
    page = open_page(alice)
    page.goto("/chat/")
    assert page.locator("#model-select").count() == 0
    assert OWN in page.locator("#model-name").inner_text()


# ---------- continue ----------


def test_a_continued_reply_reads_as_one_bubble_after_reload(open_page, alice):
    conversation = seed_conversation(alice, "Cut", [("user", "Tell a story")])
    cut = services.message_create(
        conversation=conversation, role="assistant", content="Once upon a ti", model_name=OWN
    )
    Message.objects.filter(pk=cut.pk).update(finish_reason="length")
    services.message_create(
        conversation=conversation, role="assistant", content="me there was a fox.", model_name=OWN
    )
    page = open_page(alice)
    page.goto(f"/chat/{conversation.id}/")
    page.locator("#connection-status[data-state=open]").wait_for()
    assert page.locator(".message.assistant .role:visible").count() == 1
    assert page.locator(".message.assistant .content:visible").all_inner_texts() == [
        "Once upon a time there was a fox."
    ]
    assert page.locator(".status-line:visible").count() == 0  # "Cut off…" belongs to the joined part
    assert page.locator(".continue-button").count() == 0
    assert page.locator(".message.assistant .copy-message:visible").count() == 1
