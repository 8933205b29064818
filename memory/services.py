"""Writes of memory: chunks (created here, embedded by the embeddings worker), deletes, key facts and the
memory switches. Keyword-only, ``<entity>_<verb>``.

How a source owns chunks (docs/memory.md): a conversation turn's chunks carry its conversation and reply
message, so deleting either cascades to them in PostgreSQL; any other owner (an uploaded document) names
itself as ``(source_kind, source_id)``, passes its conversation where it has one, and calls
:func:`chunks_delete_for_source` in its own delete service, in the same transaction.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence

import numpy as np
from django.db import transaction

from memory.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP_TOKENS, TextPiece, chunk_text
from memory.embedding import MODEL_NAME
from memory.models import AccountMemory, Chunk, ConversationMemory, Memory, Recall
from memory.selectors import memory_enabled_for
from memory.store import Hit, store_for

logger = logging.getLogger(__name__)

#: Chunk ids per ``memory.embed_chunks`` task: small enough that the worker's batcher can mix many tasks'
#: chunks into one model call, large enough that a long document is not thousands of tasks.
EMBED_TASK_CHUNKS = 32


def chunks_create(
    *,
    user_id: int,
    source_kind: str,
    source_id: int,
    pieces: Sequence[TextPiece],
    conversation_id: int | None = None,
    message_id: int | None = None,
    metas: Sequence[dict] | None = None,
    first_ordinal: int = 0,
    embed: bool = True,
) -> list[Chunk]:
    """Store ``pieces`` as chunks of one source (ordinals ``first_ordinal``, ``+1``, ...) and, once the
    surrounding transaction commits, queue them for embedding (``embed=False``: the caller embeds them).
    ``metas[i]`` is stored as piece i's ``meta``. Raises ``ValueError`` for an unknown ``source_kind``."""
    if source_kind not in Chunk.Source.values:
        raise ValueError(f"unknown chunk source kind {source_kind!r}")
    if metas is not None and len(metas) != len(pieces):
        raise ValueError("metas must have one dict per piece")
    chunks = Chunk.objects.bulk_create(
        [
            Chunk(
                user_id=user_id,
                source_kind=source_kind,
                source_id=source_id,
                ordinal=first_ordinal + i,
                conversation_id=conversation_id,
                message_id=message_id,
                text=piece.text,
                char_start=piece.char_start,
                char_end=piece.char_end,
                token_count=piece.tokens,
                meta=(metas[i] if metas is not None else {}),
            )
            for i, piece in enumerate(pieces)
        ]
    )
    if embed and chunks:
        chunks_embed_enqueue(chunk_ids=[c.pk for c in chunks])
    return chunks


def source_index(
    *,
    user_id: int,
    source_kind: str,
    source_id: int,
    text: str,
    conversation_id: int | None = None,
    message_id: int | None = None,
    meta: dict | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
    first_ordinal: int = 0,
) -> list[Chunk]:
    """Chunk ``text`` (:func:`memory.chunking.chunk_text`) and store it as :func:`chunks_create` does;
    ``meta`` is copied into every chunk. Returns the chunks ([] for blank text)."""
    pieces = chunk_text(text, max_tokens=max_tokens, overlap_tokens=overlap_tokens)
    return chunks_create(
        user_id=user_id,
        source_kind=source_kind,
        source_id=source_id,
        pieces=pieces,
        conversation_id=conversation_id,
        message_id=message_id,
        metas=[dict(meta or {}) for _ in pieces],
        first_ordinal=first_ordinal,
    )


def chunks_embed_enqueue(*, chunk_ids: Sequence[int]) -> None:
    """Send ``memory.embed_chunks`` tasks for these chunks after the current transaction commits."""
    from memory.tasks import embed_chunks

    ids = [int(i) for i in chunk_ids]

    def send() -> None:
        for start in range(0, len(ids), EMBED_TASK_CHUNKS):
            embed_chunks.delay(ids[start : start + EMBED_TASK_CHUNKS])

    transaction.on_commit(send)


def chunks_embed(*, chunk_ids: Sequence[int], encode: Callable[[list[str]], np.ndarray]) -> int:
    """Embed those of ``chunk_ids`` that still exist and have no vector, store the vectors (both
    backends), and return how many were embedded. Chunks deleted meanwhile are skipped."""
    rows = list(
        Chunk.objects.filter(pk__in=list(chunk_ids), embedding__isnull=True)
        .order_by("pk")
        .values_list("pk", "user_id", "text")
    )
    if not rows:
        return 0
    vectors = encode([text for _pk, _user, text in rows])
    store = store_for()
    with transaction.atomic():
        # Lock the rows that still exist: a chunk deleted since the read is not written back.
        alive = set(
            Chunk.objects.select_for_update()
            .filter(pk__in=[pk for pk, _u, _t in rows])
            .values_list("pk", flat=True)
        )
        store.add(rows=[(pk, user, vectors[i]) for i, (pk, user, _t) in enumerate(rows) if pk in alive])
        Chunk.objects.filter(pk__in=alive).update(embedding_model=MODEL_NAME)
    return len(alive)


def chunks_delete_for_source(*, source_kind: str, source_id: int, user_id: int | None = None) -> int:
    """Delete every chunk of one source (and, by cascade, its vectors and recalls); returns how many."""
    qs = Chunk.objects.filter(source_kind=source_kind, source_id=source_id)
    if user_id is not None:
        qs = qs.filter(user_id=user_id)
    deleted, _ = qs.delete()
    return deleted


