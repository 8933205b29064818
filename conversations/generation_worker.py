"""The worker side of a generated reply, called by ``conversations/reply_runner.py``: claim a queued reply
(:func:`generation_start`), read its branch (:func:`generation_branch`), record its context
(:func:`generation_set_context`) and write its final state once (:func:`generation_finish`).
"""

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from billing.models import Tier
from billing.quota import quota_charge_unreserved, settle_sql
from billing.services import usage_record_create, usage_record_sql
from conversations import branches, recall
from conversations.message_chain import message_key
from conversations.models import Conversation, Message
from database.sql import (
    fetch_one,
    insert_fields,
    insert_values,
    instances_from_row,
    mark_saved,
    prepared_cursor,
    select_list,
)
from database.storable_text import storable_text
from documents.models import Document
from documents.selectors import citations_for_messages
from events import broadcast
from memory.models import AccountMemory, ConversationMemory


@dataclass(frozen=True)
class ClaimReads:
    """What a reply's context assembly reads, fetched by :func:`generation_start` in its claim statement
    (docs/overhead-levers.md, lever 21; four statements before): ``branch``, the reply's ancestors oldest first as
    ``(id, role, status, content)`` (what ``branches.ancestors`` reads); ``has_documents``, whether a file of
    the conversation is ready (``documents.retrieval.conversation_has_documents``); ``memory_switches_on``,
    that neither the account's nor the conversation's memory switch is off (``memory.selectors.
    memory_enabled_for`` without the site-wide setting, which the reader checks). Read under the claim's
    snapshot; a change to those switches belongs in :func:`_claim_statement` too."""

    branch: tuple[tuple[int, str, str, str], ...]
    has_documents: bool
    memory_switches_on: bool


def generation_start(*, message_id: int, trace_id: str = "", model_version: str = "") -> Message | None:
    """Claim a queued reply for generation (``queued -> streaming``), recording the trace id and the model
    version of the worker that generates it, and return it with its conversation, owner and tier loaded, all
    in one statement (an ``UPDATE ... RETURNING`` joined to the three rows; it was the update and a
    ``select_related`` read: docs/overhead-levers.md, lever 16). The same statement reads what context assembly
    needs, set as the returned message's ``claim_reads`` (:class:`ClaimReads`, lever 21). None when it is
    no longer queued (cancelled meanwhile, or a redelivered task whose reply already ended)."""
    sql, row_fields = _claim_statement()
    params = [
        Message.Status.STREAMING,
        timezone.now(),
        trace_id,
        model_version,
        message_id,
        Message.Status.QUEUED,
        Document.Status.READY,
    ]
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    # Each row loaded as a queryset loads it (each field's converters: JSONField decodes its text, ...).
    values = iter(row)
    message, conversation, owner, tier = instances_from_row(row_fields, values)
    owner.tier = tier
    conversation.owner = owner
    message.conversation = conversation
    branch, has_documents, memory_switches_on = values
    if isinstance(branch, str):  # a json column the driver left as text
        branch = json.loads(branch)
    message.claim_reads = ClaimReads(
        branch=tuple(tuple(m) for m in branch),
        has_documents=has_documents,
        memory_switches_on=memory_switches_on,
    )
    return message


