"""Reads of conversations and messages. Every read of a conversation goes through
:func:`conversation_get_for_user`, which refuses other users' conversations."""

import functools

from django.contrib.auth import get_user_model
from django.core.paginator import Page, Paginator
from django.http import Http404

from conversations.models import Conversation, Message
from database.sql import fetch_instance, fetch_one, instances_from_row, select_list

SIDEBAR_PAGE_SIZE = 30
#: Primary keys are PostgreSQL ``bigint``; a larger id cannot exist (and would make the query fail).
MAX_PK = 2**63 - 1


def _pk(value) -> int:
    pk = int(value)
    if not 1 <= pk <= MAX_PK:
        raise ValueError("id out of range")
    return pk


class ConversationNotFound(Http404):
    """The conversation does not exist or belongs to someone else (indistinguishable on purpose)."""


class MessageNotFound(Http404):
    """The message does not exist or is in someone else's conversation."""


def conversation_get_for_user(*, user, conversation_id, for_update: bool = False) -> Conversation:
    """The conversation with this id if ``user`` owns it. Raises :class:`ConversationNotFound` for a missing
    id, a non-integer id, another user's conversation, an unstored API completion, or an anonymous user.
    ``for_update``: read it with its row lock (``SELECT ... FOR UPDATE``, inside the caller's transaction),
    so its ``active_leaf_id`` stays current until that transaction ends (a reply-creating service's first
    statement: see ``conversations/generations.py`` for the lock order)."""
    if user is None or not user.is_authenticated:
        raise ConversationNotFound("conversation not found")
    try:
        pk = _pk(conversation_id)
    except (TypeError, ValueError) as exc:
        raise ConversationNotFound("conversation not found") from exc
    # Fixed SQL (docs/overhead-levers.md, lever 22): the ORM's ``get`` compiled this on every call.
    conversation = fetch_instance(
        Conversation, "id = %s AND owner_id = %s AND stored", (pk, user.pk), for_update=for_update
    )
    if conversation is None:
        raise ConversationNotFound("conversation not found")
    if isinstance(user, get_user_model()):
        # The owner is ``user``: reading ``conversation.owner`` later (a reply's dispatch priority, its place
        # in line) costs no query.
        conversation.owner = user
    return conversation


@functools.cache
def _message_for_user_statement() -> tuple[str, tuple]:
    """``(sql, row_fields)`` of :func:`message_get_for_user`: the message and its conversation in one row,
    built once per process (``database.sql.select_list``)."""
    columns, row_fields = select_list((("m", Message), ("c", Conversation)))
    sql = (
        f'SELECT {columns} FROM "{Message._meta.db_table}" m'
        f' JOIN "{Conversation._meta.db_table}" c ON c.id = m.conversation_id'
        " WHERE m.id = %s AND c.owner_id = %s"
    )
    return sql, row_fields


def message_get_for_user(*, user, message_id) -> Message:
    """A message in one of ``user``'s conversations (stored or not), with its conversation loaded
    (``message.conversation`` costs no query, nor does ``message.conversation.owner`` when ``user`` is a
    user instance). Raises :class:`MessageNotFound` for a missing or non-integer id, another user's message,
    or an anonymous user.

    One fixed statement, prepared once per connection (``database/sql.py``; docs/overhead-levers.md, lever
    60): the ORM's ``select_related(...).get(...)`` compiled its join on every call, and it is read by every
    ``resume`` frame, every ``stop`` and a burst's late joiners' catch-up."""
    if user is None or not user.is_authenticated:
        raise MessageNotFound("message not found")
    try:
        pk = _pk(message_id)
    except (TypeError, ValueError) as exc:
        raise MessageNotFound("message not found") from exc
    sql, row_fields = _message_for_user_statement()
    row = fetch_one(sql, (pk, user.pk))
    if row is None:
        raise MessageNotFound("message not found")
    message, conversation = instances_from_row(row_fields, row)
    message.conversation = conversation
    if isinstance(user, get_user_model()):
        conversation.owner = user
    return message


def conversation_page_for_user(*, user, page_number=1, per_page: int = SIDEBAR_PAGE_SIZE) -> Page:
    """One page of ``user``'s conversations, most recently updated first (invalid page -> nearest page)."""
    qs = (
        Conversation.objects.filter(owner=user, stored=True)
        .only("id", "title", "updated_at")
        .order_by("-updated_at", "-id")
    )
    return Paginator(qs, per_page).get_page(page_number)


