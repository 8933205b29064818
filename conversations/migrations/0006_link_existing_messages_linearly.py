"""Existing conversations become one linear branch: each message's parent is the one before it (by
created_at, id), each parent's active child the one after it, and the newest message the active leaf."""

from django.db import migrations

FORWARD = [
    """
    UPDATE conversations_message m SET parent_id = s.prev_id
    FROM (SELECT id, LAG(id) OVER (PARTITION BY conversation_id ORDER BY created_at, id) AS prev_id
          FROM conversations_message) s
    WHERE m.id = s.id AND s.prev_id IS NOT NULL
    """,
    """
    UPDATE conversations_message m SET active_child_id = s.next_id
    FROM (SELECT id, LEAD(id) OVER (PARTITION BY conversation_id ORDER BY created_at, id) AS next_id
          FROM conversations_message) s
    WHERE m.id = s.id AND s.next_id IS NOT NULL
    """,
    """
    UPDATE conversations_conversation c SET active_leaf_id = (
        SELECT id FROM conversations_message m WHERE m.conversation_id = c.id
        ORDER BY created_at DESC, id DESC LIMIT 1)
    """,
]
BACKWARD = [
    "UPDATE conversations_conversation SET active_leaf_id = NULL",
    "UPDATE conversations_message SET parent_id = NULL, active_child_id = NULL",
]


class Migration(migrations.Migration):
    dependencies = [("conversations", "0005_message_branch_tree_and_search")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