@functools.cache
def _claim_statement() -> tuple[str, tuple[tuple[type, tuple], ...]]:
    """``(sql, ((model, its concrete fields), ...))`` of :func:`generation_start`'s claim, for the reply,
    its conversation, owner and tier, in the order the statement returns their columns, followed by the
    three :class:`ClaimReads` columns. Built once per process (the models do not change after start-up)."""
    columns, row_fields = select_list(
        (("m", Message), ("c", Conversation), ("u", get_user_model()), ("t", Tier))
    )
    message_table, conversation_table, user_table, tier_table = (m._meta.db_table for m, _ in row_fields)
    # The ancestors walk up the parent pointers from the claimed reply (branches._WALK_UP's walk), each step an
    # index lookup that also takes the columns the branch needs. Joining the walk's ids back to the table instead
    # let the planner, which guesses a recursive CTE at 100 rows, hash-join them against a sequential scan of
    # every message: 1.7 ms of the claim's 2.2 at 6,000 messages, and growing with the table (lever 42).
    sql = f"""
        WITH RECURSIVE m AS (
            UPDATE "{message_table}" SET status = %s, updated_at = %s, trace_id = %s, model_version = %s
             WHERE id = %s AND status = %s RETURNING *),
        up(id, parent_id, depth, role, status, content) AS (
            SELECT a.id, a.parent_id, 0, a.role, a.status, a.content
              FROM "{message_table}" a JOIN m ON a.id = m.parent_id
             WHERE a.conversation_id = m.conversation_id
            UNION ALL
            SELECT a.id, a.parent_id, up.depth + 1, a.role, a.status, a.content
              FROM "{message_table}" a JOIN up ON a.id = up.parent_id)
        SELECT {columns},
          (SELECT COALESCE(json_agg(json_build_array(up.id, up.role, up.status, up.content) ORDER BY up.depth DESC),
                           '[]'::json)
             FROM up),
          EXISTS (SELECT 1 FROM "{Document._meta.db_table}" d WHERE d.conversation_id = c.id AND d.status = %s),
          NOT EXISTS (SELECT 1 FROM "{AccountMemory._meta.db_table}" am WHERE am.user_id = u.id AND NOT am.enabled)
          AND NOT EXISTS (SELECT 1 FROM "{ConversationMemory._meta.db_table}" cm
                           WHERE cm.conversation_id = c.id AND NOT cm.enabled)
          FROM m
          JOIN "{conversation_table}" c ON c.id = m.conversation_id
          JOIN "{user_table}" u ON u.id = c.owner_id
          JOIN "{tier_table}" t ON t.id = u.tier_id"""
    return sql, row_fields


def generation_requeue(*, message: Message) -> bool:
    """Give a claimed reply that produced no text back to the queue (``streaming -> queued``), for a worker
    whose engine died before its first token: the broker redelivers its task to a live worker, which claims it
    again. Returns whether it was still ``streaming``."""
    return bool(
        Message.objects.filter(pk=message.pk, status=Message.Status.STREAMING).update(
            status=Message.Status.QUEUED, updated_at=timezone.now()
        )
    )


def generation_branch(*, message: Message) -> tuple[str, list[dict[str, str]], list[int]]:
    """``(system_prompt, turns, turn_ids)`` preceding ``message`` on its own branch (its ancestors; other
    branches are never included), oldest first: ``turns`` as chat-template dicts and ``turn_ids`` the message
    id of each (same order, same length; what memory's recall excludes as already inside the window), from the
    claim's read of the branch (``message.claim_reads``) or, for a message not claimed by
    :func:`generation_start`, one read. Replies that ended with no text (failed, cancelled before any token,
    blocked) and user messages the content policy blocked are left out."""
    reads = getattr(message, "claim_reads", None)
    if reads is not None:
        branch = reads.branch
    else:
        branch = [(m.id, m.role, m.status, m.content) for m in branches.ancestors(message=message)]
    earlier = [
        (id_, role, content)
        for id_, role, status, content in branch
        if content
        and role in (Message.Role.USER, Message.Role.ASSISTANT)
        and status != Message.Status.BLOCKED
    ]
    turns = [{"role": role, "content": content} for _, role, content in earlier]
    return message.conversation.system_prompt, turns, [id_ for id_, _, _ in earlier]


#: :func:`generation_set_context`'s statement, fixed (lever 58): the ORM compiled the same ``UPDATE`` for every
#: reply, and PostgreSQL planned it for every reply, the last of a reply's statements that did either.
_SET_CONTEXT_SQL = (
    f'UPDATE "{Message._meta.db_table}" SET omitted_messages = %s, prompt_tokens = %s, updated_at = %s'
    " WHERE id = %s"
)


def generation_set_context(*, message: Message, omitted: int, prompt_tokens: int) -> None:
    """Record how many older turns the window left out and the prompt's size in tokens, on ``message`` and in
    its row, by one prepared statement (nothing is written, and nothing raised, for a reply deleted with its
    conversation meanwhile). Raises what the driver raises."""
    message.omitted_messages = omitted
    message.prompt_tokens = prompt_tokens
    message.updated_at = timezone.now()
    with prepared_cursor() as cursor:
        cursor.execute(_SET_CONTEXT_SQL, [omitted, prompt_tokens, message.updated_at, message.pk])