def message_list(*, conversation: Conversation) -> list[Message]:
    """All messages of a conversation, oldest first."""
    return list(conversation.messages.order_by("created_at", "id"))


#: :func:`active_generation_count`'s one statement (a fixed string: ``database/sql.py``, lever 19), with
#: ``%(owner)s`` the user's id; admission reads it inside a statement of its own (lever 28).
ACTIVE_REPLIES_SQL = f"""
SELECT COUNT(*) FROM conversations_message m
  JOIN conversations_conversation c ON c.id = m.conversation_id
 WHERE c.owner_id = %(owner)s AND m.role = %(assistant)s AND m.status IN {Message.ACTIVE_STATUSES_SQL}
"""


def active_replies_params(user) -> dict:
    """:data:`ACTIVE_REPLIES_SQL`'s parameters for ``user``."""
    return {"owner": user.pk, "assistant": Message.Role.ASSISTANT}


#: Queued replies of a model whose owner's tier ranks above ``%(priority)s``, or equal with an id up to
#: ``%(id)s``: a queued reply's place in line (``reply_dispatch.queue_position``; with ``%(id)s`` the largest
#: id, the replies ahead of one not stored yet, which admission reads in its own statement: lever 30). The
#: status is written in, not bound: the partial index of active replies then serves the generic plan (lever 29).
PLACE_IN_LINE_SQL = f"""
SELECT COUNT(*) FROM conversations_message m
  JOIN conversations_conversation c ON c.id = m.conversation_id
  JOIN accounts_user u ON u.id = c.owner_id
  JOIN billing_tier t ON t.id = u.tier_id
 WHERE m.model_name = %(model)s AND m.role = %(role)s AND m.status = '{Message.Status.QUEUED}'
   AND (t.queue_priority > %(priority)s OR (t.queue_priority = %(priority)s AND m.id <= %(id)s))
"""


#: Queued and streaming replies of a model whose owner's tier ranks at ``%(priority)s`` or above, in one row
#: (``conversations.load.active_at_or_above``, read by admission and the admission warmer; the ORM compiled the
#: same aggregate on every read, lever 56). Statuses written in, not bound (lever 29).
ACTIVE_AT_OR_ABOVE_SQL = f"""
SELECT COUNT(*) FILTER (WHERE m.status = '{Message.Status.QUEUED}'),
       COUNT(*) FILTER (WHERE m.status = '{Message.Status.STREAMING}')
  FROM conversations_message m
  JOIN conversations_conversation c ON c.id = m.conversation_id
  JOIN accounts_user u ON u.id = c.owner_id
  JOIN billing_tier t ON t.id = u.tier_id
 WHERE m.model_name = %(model)s AND m.role = %(role)s AND m.status IN {Message.ACTIVE_STATUSES_SQL}
   AND t.queue_priority >= %(priority)s
"""

#: Users' tier ids: ``(id, tier_id)`` for each id of the array ``%(ids)s`` (the admission warmer's read, lever 56).
USER_TIERS_SQL = "SELECT id, tier_id FROM accounts_user WHERE id = ANY(%(ids)s)"


def place_in_line_params(*, model_name: str, priority: int, up_to_id: int = MAX_PK) -> dict:
    """:data:`PLACE_IN_LINE_SQL`'s parameters: replies of ``model_name`` queued ahead of a reply of tier
    priority ``priority`` (``Tier.queue_priority``) and id ``up_to_id`` (that reply included); the default,
    the largest id, counts every reply of that priority, i.e. those ahead of a reply not stored yet."""
    return {"model": model_name, "role": Message.Role.ASSISTANT, "priority": priority, "id": up_to_id}


def active_generation_count(*, user) -> int:
    """How many of ``user``'s replies are queued or streaming right now."""
    return fetch_one(ACTIVE_REPLIES_SQL, active_replies_params(user))[0]


def message_page(*, conversation: Conversation, page_number=1, per_page: int = 50) -> Page:
    """One page of a conversation's messages, oldest first (invalid page -> nearest page)."""
    return Paginator(conversation.messages.order_by("created_at", "id"), per_page).get_page(page_number)
