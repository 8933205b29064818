"""What memory adds to a reply's context: the user's key facts and the chunks recalled for the question.

Called by context assembly (in ``conversations``) with the messages already inside the sliding window, so
only what fell OUT of the window, in this conversation or in the user's others, is recalled. Each recalled
chunk must reach ``MEMORY_MIN_SCORE`` cosine similarity, and facts plus chunks must fit ``budget_tokens``
(counted with the chat model's tokenizer, passed in as ``count_tokens``). The text is one system message
whose lines start with the markers below, so the model (and a reader of the prompt) can tell recalled
material from the conversation itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings

from memory import metrics
from memory.models import Chunk
from memory.query import question_vector
from memory.selectors import FoundChunk, chunks_search, memories_for_user, memory_enabled_for
from memory.store import Hit, SearchFilter, store_for
from observability.tracing import span

FACTS_MARKER = "[Memory: facts the user asked you to remember]"
RECALL_MARKER = "[Memory: recalled from the user's earlier messages; use only if relevant]"


@dataclass(frozen=True)
class MemoryContext:
    """``text``: the system message to inject ("" when nothing); ``hits``: the recalled chunks in rank order
    (to record with the reply); ``facts``: key facts included; ``tokens``: ``count_tokens(text)``."""

    text: str = ""
    hits: list[Hit] = field(default_factory=list)
    facts: int = 0
    tokens: int = 0


def memory_context(
    *,
    user_id: int,
    conversation_id: int,
    question: str,
    window_message_ids: Sequence[int],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    k: int | None = None,
    min_score: float | None = None,
    timeout_s: float | None = None,
    vector: np.ndarray | None = None,
    switches_on: bool | None = None,
) -> MemoryContext:
    """Key facts (newest first) then recalled chunks (best first), each added while the whole block fits
    ``budget_tokens``. Empty when memory is off for the account or conversation, or the budget is 0.
    The question's vector is the one prefetched for ``user_id`` and ``question`` when it was
    (``memory.query.question_prefetch``), else a round trip; ``vector``: the question's embedding when the
    caller already has it (documents retrieval fetched it first). ``switches_on``: the account's and the
    conversation's memory switches as the caller read them (a worker's claim,
    ``conversations.generation_worker.ClaimReads``); None: read here."""
    if switches_on is None:
        enabled = memory_enabled_for(user_id=user_id, conversation_id=conversation_id)
    else:
        enabled = settings.MEMORY_ENABLED and switches_on
    if budget_tokens <= 0 or not enabled:
        return MemoryContext()
    k = settings.MEMORY_TOP_K if k is None else k
    min_score = settings.MEMORY_MIN_SCORE if min_score is None else min_score
    timeout_s = settings.MEMORY_QUERY_TIMEOUT_S if timeout_s is None else timeout_s

    lines: list[str] = []
    used = 0

    def try_add(block: list[str]) -> bool:
        nonlocal used
        cost = count_tokens("\n".join(block)) + 1
        if used + cost > budget_tokens:
            return False
        lines.extend(block)
        used += cost
        return True

    facts = 0
    memories = memories_for_user(user_id=user_id)
    if memories and try_add([FACTS_MARKER]):
        for memory in memories:
            if not try_add([f"- {memory.text}"]):
                break
            facts += 1
        if not facts:
            lines.pop()  # the marker alone says nothing

    found = _recall(
        user_id=user_id,
        question=question,
        exclude=tuple(window_message_ids),
        k=k,
        min_score=min_score,
        timeout_s=timeout_s,
        vector=vector,
    )
    hits: list[Hit] = []
    if found and try_add([RECALL_MARKER]):
        for item in found:
            conv = item.chunk.conversation
            where = f' (from "{conv.title or f"Conversation {conv.pk}"}")' if conv else ""
            if not try_add([f"-{where} {item.chunk.text}"]):
                continue  # a shorter, less similar chunk may still fit
            hits.append(Hit(item.chunk.pk, item.score))
        if not hits:
            lines.pop()
    metrics.RECALL_HITS.observe(len(hits))
    text = "\n".join(lines)
    return MemoryContext(text=text, hits=hits, facts=facts, tokens=count_tokens(text) if text else 0)


def _recall(
    *,
    user_id: int,
    question: str,
    exclude: tuple[int, ...],
    k: int,
    min_score: float,
    timeout_s: float,
    vector: np.ndarray | None = None,
) -> list[FoundChunk]:
    if k <= 0 or not question.strip():
        return []
    if vector is None and not _anything_to_recall(user_id=user_id, exclude=exclude):
        # No embedded turn outside the window: recall could find nothing, so the reply never waits up to
        # ``timeout_s`` on the embeddings worker for a question vector it would not use.
        return []
    backend = store_for().name
    started = time.perf_counter()
    with span("memory.retrieval", backend=backend, k=k) as current:
        with span("memory.question_embedding"):
            if vector is None:
                vector = question_vector(user_id=user_id, text=question, timeout_s=timeout_s)
        if vector is None:
            return []
        with span("memory.vector_search", backend=backend):
            found = chunks_search(
                user_id=user_id,
                vector=vector,
                k=k,
                min_score=min_score,
                # Turns only: a file's passages are retrieved in its own conversation (documents.retrieval).
                flt=SearchFilter(exclude_message_ids=exclude, source_kinds=("turn",)),
            )
        current.set_attribute("memory.hits", len(found))
    metrics.RETRIEVAL_SECONDS.labels(backend).observe(time.perf_counter() - started)
    return found


def _anything_to_recall(*, user_id: int, exclude: tuple[int, ...]) -> bool:
    """Whether ``user_id`` has an embedded turn chunk outside ``exclude`` (message ids): one indexed EXISTS."""
    rows = Chunk.objects.filter(user_id=user_id, source_kind=Chunk.Source.TURN, embedding__isnull=False)
    if exclude:
        rows = rows.exclude(message_id__in=exclude)
    return rows.exists()
