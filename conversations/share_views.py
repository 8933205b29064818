"""Share links: create/revoke (owner) and the public read-only page (anyone, ``noindex``)."""

from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from conversations import selectors, sharing


@login_required
@require_POST
def share_create(request, conversation_id: int):
    """Snapshot the conversation's active branch into a new link and show it on the chat page."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    link = sharing.share_create(conversation=conversation)
    url = request.build_absolute_uri(f"/s/{link.token}/")
    flash.success(request, f"Share link created (a snapshot of the conversation as it is now): {url}")
    return redirect("conversations:detail", conversation_id=conversation.id)


@login_required
@require_POST
def share_revoke(request, link_id: int):
    """Revoke one of the user's links; its URL answers 404 from now on."""
    try:
        link = sharing.share_get_for_owner(user=request.user, link_id=link_id)
    except sharing.ShareNotFound as exc:
        raise Http404("share link not found") from exc
    sharing.share_revoke(link=link)
    flash.success(request, "Share link revoked.")
    return redirect("conversations:detail", conversation_id=link.conversation_id)


def share_view(request, token: str):
    """The public snapshot; 404 once revoked. Never indexed (meta robots and ``X-Robots-Tag``)."""
    try:
        link = sharing.share_get_public(token=token)
    except sharing.ShareNotFound as exc:
        raise Http404("This share link does not exist or was revoked.") from exc
    response = render(request, "chat/share.html", {"link": link})
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Referrer-Policy"] = "no-referrer"
    return response
