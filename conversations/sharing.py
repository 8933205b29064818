"""Share links: a read-only snapshot of a conversation's active branch at an unguessable URL.

The snapshot is copied at creation (later messages never appear; other conversations are unreachable
through it), served without an account, marked ``noindex``, and revocable by the owner. The pattern of
ChatGPT's and LibreChat's shared links.
"""

from __future__ import annotations

import secrets

from django.utils import timezone

from conversations import branches
from conversations.models import Conversation, Message, SharedLink


class ShareNotFound(Exception):
    """No live share link with this token (never existed, or revoked)."""


def share_create(*, conversation: Conversation) -> SharedLink:
    """Snapshot the active branch's finished user and assistant messages into a new link."""
    path = branches.active_path(conversation=conversation).messages
    snapshot = [
        {"role": m.role, "content": m.content, "created_at": m.created_at.isoformat()}
        for m in path
        if m.role in (Message.Role.USER, Message.Role.ASSISTANT) and m.content and not m.is_active
    ]
    return SharedLink.objects.create(
        conversation=conversation,
        token=secrets.token_urlsafe(24),
        title=conversation.title,
        snapshot=snapshot,
    )


def share_revoke(*, link: SharedLink) -> None:
    """Revoke a link at once; its URL answers 404 from then on."""
    SharedLink.objects.filter(pk=link.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def share_get_public(*, token: str) -> SharedLink:
    """The live link with this token, for anyone. Raises :class:`ShareNotFound`."""
    link = SharedLink.objects.filter(token=str(token)[:64], revoked_at__isnull=True).first()
    if link is None:
        raise ShareNotFound(token)
    return link


def share_get_for_owner(*, user, link_id) -> SharedLink:
    """A link of one of ``user``'s conversations. Raises :class:`ShareNotFound` otherwise."""
    try:
        return SharedLink.objects.select_related("conversation").get(
            pk=int(link_id), conversation__owner=user
        )
    except (SharedLink.DoesNotExist, TypeError, ValueError) as exc:
        raise ShareNotFound(link_id) from exc


def shares_for_conversation(*, conversation: Conversation) -> list[SharedLink]:
    """The live links of a conversation, newest first."""
    return list(conversation.shared_links.filter(revoked_at__isnull=True))
