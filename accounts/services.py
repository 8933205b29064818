"""Writes to accounts."""

from django.db import transaction

from events import broadcast

#: A reply still queued or being generated: ``conversations.models.Message.ACTIVE_STATUSES``, spelt out here because
#: accounts sits below conversations and does not import it (``tests/db/test_conversation_delete.py`` keeps the two
#: equal).
ACTIVE_REPLY_STATUSES = ("queued", "streaming")


def account_delete(*, user) -> None:
    """Delete ``user`` and everything stored for them: conversations, messages, share links (cascade),
    usage records and sessions are removed with the user row. Conversations are deleted first, in one
    query each, so a long history does not go through the ORM collector's per-row signals twice. A reply of
    theirs still queued or streaming is cancelled once the deletion is committed (``broadcast.
    request_cancel_on_commit``), so the engine frees its slot instead of generating to the reply limit; its
    worker's final write finds it gone and charges no one (the quota rows went with the account)."""
    with transaction.atomic():
        # Through the reverse relations (``Conversation.owner``'s and ``Message.conversation``'s related_names):
        # accounts sits below conversations and does not import it. The conversations' row locks first, as a send
        # takes its conversation's: a send storing a reply now is waited for, and its reply is seen below.
        list(user.conversations.select_for_update().values_list("pk"))
        active = list(
            user.conversations.filter(messages__status__in=ACTIVE_REPLY_STATUSES).values_list(
                "messages__id", flat=True
            )
        )
        user.conversations.all().delete()
        user.delete()
        broadcast.request_cancel_on_commit(active)
