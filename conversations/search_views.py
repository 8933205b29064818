"""``/chat/search/``: full-text search over the signed-in user's own conversations."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from conversations.search import MAX_QUERY_CHARS, search_for_user


@login_required
def search(request):
    """GET ``q``: hits with highlighted snippets, each linking to the conversation at that message."""
    query = request.GET.get("q", "").strip()[:MAX_QUERY_CHARS]
    hits = search_for_user(user=request.user, query=query) if query else []
    return render(request, "chat/search.html", {"query": query, "hits": hits})
