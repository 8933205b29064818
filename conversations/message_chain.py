"""Store a chain of messages in one SQL statement (docs/overhead-levers.md, lever 20).

A send stores two messages (the user's and its queued reply) and moves three pointers (the previous leaf's
``active_child``, the user message's ``active_child``, the conversation's ``active_leaf``). Through the ORM
that is an INSERT per message and an UPDATE per pointer, and on 2 vCPUs of an Intel Xeon Cascade Lake the
ORM's Python (building each INSERT's and UPDATE's SQL afresh) costs about 2.7 ms per message against well
under 1 ms for the round trips. :func:`chain_insert` writes the same rows in one statement whose text
depends only on the chain's length and which pointers move, so it is built once and cached:

- a ``WITH`` item takes the chain's ids from the table's identity sequence (``nextval``), so each message's
  ``parent`` and ``active_child`` are known inside the statement: a row is inserted with its final pointers
  and never updated (a data-modifying ``WITH`` cannot see rows its siblings insert, PostgreSQL manual 7.8.4);
- the previous leaf's ``active_child`` and the conversation's ``active_leaf`` move in two more ``WITH`` items;
- rows of other models that point at a message of the chain (a send's input verdict, its reply's quota
  reservation) can be stored in the same statement too, each in a ``WITH`` item of its own (lever 28);
- a chain that starts a conversation (a page send with no conversation yet, an API completion) inserts the
  conversation in the same statement, its id drawn from its own sequence and its ``active_leaf`` the chain's
  last message (lever 47): the conversation's own ``INSERT`` was a round trip of its own before.

A message references its successor before that row exists within the statement; Django creates foreign keys
``DEFERRABLE INITIALLY DEFERRED``, so they are checked at commit, as they are for the ORM's writes. Field
values go through each field's own ``pre_save`` and ``get_db_prep_save`` (defaults, ``auto_now``, JSON),
as the ORM's INSERT does. The statement runs through Django's cursor: counted, traced and logged like the
ORM's, and a taken ``client_id`` raises ``django.db.IntegrityError`` as ``Model.objects.create`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from django.db import connection
from django.utils import timezone

from conversations.models import Conversation, Message
from database.sql import insert_fields, insert_values, mark_saved, prepared_cursor

#: The columns every chained message is inserted with besides ``id``, ``parent`` and ``active_child``
#: (which the statement computes): the model's concrete fields, in declaration order.
_POINTERS = ("id", "parent", "active_child")


@cache
def _value_fields() -> tuple:
    return tuple(
        f
        for f in Message._meta.concrete_fields
        if f.name not in _POINTERS and not getattr(f, "generated", False)
    )


@cache
def message_key(model) -> object:
    """The one foreign key of ``model`` to ``Message`` (what an attached row of :func:`chain_insert`, or of a
    reply's final write, ``conversations.generation_worker``, points with). Raises ``ValueError`` when it has
    none or several."""
    keys = [f for f in insert_fields(model) if f.is_relation and f.related_model is Message]
    if len(keys) != 1:
        raise ValueError(f"{model._meta.label} needs exactly one foreign key to Message to be attached")
    return keys[0]


@cache
def _conversation_fields() -> tuple:
    """The fields a new conversation is inserted with besides ``id`` and ``active_leaf`` (which the statement
    computes), in ``database.sql.insert_fields`` order."""
    return tuple(f for f in insert_fields(Conversation) if f.name != "active_leaf")


@cache
def _statement(
    length: int,
    *,
    moves_parent: bool,
    moves_leaf: bool,
    attached: tuple[tuple[type, int], ...] = (),
    new_conversation: bool = False,
) -> str:
    """The SQL that inserts ``length`` chained messages (``%s`` placeholders: with ``new_conversation`` the
    conversation's fields in :func:`_conversation_fields` order, then the parent id, then each message's
    value fields in :func:`_value_fields` order (its ``conversation`` left out when ``new_conversation``), then
    the parent id again when ``moves_parent``, then the conversation's ``updated_at`` and id when
    ``moves_leaf``, then each attached row's fields but its key to Message, in ``database.sql.insert_fields``
    order). ``attached``: ``((model, index in the chain), ...)`` of the rows stored with it. It returns one
    row: the chain's ids as an array, in chain order, then each attached row's primary key, then with
    ``new_conversation`` the new conversation's id."""
    qn = connection.ops.quote_name
    table = qn(Message._meta.db_table)
    columns = ", ".join(qn(f.column) for f in _value_fields())
    placeholders = ", ".join(
        "(SELECT v FROM conversation_id)" if new_conversation and f.name == "conversation" else "%s"
        for f in _value_fields()
    )

    def nth(k: int) -> str:  # the k-th id of the chain, 1-based; NULL past either end
        return f"(SELECT v[{k}] FROM ids)"

    rows = ",\n".join(
        f"({nth(k)}, {nth(k - 1) if k > 1 else '%s'}, {nth(k + 1) if k < length else 'NULL'}, {placeholders})"
        for k in range(1, length + 1)
    )
    parts = [
        # MATERIALIZED: the ids are drawn once, however often the items below read them.
        f"ids AS MATERIALIZED (SELECT array_agg(v ORDER BY v) AS v FROM ("
        f"SELECT nextval(pg_get_serial_sequence('{Message._meta.db_table}', 'id')) AS v "
        f"FROM generate_series(1, {length})) AS drawn)",
    ]
    if new_conversation:
        conversation_columns = ", ".join(qn(f.column) for f in _conversation_fields())
        parts += [
            f"conversation_id AS MATERIALIZED (SELECT nextval(pg_get_serial_sequence("
            f"'{Conversation._meta.db_table}', 'id')) AS v)",
            f"conversation_inserted AS (INSERT INTO {qn(Conversation._meta.db_table)} ({qn('id')}, "
            f"{qn('active_leaf_id')}, {conversation_columns}) VALUES ((SELECT v FROM conversation_id), "
            f"{nth(length)}, {', '.join(['%s'] * len(_conversation_fields()))}))",
        ]
    parts.append(
        f"inserted AS (INSERT INTO {table} ({qn('id')}, {qn('parent_id')}, {qn('active_child_id')}, "
        f"{columns}) VALUES {rows})"
    )
    if moves_parent:
        parts.append(
            f"parent_moved AS (UPDATE {table} SET {qn('active_child_id')} = {nth(1)} WHERE {qn('id')} = %s)"
        )
    if moves_leaf:
        parts.append(
            f"leaf_moved AS (UPDATE {qn(Conversation._meta.db_table)} SET {qn('active_leaf_id')} = {nth(length)}, "
            f"{qn('updated_at')} = %s WHERE {qn('id')} = %s)"
        )
    returned = ["v"]
    for n, (model, index) in enumerate(attached, 1):
        fields, key = insert_fields(model), message_key(model)
        values = ", ".join(nth(index + 1) if f is key else "%s" for f in fields)
        pk = qn(model._meta.pk.column)
        parts.append(
            f"attached{n} AS (INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
            f"VALUES ({values}) RETURNING {pk})"
        )
        returned.append(f"(SELECT {pk} FROM attached{n})")
    if new_conversation:
        returned.append("(SELECT v FROM conversation_id)")
    return "WITH " + ",\n".join(parts) + f"\nSELECT {', '.join(returned)} FROM ids"


def chain_insert(
    *,
    conversation: Conversation,
    messages: Sequence[dict],
    parent_id: int | None,
    moves_leaf: bool,
    attached: Sequence[tuple[object, int]] = (),
) -> list[Message]:
    """Insert ``messages`` (one dict of ``Message`` field values each, without ``conversation``, ``parent``
    or ``active_child``) into ``conversation`` as a chain: the first is a child of ``parent_id`` (None: a
    root), each next one a child of the one before, each one's ``active_child`` its successor. The parent's
    ``active_child`` moves to the first; with ``moves_leaf`` the conversation's ``active_leaf`` moves to the
    last and its ``updated_at`` to now (``conversation.active_leaf_id`` is set in memory either way).

    ``attached``: ``((row, index), ...)``: unsaved instances of other models, each with one foreign key to
    ``Message``, stored in the same statement pointing at the ``index``-th message of the chain (0-based) and
    saved as ``Model.objects.create`` saves them (``database.sql.insert_instance``; no signals sent). A
    ``row`` None is left out.

    An unsaved ``conversation`` (no primary key yet) is inserted by the same statement, as
    ``database.sql.insert_instance`` would insert it, with the chain's last message as its ``active_leaf``
    (``parent_id`` must be None and ``moves_leaf`` is then moot); its id is set on it and on the messages.

    One round trip, inside the caller's transaction (the caller holds the conversation's row lock, or the
    conversation is its own). Returns the stored messages, in chain order, as saved ``Message`` objects.
    Raises ``ValueError`` for an empty chain or a new conversation with a parent, ``django.db.IntegrityError``
    for a taken ``client_id`` (a message's, or a new conversation's).
    """
    if not messages:
        raise ValueError("a chain holds at least one message")
    new_conversation = conversation.pk is None
    if new_conversation and parent_id is not None:
        raise ValueError("the first message of a new conversation has no parent")
    fields = _value_fields()
    stored = [Message(conversation=conversation, **values) for values in messages]
    params: list = []
    if new_conversation:
        params.extend(insert_values(conversation, _conversation_fields()))
        fields = tuple(f for f in fields if f.name != "conversation")
        moves_leaf = False  # the conversation is inserted with its leaf
    params.append(parent_id)
    for message in stored:
        params.extend(insert_values(message, fields))
    if parent_id is not None:
        params.append(parent_id)
    if moves_leaf:
        params.extend([timezone.now(), conversation.pk])
    attached = [(row, index) for row, index in attached if row is not None]
    for row, _ in attached:
        key = message_key(type(row))
        params.extend(insert_values(row, [f for f in insert_fields(type(row)) if f is not key]))
    shape = tuple((type(row), index % len(stored)) for row, index in attached)
    sql = _statement(
        len(stored),
        moves_parent=parent_id is not None,
        moves_leaf=moves_leaf,
        attached=shape,
        new_conversation=new_conversation,
    )
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        ids, *attached_ids = cursor.fetchone()
    if new_conversation:
        mark_saved(conversation, pk=attached_ids.pop())
        for message in stored:
            message.conversation = conversation  # its id now, and the instance kept (no read when used)
    for (row, _), (model, index), pk in zip(attached, shape, attached_ids, strict=True):
        setattr(row, message_key(model).attname, ids[index])
        mark_saved(row, pk=pk)
    for k, message in enumerate(stored):
        message.parent_id = ids[k - 1] if k else parent_id
        message.active_child_id = ids[k + 1] if k + 1 < len(ids) else None
        mark_saved(message, pk=ids[k])
    conversation.active_leaf_id = ids[-1]
    return stored