def generation_finish(
    *,
    message: Message,
    status: str,
    text: str,
    finish_reason: str = "",
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    ttft_ms: int | None = None,
    duration_ms: int | None = None,
    error: str = "",
    on_written: Callable[[], object] | None = None,
    attached=None,
) -> Message:
    """Write the reply's final state once, record usage for billing, and publish ``done`` after commit.
    Only a ``streaming`` or ``interrupted`` (reaped too early) reply is written; returns the stored message.
    ``on_written`` runs inside the transaction when the write happened (the reply runner stores the output
    moderation verdict of a block there, with its strike policy). ``attached``: an unsaved row of a model with
    one foreign key to ``Message`` (the runner's allowed or flagged output verdict, ``safety.services.
    verdict_row``), stored by the final write's own statement when the write happened, pointing at the reply
    (docs/overhead-levers.md, lever 54); not stored when the reply had already ended. A reply deleted with its
    conversation or account meanwhile is returned as this call would have stored it, its tokens charged to the
    owner's day when the owner remains (:func:`_charge_deleted`), and ``done`` still published.

    A completed reply's turn is indexed for memory, and the ``done`` frame carries the reply's citations. For
    a reply the worker claimed (``message.claim_reads``, :class:`ClaimReads`), what the claim read decides
    both without reading again: a memory switch that was off then (or memory off site-wide) indexes nothing,
    so a user who turns memory on while a reply streams has that one turn left out, never the other way
    round; a conversation with no ready file then was given no passages, so there are no citations to read
    (docs/overhead-levers.md, lever 36)."""
    final = {
        "status": status,
        "content": storable_text(text),
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "ttft_ms": ttft_ms,
        "duration_ms": duration_ms,
        "error": error,
        "updated_at": timezone.now(),
    }
    if prompt_tokens < 0 or completion_tokens < 0:
        raise ValueError("token counts must be non-negative")
    with transaction.atomic():
        updated, settled = _write_final(message, final, attached)
        if updated:
            # What was written is what is stored: no read back, and the conversation, owner and tier the claim
            # loaded stay cached on the instance (refresh_from_db drops them, and each was a read again).
            for name, value in final.items():
                setattr(message, name, value)
            if not settled:  # no reservation left (admitted outside a transaction): charge the day directly
                quota_charge_unreserved(
                    user=message.conversation.owner, tokens=prompt_tokens + completion_tokens
                )
        else:  # someone else ended it (a Stop, the reaper): the stored state is the truth
            try:
                message.refresh_from_db()
            except Message.DoesNotExist:
                # Deleted with its conversation while it streamed: the deletion released its reservation and
                # asked for the cancel that ended it here. The tokens generated are charged to the owner's
                # day, and `done` tells a client still following it (an API stream) that it ended.
                for name, value in final.items():
                    setattr(message, name, value)
                _charge_deleted(message, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
                broadcast.publish_on_commit(message.id, broadcast.frame_done(message=message))
                return message
        if updated and on_written is not None:
            on_written()
        # What the worker's claim read (lever 21) spares reads here (lever 36): memory that was off then
        # indexes nothing now, and a conversation that had no ready file then gave this reply no passages.
        claim = getattr(message, "claim_reads", None)
        remember = claim is None or (claim.memory_switches_on and settings.MEMORY_ENABLED)
        if updated and status == Message.Status.COMPLETED and remember:
            recall.turn_remember(message=message)  # indexed for memory; embedded after commit
        done = broadcast.frame_done(message=message)
        if claim is None or claim.has_documents:
            cited = citations_for_messages(message_ids=[message.id]).get(message.id)
            if cited:  # the passages of the conversation's files this reply was given (chips on the page)
                done["citations"] = cited
        broadcast.publish_on_commit(message.id, done)
        if updated and not message.conversation.stored:
            # An API completion without ``store: true`` (conversations/completions.py): the done frame above
            # carries its result; the usage record stays, its message link cleared.
            message.conversation.delete()
    return message


#: The reply's final ``UPDATE`` as the first ``WITH`` item of :func:`_final_statement`.
_FINAL_ITEM = """final AS (
    UPDATE {table}
       SET status = %(status)s, content = %(content)s, finish_reason = %(finish_reason)s,
           prompt_tokens = %(prompt_tokens)s, completion_tokens = %(completion_tokens)s, ttft_ms = %(ttft_ms)s,
           duration_ms = %(duration_ms)s, error = %(error)s, updated_at = %(updated_at)s
     WHERE id = %(message_id)s AND status = ANY(%(open)s)
 RETURNING id
)"""


@functools.cache
def _final_statement(attached_model=None) -> str:
    """The final write's statement; with ``attached_model``, a fourth ``WITH`` item inserts a row of it
    (named parameters ``attached_0`` ... in ``database.sql.insert_fields`` order, its key to ``Message`` the id
    the ``UPDATE`` returned) and the statement returns that row's primary key third."""
    items = [_FINAL_ITEM.format(table=Message._meta.db_table), usage_record_sql("final")]
    returned = "(SELECT count(*) FROM final), (SELECT count(*) FROM released)"
    if attached_model is not None:
        fields, key = insert_fields(attached_model), message_key(attached_model)
        columns = ", ".join(f'"{f.column}"' for f in fields)
        values = ", ".join("final.id" if f is key else f"%(attached_{n})s" for n, f in enumerate(fields))
        pk = f'"{attached_model._meta.pk.column}"'
        items.append(
            f'attached AS (\n    INSERT INTO "{attached_model._meta.db_table}" ({columns})\n'
            f"    SELECT {values} FROM final RETURNING {pk}\n)"
        )
        returned += f", (SELECT {pk} FROM attached)"
    items.append(settle_sql("(SELECT id FROM final)"))
    return "WITH " + ",\n".join(items) + f"\nSELECT {returned}"


def _write_final(message: Message, final: dict, attached=None) -> tuple[bool, bool]:
    """Store ``final`` (the fields :func:`generation_finish` writes) on ``message`` if it is still ``streaming``
    or ``interrupted``, and with it its usage record (when it used tokens) and its quota reservation's settle,
    in one prepared statement (three ``WITH`` items: the reply's ``UPDATE ... RETURNING``, the usage ``INSERT``
    reading it, ``billing.quota.settle_sql`` deleting the reservation of the id it returned). Returns ``(updated,
    settled)``: nothing but the ``UPDATE``'s check runs when the reply was already ended. It was three
    statements, two of them compiled by the ORM on every call (docs/overhead-levers.md, lever 52). Lock order
    as before: the reply's row, then the reservation, the user's quota row, the pool's. ``attached`` (see
    :func:`generation_finish`) is inserted by the same statement, and marked saved, when the reply was written
    (its own statement before lever 54)."""
    tokens = final["prompt_tokens"] + final["completion_tokens"]
    params = {
        **final,
        "message_id": message.pk,
        "open": [Message.Status.STREAMING, Message.Status.INTERRUPTED],
        "user_id": message.conversation.owner_id,
        "model_name": message.model_name,
        "now": final["updated_at"],
        "used_tokens": tokens,
    }
    model = None if attached is None else type(attached)
    if model is not None:
        key = message_key(model)
        named = [(f"attached_{n}", f) for n, f in enumerate(insert_fields(model)) if f is not key]
        params.update(
            zip((name for name, _ in named), insert_values(attached, [f for _, f in named]), strict=True)
        )
    updated, settled, *attached_pk = fetch_one(_final_statement(model), params)
    if model is not None and updated:
        setattr(attached, key.attname, message.pk)
        mark_saved(attached, pk=attached_pk[0])
    return bool(updated), bool(settled)


def _charge_deleted(message: Message, *, prompt_tokens: int, completion_tokens: int) -> None:
    """Charge the tokens a reply deleted while it streamed generated: a usage record with no message link
    (as one whose message was deleted later has) and the count on the owner's day, with no reservation left
    to settle (``billing.quota.quota_charge_unreserved``). Nothing when it generated nothing, or the account is gone too
    (its quota rows went with it)."""
    owner = message.conversation.owner
    if not (prompt_tokens or completion_tokens) or not get_user_model().objects.filter(pk=owner.pk).exists():
        return
    usage_record_create(
        user=owner,
        message=None,
        model_name=message.model_name,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )
    quota_charge_unreserved(user=owner, tokens=prompt_tokens + completion_tokens)
