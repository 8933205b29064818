"""The pages work under the strict Content-Security-Policy: the chat page (markdown, code highlighting, the
socket), the admin (its JavaScript: the sidebar filter, the change form) and the API docs (Swagger UI).
Each page must send the policy and report no violation (the ``open_page`` fixture fails any browser test
whose console shows one)."""

import re

import pytest

from tests.browser.helpers import seed_conversation

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CODE_REPLY = "Some **bold** text and code:\n\n```python\ndef add(a, b):\n    return a + b\n```\n"


def csp_of(response) -> str:
    return response.headers.get("content-security-policy", "")


def test_chat_page_renders_markdown_and_connects_under_the_policy(open_page, alice):
    conversation = seed_conversation(alice, "Code", [("user", "show code"), ("assistant", CODE_REPLY)])
    page = open_page(alice)
    response = page.goto(f"/chat/{conversation.id}/")
    policy = csp_of(response)
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy
    # Markdown rendered (marked + DOMPurify) and highlighted (highlight.js), all from static files.
    assert page.locator(".message.assistant .content strong").inner_text() == "bold"
    page.locator(".message.assistant pre code.hljs").wait_for()
    # The chat socket (connect-src) is open.
    # A selector wait, not a JavaScript predicate: a string predicate still false at its first look is polled
    # through eval, which this very policy forbids (EvalError on a box where the socket opened a moment late).
    page.locator("#connection-status[data-state='open']").wait_for(state="attached")


def test_admin_works_under_the_policy(open_page, make_user, alice):
    staff = make_user("root", is_staff=True, is_superuser=True)
    seed_conversation(alice, "Seen by staff", [("user", "hello")])
    page = open_page(staff)
    response = page.goto("/admin/")
    assert "default-src 'self'" in csp_of(response)
    page.goto("/admin/conversations/conversation/")
    assert page.locator("#result_list").inner_text().count("Seen by staff") == 1
    # The admin's own scripts run: the navigation sidebar filter hides what does not match.
    page.fill("#nav-filter", "zzz-nothing")
    assert page.locator("#nav-sidebar .current-model").is_hidden()
    page.goto("/admin/accounts/user/add/")
    page.locator("#id_username").wait_for()


def test_api_docs_render_their_operations_under_the_policy(open_page, alice):
    page = open_page(alice)
    response = page.goto("/api/docs")
    assert "script-src 'self'" in csp_of(response)
    page.locator(".opblock").first.wait_for()
    summaries = page.locator(".opblock-summary-path").all_inner_texts()
    assert any(
        re.search(r"/api/conversations/\{conversation_id\}", s.replace("\u200b", "")) for s in summaries
    )
