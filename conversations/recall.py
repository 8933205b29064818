"""Memory in a reply's life: recall into the context before prefill, indexing after the reply completes,
and what the page shows of it. The retrieval itself is memory's (``memory.recall``, ``memory.services``);
this module only knows which messages a reply's window holds and where a reply's turn begins.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from conversations.context import AssembledContext, ContextTooLong, assemble_context
from conversations.models import Message
from documents.models import Document
from memory import query as memory_query
from memory import services as memory_services
from memory.models import AccountMemory, Chunk, ConversationMemory
from memory.recall import memory_context
from memory.selectors import recalls_for_replies

logger = logging.getLogger(__name__)


def context_with_memory(
    *,
    message: Message,
    tier,
    system_prompt: str,
    turns: list[dict[str, str]],
    turn_ids: list[int],
    window: AssembledContext,
    budget_tokens: int,
    tokenize: Callable[[list[dict[str, str]]], list[int]],
    count_tokens: Callable[[str], int],
    vector=None,
) -> AssembledContext:
    """``window`` (the context assembled without memory) with the user's key facts and the chunks recalled
    for the newest turn added to the system message, the window fitted again around it; the recalled
    chunks are recorded for the page. ``turn_ids``: the message id of each of ``turns``
    (``generation_branch``); those inside the window are not recalled. Returns ``window`` unchanged when
    memory adds nothing, is off, or fails (a reply never fails for memory)."""
    conversation = message.conversation
    if not conversation.stored or tier.memory_budget_tokens <= 0 or not turns:
        return window
    try:
        memory = memory_context(
            user_id=conversation.owner_id,
            conversation_id=conversation.id,
            question=turns[-1]["content"],
            window_message_ids=turn_ids[window.omitted :],
            budget_tokens=tier.memory_budget_tokens,
            count_tokens=count_tokens,
            vector=vector,  # the question's embedding when documents retrieval already fetched it
            # The memory switches as the worker's claim read them (generation_start; None: read them).
            switches_on=getattr(getattr(message, "claim_reads", None), "memory_switches_on", None),
        )
        if not memory.text:
            return window
        head = f"{system_prompt}\n\n{memory.text}" if system_prompt else memory.text
        # The recalled chunks were outside the first window; the new window is a suffix of it, so they
        # still are.
        with_memory = assemble_context(
            system_prompt=head, history=turns, budget_tokens=budget_tokens, tokenize=tokenize
        )
        memory_services.recalls_record(reply_id=message.id, hits=memory.hits)
        return with_memory
    except ContextTooLong:
        return window
    except Exception:  # noqa: BLE001 - recall is an extra: the reply goes on with the plain window
        logger.exception("memory recall failed for reply %s", message.id)
        return window


def question_prefetch(
    *, user, conversation_id: int | None, question: str, at_once: bool = False, wanted: bool | None = None
) -> bool:
    """Have the question of ``user``'s coming reply in ``conversation_id`` (None: a new conversation)
    embedded already, so recall and documents retrieval cost no round trip before prefill
    (``memory.query.question_prefetch``): ``at_once`` (a page ``send``, before its transaction: the embedding
    then overlaps admission and storage too) or after the current transaction commits. Skipped where nothing
    would read the vector: a tier without memory, an empty question, or a conversation where neither recall
    nor a file's passages can use it (:func:`question_vector_wanted`, one round trip, or ``wanted`` where the
    caller read that already: an API request's key read has it for a new conversation, lever 40; for a page's
    new conversation the admission warmer has usually read it, :func:`new_conversation_wanted_cached`, lever
    46). Returns whether it was asked for."""
    if user.tier.memory_budget_tokens <= 0 or not question.strip():
        return False
    if wanted is None and conversation_id is None:
        wanted = new_conversation_wanted_cached(user.pk)
    if wanted is None:
        wanted = question_vector_wanted(user_id=user.pk, conversation_id=conversation_id)
    if not wanted:
        return False
    memory_query.question_prefetch(user_id=user.pk, text=question, at_once=at_once)
    return True


def _memory_on_sql(user_sql: str) -> str:
    """SQL that is true when the user whose id is ``user_sql`` (a placeholder or a column) has an embedded turn
    to recall and has not switched memory off for the account (the conversation's own switch is the
    caller's)."""
    return (
        f"EXISTS (SELECT 1 FROM {Chunk._meta.db_table} WHERE user_id = {user_sql}"
        f" AND source_kind = '{Chunk.Source.TURN.value}' AND embedding IS NOT NULL)"
        f" AND NOT EXISTS (SELECT 1 FROM {AccountMemory._meta.db_table} WHERE user_id = {user_sql} AND NOT enabled)"
    )


def new_conversation_vector_wanted_sql(user_sql: str) -> str:
    """:func:`question_vector_wanted` for a new conversation (no files, no conversation switch) as one SQL
    expression over the user id ``user_sql`` (a column of the caller's statement, e.g. ``'u."id"'``), for a
    statement that reads the user anyway: the API's key read (``api.selectors``, lever 40). The caller leaves it
    out while ``MEMORY_ENABLED`` is off."""
    return f"({_memory_on_sql(user_sql)})"


# user id -> (monotonic time read, whether a reply in a new conversation would read its question's vector)
_new_conversation_wanted: dict[int, tuple[float, bool]] = {}


def new_conversation_wanted_warm(*, user_ids) -> None:
    """Read :func:`question_vector_wanted` for a new conversation of each of ``user_ids`` whose figure is older
    than half ``ADMISSION_LOAD_CACHE_S``, all in one statement; called by the admission warmer's pass for the
    users of this process's open sockets (``conversations.load_warmer``), so that a page ``send`` that starts a
    conversation answers it from memory (:func:`new_conversation_wanted_cached`) instead of its own round trip
    before the transaction: lever 40 did the same for the API through its key read (docs/overhead-levers.md,
    lever 46). Nothing to read while ``MEMORY_ENABLED`` is off (files need a conversation)."""
    if not settings.MEMORY_ENABLED:
        return
    now = time.monotonic()
    refresh_after = settings.ADMISSION_LOAD_CACHE_S / 2
    stale = [
        uid
        for uid in user_ids
        if now - _new_conversation_wanted.get(uid, (float("-inf"), False))[0] >= refresh_after
    ]
    if not stale:
        return
    table = get_user_model()._meta.db_table
    sql = f'SELECT u.id, {new_conversation_vector_wanted_sql("u.id")} FROM "{table}" u WHERE u.id = ANY(%s)'
    with connection.cursor() as cursor:
        cursor.execute(sql, [stale])
        rows = cursor.fetchall()
    for user_id, wanted in rows:
        _new_conversation_wanted[user_id] = (now, bool(wanted))


def new_conversation_wanted_cached(user_id: int) -> bool | None:
    """What :func:`new_conversation_wanted_warm` read for ``user_id`` less than ``ADMISSION_LOAD_CACHE_S`` ago
    (the admission figures' staleness bound), else None. A stale answer costs no correctness, only the prefetch:
    a False that turned True (a first embedded turn, memory switched on) leaves the vector to recall, which
    embeds the question itself before the prefill; a True that turned False asks for a vector nobody reads."""
    read = _new_conversation_wanted.get(user_id)
    if read is None or time.monotonic() - read[0] >= settings.ADMISSION_LOAD_CACHE_S:
        return None
    return read[1]


def question_vector_wanted(*, user_id: int, conversation_id: int | None) -> bool:
    """Whether a reply of ``user_id`` in ``conversation_id`` (None: a new one) will read its question's
    vector: the conversation has a ready file (documents retrieval), or memory is on (site, account,
    conversation) and the user has an embedded turn to recall (``memory.recall``). One SQL statement,
    written out: the ORM took ~4 ms of the send's CPU to compile the same EXISTS tree (cProfile of
    ``reply_request``, Zen 4). It answers in one statement what three reads answer where the vector is used:
    ``documents.retrieval.conversation_has_documents``, ``memory.selectors.memory_enabled_for`` and
    ``memory.recall._anything_to_recall``; a change to those switches belongs here too (and in
    :func:`new_conversation_vector_wanted_sql`, which shares the account part). Turns inside the reply's
    window still count here (recall excludes them later), so this errs towards embedding."""
    terms, params = [], []
    if conversation_id is not None:
        terms.append(
            f"EXISTS (SELECT 1 FROM {Document._meta.db_table} WHERE conversation_id = %s AND status = %s)"
        )
        params += [conversation_id, Document.Status.READY]
    if settings.MEMORY_ENABLED:
        memory = "(" + _memory_on_sql("%s")
        params += [user_id, user_id]
        if conversation_id is not None:
            memory += (
                f" AND NOT EXISTS (SELECT 1 FROM {ConversationMemory._meta.db_table}"
                " WHERE conversation_id = %s AND NOT enabled)"
            )
            params.append(conversation_id)
        terms.append(memory + ")")
    if not terms:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + " OR ".join(terms), params)
        return bool(cursor.fetchone()[0])


def turn_remember(*, message: Message) -> None:
    """After ``message`` (a reply) completed, inside its final write's transaction: index its turn and
    keep a "remember that ..." question as a key fact (``memory.services.turn_completed``)."""
    conversation = message.conversation
    parent = message.parent
    if not conversation.stored or not message.content or parent is None or parent.role != Message.Role.USER:
        return
    memory_services.turn_completed(
        user_id=conversation.owner_id,
        conversation_id=conversation.id,
        reply_id=message.id,
        question=parent.content,
        reply=message.content,
    )


def attach_recalls(*, user, messages: Iterable[Message]) -> None:
    """Set ``m.recalled`` (list of ``memory.selectors.RecalledView``) on each reply in ``messages``, for the
    chat page's "recalled from" notes."""
    messages = list(messages)
    recalled = recalls_for_replies(
        user_id=user.pk, reply_ids=[m.id for m in messages if m.role == Message.Role.ASSISTANT]
    )
    for m in messages:
        m.recalled = recalled.get(m.id, [])
