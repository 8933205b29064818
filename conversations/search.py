"""Full-text search over one user's own conversations: titles and message text.

PostgreSQL full-text search (``SearchVector``/``SearchQuery`` in the ``simple`` configuration, no stemming,
so any language matches word for word) over GIN expression indexes on ``Message.content`` and
``Conversation.title`` (see the models' ``Meta.indexes``; the query expressions below are the indexed
ones). The owner filter is part of every query: other users' text is never searched.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.postgres.search import SearchHeadline, SearchQuery, SearchRank, SearchVector
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from conversations.models import Conversation, Message

MAX_QUERY_CHARS = 200
CONFIG = "simple"
# Private-use characters mark the match inside the headline; the text is HTML-escaped, then they become
# <mark> tags, so message text can never inject markup.
_START, _STOP = "\ue000", "\ue001"


@dataclass(frozen=True)
class SearchHit:
    """One result: the conversation, the matching message (None for a title match) and an HTML snippet
    (escaped, the matched words in ``<mark>``)."""

    conversation_id: int
    conversation_title: str
    message_id: int | None
    role: str
    snippet: SafeString


def _highlight(text: str) -> SafeString:
    return mark_safe(escape(text).replace(_START, "<mark>").replace(_STOP, "</mark>"))


def search_for_user(*, user, query: str, limit: int = 50) -> list[SearchHit]:
    """Title matches first, then message matches by rank, at most ``limit`` in all. ``query`` uses web
    search syntax (``"exact phrase"``, ``-word``, ``or``). Empty for an empty query or anonymous user."""
    query = (query or "").strip()[:MAX_QUERY_CHARS]
    if not query or user is None or not user.is_authenticated:
        return []
    ts_query = SearchQuery(query, config=CONFIG, search_type="websearch")
    titles = (
        Conversation.objects.filter(owner=user, stored=True)
        .annotate(match=SearchVector("title", config=CONFIG))
        .filter(match=ts_query)
        .annotate(headline=SearchHeadline("title", ts_query, config=CONFIG, start_sel=_START, stop_sel=_STOP))
        .order_by("-updated_at")[:limit]
    )
    hits = [SearchHit(c.id, c.title, None, "", _highlight(c.headline)) for c in titles]
    vector = SearchVector("content", config=CONFIG)
    messages = (
        Message.objects.filter(conversation__owner=user, conversation__stored=True)
        .annotate(match=vector)
        .filter(match=ts_query)
        .annotate(
            rank=SearchRank(vector, ts_query),
            headline=SearchHeadline(
                "content",
                ts_query,
                config=CONFIG,
                start_sel=_START,
                stop_sel=_STOP,
                max_words=30,
                min_words=10,
                max_fragments=2,
            ),
        )
        .select_related("conversation")
        .order_by("-rank", "-created_at")[: max(0, limit - len(hits))]
    )
    hits += [
        SearchHit(m.conversation_id, m.conversation.title, m.id, m.role, _highlight(m.headline))
        for m in messages
    ]
    return hits
