"""Full-text search: own conversations only, titles and message text, highlighted snippets."""

import pytest
from django.urls import reverse

from conversations import services
from conversations.search import search_for_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def corpus(alice, bob):
    mine = services.conversation_create(owner=alice, title="Sourdough notes")
    services.message_create(conversation=mine, role="user", content="How long should the levain ferment?")
    services.message_create(conversation=mine, role="assistant", content="About <b>eight</b> hours at 24 °C.")
    theirs = services.conversation_create(owner=bob, title="Secret levain")
    services.message_create(conversation=theirs, role="user", content="my levain secret is rye")
    return mine, theirs


def test_search_finds_own_message_text_with_highlight(alice, corpus):
    mine, _ = corpus
    hits = search_for_user(user=alice, query="levain")
    assert [(h.conversation_id, h.role) for h in hits] == [(mine.id, "user")]
    assert "<mark>levain</mark>" in hits[0].snippet


def test_other_users_text_and_titles_are_never_searched(alice, bob, corpus):
    assert search_for_user(user=alice, query="rye") == []
    assert search_for_user(user=alice, query="secret") == []
    assert {h.conversation_id for h in search_for_user(user=bob, query="levain")} == {corpus[1].id}


def test_titles_match_and_message_markup_is_escaped(alice, corpus):
    hits = search_for_user(user=alice, query="sourdough")
    assert hits[0].message_id is None and "<mark>Sourdough</mark>" in hits[0].snippet
    eight = search_for_user(user=alice, query="eight")[0]
    # ts_headline drops the tags of message text; whatever is left is escaped: no markup gets through.
    assert "<mark>eight</mark>" in eight.snippet and "<b>" not in eight.snippet


def test_anonymous_and_empty_queries_find_nothing(corpus):
    from django.contrib.auth.models import AnonymousUser

    assert search_for_user(user=AnonymousUser(), query="levain") == []


def test_search_page_links_to_the_message(client, alice, corpus):
    client.force_login(alice)
    response = client.get(reverse("conversations:search"), {"q": "ferment"})
    assert response.status_code == 200
    hit = search_for_user(user=alice, query="ferment")[0]
    assert f"?m={hit.message_id}" in response.content.decode()
    opened = client.get(reverse("conversations:detail", args=[hit.conversation_id]), {"m": hit.message_id})
    assert opened.status_code == 200 and 'class="message user focused"' in opened.content.decode()


def test_search_uses_the_gin_index(alice, corpus):
    from django.contrib.postgres.search import SearchQuery, SearchVector
    from django.db import connection

    from conversations.models import Message

    qs = (
        Message.objects.annotate(match=SearchVector("content", config="simple"))
        .filter(match=SearchQuery("levain", config="simple"))
        .values("id")
    )
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        plan = qs.explain()
        cursor.execute("SET enable_seqscan = on")
    assert "msg_content_search_idx" in plan
