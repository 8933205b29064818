"""Writes to conversations and messages (keyword-only, ``<entity>_<verb>``)."""

from django.utils import timezone

from conversations.models import Conversation, Message

TITLE_MAX_CHARS = 60


def conversation_create(*, owner, title: str = "", system_prompt: str = "", client_id=None) -> Conversation:
    """A new conversation of ``owner``; ``title`` is stripped and cut to 200 characters. ``client_id``: the
    idempotency key of the ``send`` that starts it (unique per owner; raises IntegrityError when taken)."""
    return Conversation.objects.create(
        owner=owner, title=title.strip()[:200], system_prompt=system_prompt, client_id=client_id
    )


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    """Set a new title (stripped, at most 200 characters). Raises ValueError for an empty title."""
    title = title.strip()
    if not title:
        raise ValueError("title must not be empty")
    conversation.title = title[:200]
    conversation.save(update_fields=["title", "updated_at"])
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    """Delete a conversation and its messages (usage records keep their counts; their message link is cleared)."""
    conversation.delete()


def conversation_touch(*, conversation: Conversation) -> None:
    """Move a conversation to the top of its owner's sidebar."""
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now())


def title_from_content(content: str) -> str:
    """A sidebar title from the first user message: its first line, cut at a word near 60 characters."""
    line = content.strip().splitlines()[0] if content.strip() else "New chat"
    if len(line) <= TITLE_MAX_CHARS:
        return line
    return line[:TITLE_MAX_CHARS].rsplit(" ", 1)[0] + "…"


def message_create(
    *,
    conversation: Conversation,
    role: str,
    content: str,
    status: str = Message.Status.COMPLETED,
    model_name: str = "",
    client_id=None,
) -> Message:
    """Store a message and move its conversation to the top of the sidebar. ``client_id``: a user message's
    idempotency key (unique per conversation; raises IntegrityError when taken)."""
    message = Message.objects.create(
        conversation=conversation,
        role=role,
        content=content,
        status=status,
        model_name=model_name,
        client_id=client_id,
    )
    conversation_touch(conversation=conversation)
    return message
