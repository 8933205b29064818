"""The branch tree of a conversation: reads and writes of ``Message.parent`` / ``active_child`` and
``Conversation.active_leaf``.

A conversation is a tree of messages. Editing a user message adds a sibling user message (same parent) with
its own reply; regenerating adds a sibling reply. The *active path* is the chain of parents from
``Conversation.active_leaf`` to a root; it is what the page shows and what a reply's context is built from.
Each message's ``active_child`` remembers which child was shown last, so flipping a branch back restores
everything below it (as ChatGPT and Open WebUI do).

The path is read with one recursive CTE that walks parent pointers (primary-key lookups) upwards from the
leaf, and lists each message's siblings through the ``(conversation, parent)`` index in the same query.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction

from conversations.models import Conversation, Message

#: Messages shown when a conversation opens; older ones load on scroll (``before`` pages).
PATH_PAGE_SIZE = 60

_WALK_UP = """
WITH RECURSIVE path(id, parent_id, depth) AS (
    SELECT id, parent_id, 0 FROM conversations_message WHERE id = %(start)s AND conversation_id = %(conv)s
    UNION ALL
    SELECT m.id, m.parent_id, p.depth + 1
    FROM conversations_message m JOIN path p ON m.id = p.parent_id
    WHERE p.depth + 1 < %(limit)s
)"""

# Siblings come from one grouped pass over the children of the path's parents (a hash join), not a
# subquery per row; roots (no parent) are each other's siblings.
_PATH_SQL = (
    _WALK_UP
    + """,
sib AS (
    SELECT s.parent_id, array_agg(s.id ORDER BY s.id) AS ids
    FROM conversations_message s
    WHERE s.conversation_id = %(conv)s AND s.parent_id IN (SELECT parent_id FROM path)
    GROUP BY s.parent_id
),
roots AS (
    SELECT array_agg(id ORDER BY id) AS ids FROM conversations_message
    WHERE conversation_id = %(conv)s AND parent_id IS NULL
)
SELECT m.*, path.depth AS path_depth, COALESCE(sib.ids, roots.ids) AS sibling_ids
FROM path JOIN conversations_message m ON m.id = path.id
LEFT JOIN sib ON sib.parent_id = m.parent_id
CROSS JOIN roots
ORDER BY path.depth DESC
"""
)

_ANCESTORS_SQL = (
    _WALK_UP
    + """
SELECT m.* FROM path JOIN conversations_message m ON m.id = path.id ORDER BY path.depth DESC
"""
)

_DESCEND_SQL = """
WITH RECURSIVE down(id, active_child_id, depth) AS (
    SELECT id, active_child_id, 0 FROM conversations_message WHERE id = %s
    UNION ALL
    SELECT m.id, m.active_child_id, d.depth + 1
    FROM conversations_message m JOIN down d ON m.id = d.active_child_id
)
SELECT id FROM down ORDER BY depth DESC LIMIT 1
"""

_MARK_PATH_SQL = """
WITH RECURSIVE up(id, parent_id) AS (
    SELECT id, parent_id FROM conversations_message WHERE id = %s
    UNION ALL
    SELECT m.id, m.parent_id FROM conversations_message m JOIN up ON m.id = up.parent_id
)
UPDATE conversations_message m SET active_child_id = up.id
FROM up WHERE m.id = up.parent_id AND m.active_child_id IS DISTINCT FROM up.id
"""


@dataclass(frozen=True)
class PathPage:
    """``messages``: oldest first, each with ``sibling_ids`` (list[int], ascending, including itself),
    ``sibling_index`` (1-based) and ``sibling_count``; ``has_older``: messages exist above the first one."""

    messages: list[Message]
    has_older: bool


def active_path(
    *, conversation: Conversation, before: Message | None = None, limit: int | None = None
) -> PathPage:
    """The active branch ending at ``conversation.active_leaf`` (or, with ``before``, the part of it above
    that message), newest ``limit`` messages (all when None), oldest first. One SQL query."""
    start = before.parent_id if before is not None else conversation.active_leaf_id
    if start is None:
        return PathPage(messages=[], has_older=False)
    params = {"start": start, "conv": conversation.pk, "limit": limit or 2**31 - 1}
    messages = list(Message.objects.raw(_PATH_SQL, params))
    for m in messages:
        m.sibling_count = len(m.sibling_ids)
        m.sibling_index = m.sibling_ids.index(m.pk) + 1
        m.conversation = conversation  # spare a query per message where templates follow the FK
    has_older = bool(messages) and messages[0].parent_id is not None
    return PathPage(messages=messages, has_older=has_older)


def ancestors(*, message: Message) -> list[Message]:
    """The messages above ``message`` on its own branch, oldest first (its context), without it."""
    if message.parent_id is None:
        return []
    params = {"start": message.parent_id, "conv": message.conversation_id, "limit": 2**31 - 1}
    return list(Message.objects.raw(_ANCESTORS_SQL, params))


def branch_switch(*, conversation: Conversation, message: Message) -> Message:
    """Show the branch through ``message`` (a message of ``conversation``): every ancestor's
    ``active_child`` is pointed along it, and the active leaf becomes the deepest message reached by
    following ``active_child`` down from ``message``. Returns the new leaf.
    Raises ValueError when ``message`` belongs to another conversation."""
    if message.conversation_id != conversation.pk:
        raise ValueError("message is not in this conversation")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_MARK_PATH_SQL, [message.pk])
        cursor.execute(_DESCEND_SQL, [message.pk])
        leaf_id = cursor.fetchone()[0]
        Conversation.objects.filter(pk=conversation.pk).update(active_leaf_id=leaf_id)
    conversation.active_leaf_id = leaf_id
    return Message.objects.get(pk=leaf_id)