def chunk_forget(*, user_id: int, chunk_id: int) -> None:
    """The user deletes one recalled chunk ("forget this"). Raises ``Chunk.DoesNotExist`` when it is not
    theirs (the same as when it does not exist)."""
    Chunk.objects.get(pk=chunk_id, user_id=user_id).delete()


def chunks_forget_all(*, user_id: int) -> int:
    """Delete all of a user's conversation memory (turn chunks); returns how many chunks went."""
    deleted, _ = Chunk.objects.filter(user_id=user_id, source_kind=Chunk.Source.TURN).delete()
    return deleted


def turn_index(
    *, user_id: int, conversation_id: int, reply_id: int, question: str, reply: str
) -> list[Chunk]:
    """Index one completed turn (the user's ``question`` and the ``reply`` message) for recall later, unless
    memory is off for this account or conversation. Called from the reply's completion path; the
    embedding itself is queued for after commit. Returns the chunks ([] when off or nothing to index)."""
    if not memory_enabled_for(user_id=user_id, conversation_id=conversation_id):
        return []
    text = f"User: {question.strip()}\nAssistant: {reply.strip()}"
    return source_index(
        user_id=user_id,
        source_kind=Chunk.Source.TURN,
        source_id=reply_id,
        text=text,
        conversation_id=conversation_id,
        message_id=reply_id,
    )


def turn_completed(*, user_id: int, conversation_id: int, reply_id: int, question: str, reply: str) -> None:
    """The completion path's one call: a "remember that ..." question becomes a key fact, and the turn is
    indexed (:func:`turn_index`). Runs in the caller's transaction inside a savepoint, so a failure here
    is logged and never loses the reply being written."""
    try:
        with transaction.atomic():
            memory_from_message(user_id=user_id, conversation_id=conversation_id, text=question)
            turn_index(
                user_id=user_id,
                conversation_id=conversation_id,
                reply_id=reply_id,
                question=question,
                reply=reply,
            )
    except Exception:  # noqa: BLE001 - memory is an extra; the reply's own write must stand
        logger.exception("could not index reply %s for memory", reply_id)


def recalls_record(*, reply_id: int, hits: Sequence[Hit]) -> list[Recall]:
    """Remember which chunks were recalled into ``reply_id``'s context (shown on the page)."""
    return Recall.objects.bulk_create(
        [Recall(reply_id=reply_id, chunk_id=h.chunk_id, score=h.score, rank=i) for i, h in enumerate(hits)],
        ignore_conflicts=True,
    )


# --- Key facts ("remember that ...") ---

_REMEMBER = re.compile(
    r"^\s*(?:please\s+)?remember\s+(?:that\s+)?(?P<fact>.+?)\s*$", re.IGNORECASE | re.DOTALL
)


class MemoryInvalid(ValueError):
    """A key fact that is empty or longer than ``Memory.MAX_CHARS``."""


def _clean(text: str) -> str:
    text = " ".join((text or "").split())
    if not text:
        raise MemoryInvalid("a memory cannot be empty")
    if len(text) > Memory.MAX_CHARS:
        raise MemoryInvalid(f"a memory is at most {Memory.MAX_CHARS} characters")
    return text


def memory_create(*, user_id: int, text: str) -> Memory:
    """Add a key fact. Raises :class:`MemoryInvalid`."""
    return Memory.objects.create(user_id=user_id, text=_clean(text))


def memory_update(*, user_id: int, memory_id: int, text: str) -> Memory:
    """Edit a key fact. Raises ``Memory.DoesNotExist`` when not the user's, :class:`MemoryInvalid`."""
    memory = Memory.objects.get(pk=memory_id, user_id=user_id)
    memory.text = _clean(text)
    memory.save(update_fields=["text", "updated_at"])
    return memory


def memory_delete(*, user_id: int, memory_id: int) -> None:
    """Delete a key fact. Raises ``Memory.DoesNotExist`` when not the user's."""
    Memory.objects.get(pk=memory_id, user_id=user_id).delete()


def memory_from_message(*, user_id: int, conversation_id: int | None, text: str) -> Memory | None:
    """Store "remember that <fact>" from a user's message as a key fact (when memory is on); None for any
    other message."""
    match = _REMEMBER.match(text or "")
    if not match or not memory_enabled_for(user_id=user_id, conversation_id=conversation_id):
        return None
    try:
        return memory_create(user_id=user_id, text=match.group("fact").rstrip(".!"))
    except MemoryInvalid:
        return None


# --- Switches ---


def account_memory_set(*, user_id: int, enabled: bool) -> None:
    """Turn memory on or off for an account (off: nothing indexed or recalled; stored chunks are kept
    until the user deletes them)."""
    AccountMemory.objects.update_or_create(user_id=user_id, defaults={"enabled": enabled})


def conversation_memory_set(*, user_id: int, conversation_id: int, enabled: bool) -> None:
    """Turn memory on or off for one conversation the caller has already checked belongs to ``user_id``.
    Off deletes the chunks of its turns, so it is never recalled elsewhere either."""
    with transaction.atomic():
        ConversationMemory.objects.update_or_create(
            conversation_id=conversation_id, defaults={"enabled": enabled}
        )
        if not enabled:
            Chunk.objects.filter(
                user_id=user_id, conversation_id=conversation_id, source_kind=Chunk.Source.TURN
            ).delete()
