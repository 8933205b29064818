"""Seeding and waiting helpers for the browser tests."""

from conversations import services
from conversations.models import Message


def seed_conversation(user, title, turns, **extra):
    """A conversation of ``user`` with finished ``(role, content)`` turns, on one branch."""
    conversation = services.conversation_create(owner=user, title=title, **extra)
    for role, content in turns:
        services.message_create(conversation=conversation, role=role, content=content)
    return conversation


def seed_long_conversation(user, n):
    """``n`` alternating user/assistant messages, inserted in bulk (parents linked)."""
    conversation = services.conversation_create(owner=user, title=f"{n} messages")
    previous = None
    rows = []
    for i in range(n):
        m = Message(
            conversation=conversation,
            role="user" if i % 2 == 0 else "assistant",
            content=f"Message number {i}. " + ("Some **markdown** and `code`. " if i % 2 else ""),
            completion_tokens=12 if i % 2 else None,
            duration_ms=800 if i % 2 else None,
        )
        rows.append(m)
    Message.objects.bulk_create(rows)
    for m in rows:
        m.parent_id = previous
        previous = m.id
    Message.objects.bulk_update(rows, ["parent"], batch_size=500)
    for parent, child in zip(rows, rows[1:], strict=False):
        parent.active_child_id = child.id
    Message.objects.bulk_update(rows[:-1], ["active_child"], batch_size=500)
    conversation.active_leaf_id = rows[-1].id
    conversation.save(update_fields=["active_leaf"])
    return conversation


def wait_last_assistant(page, status, timeout=120_000):
    page.wait_for_function(
        "s => { const m = [...document.querySelectorAll('.message.assistant')].filter(e => !e.hidden).pop();"
        " return m && m.dataset.status === s && m.dataset.messageId; }",
        arg=status,
        timeout=timeout,
    )
