"""Writes to accounts."""

from django.db import transaction


def account_delete(*, user) -> None:
    """Delete ``user`` and everything stored for them: conversations, messages, share links (cascade),
    usage records and sessions are removed with the user row. Conversations are deleted first, in one
    query each, so a long history does not go through the ORM collector's per-row signals twice."""
    with transaction.atomic():
        # Through the reverse relation (``Conversation.owner``'s related_name): accounts sits below
        # conversations and does not import it.
        user.conversations.all().delete()
        user.delete()
