"""What a conversation's files add to a reply's context: the passages most similar to the question, each
with a citation marker ``[n]``, and the record of which passages a reply was given (its citations).

Only the conversation's own documents are searched, and only the asking user's rows (the vector store
takes ``user_id`` on every search), so another user's passages can never be retrieved. Each passage must
reach ``DOCUMENTS_MIN_SCORE`` cosine similarity and the block must fit ``budget_tokens`` (counted with the
chat model's tokenizer). Retrieval-augmented generation as in Lewis et al., "Retrieval-Augmented Generation
for Knowledge-Intensive NLP Tasks" (2020); the numbered-source prompt as in Perplexity-style answer engines.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings
from django.db import IntegrityError

from documents.models import Citation, Document
from memory.models import Chunk
from memory.query import question_embed
from memory.selectors import chunks_search
from memory.store import SearchFilter, store_for
from observability.tracing import span

DOCUMENTS_MARKER = (
    "[Documents: passages from the files the user added to this chat. Answer from them when they are "
    "relevant and cite each passage you use by its number, like [1].]"
)


@dataclass(frozen=True)
class Cited:
    """One passage given to the model: its ``marker`` number, memory chunk id and similarity score."""

    marker: int
    chunk_id: int
    score: float


@dataclass(frozen=True)
class DocumentsContext:
    """``text``: the system message to inject ("" when nothing); ``cited``: its passages in marker order;
    ``tokens``: ``count_tokens(text)``."""

    text: str = ""
    cited: list[Cited] = field(default_factory=list)
    tokens: int = 0


def conversation_has_documents(*, conversation_id: int) -> bool:
    """Whether any file of the conversation is ready (no question is embedded for a chat without one)."""
    return Document.objects.filter(conversation_id=conversation_id, status=Document.Status.READY).exists()


def documents_context(
    *,
    user_id: int,
    conversation_id: int,
    question: str,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    vector: np.ndarray | None = None,
    k: int | None = None,
    min_score: float | None = None,
    timeout_s: float | None = None,
) -> DocumentsContext:
    """The top-``k`` passages of the conversation's files for ``question`` (``vector``: its embedding when
    the caller already has one), best first, as numbered lines under :data:`DOCUMENTS_MARKER`, while they
    fit ``budget_tokens``. Empty when the chat has no ready file, the budget is 0, or no embedding of the
    question came back in time (the reply goes on without)."""
    k = settings.DOCUMENTS_TOP_K if k is None else k
    min_score = settings.DOCUMENTS_MIN_SCORE if min_score is None else min_score
    if budget_tokens <= 0 or k <= 0 or not question.strip():
        return DocumentsContext()
    if not conversation_has_documents(conversation_id=conversation_id):
        return DocumentsContext()
    backend = store_for().name
    with span("documents.retrieval", backend=backend, k=k) as current:
        started = time.perf_counter()
        if vector is None:
            timeout_s = settings.MEMORY_QUERY_TIMEOUT_S if timeout_s is None else timeout_s
            with span("documents.question_embedding"):
                vector = question_embed(text=question, timeout_s=timeout_s)
        if vector is None:
            return DocumentsContext()
        with span("documents.vector_search", backend=backend):
            found = chunks_search(
                user_id=user_id,
                vector=vector,
                k=k,
                min_score=min_score,
                flt=SearchFilter(source_kinds=(Chunk.Source.DOCUMENT,), conversation_id=conversation_id),
            )
        current.set_attribute("documents.hits", len(found))
        current.set_attribute("documents.seconds", time.perf_counter() - started)
    if not found:
        return DocumentsContext()
    names = dict(Document.objects.filter(pk__in={f.chunk.source_id for f in found}).values_list("pk", "name"))
    lines = [DOCUMENTS_MARKER]
    used = count_tokens(DOCUMENTS_MARKER) + 1
    cited: list[Cited] = []
    for item in found:
        chunk = item.chunk
        page = chunk.meta.get("page") if isinstance(chunk.meta, dict) else None
        where = names.get(chunk.source_id, "a file") + (f", page {page}" if page else "")
        line = f"[{len(cited) + 1}] ({where}) {chunk.text}"
        cost = count_tokens(line) + 1
        if used + cost > budget_tokens:
            continue  # a shorter, less similar passage may still fit
        lines.append(line)
        used += cost
        cited.append(Cited(marker=len(cited) + 1, chunk_id=chunk.pk, score=item.score))
    if not cited:
        return DocumentsContext()
    text = "\n".join(lines)
    return DocumentsContext(text=text, cited=cited, tokens=count_tokens(text))


def citations_record(*, reply_id: int, cited: Sequence[Cited]) -> list[Citation]:
    """Remember which passages ``reply_id`` was given, by marker (its chips on the page). Records nothing, and
    returns [], for a reply deleted meanwhile (its conversation deleted while it was queued or streaming: the
    foreign key refuses the rows); any other refusal raises ``IntegrityError``. Django's foreign keys are deferred,
    so a refusal comes at the commit: called outside a transaction (the worker is), that of ``bulk_create``'s own."""
    rows = [Citation(message_id=reply_id, chunk_id=c.chunk_id, marker=c.marker, score=c.score) for c in cited]
    try:
        return Citation.objects.bulk_create(rows, ignore_conflicts=True)  # in a transaction of its own
    except IntegrityError:
        # The replies' model through the foreign key: documents sits below conversations and does not import it.
        replies = Citation._meta.get_field("message").related_model.objects
        if replies.filter(pk=reply_id).exists():
            raise
        return []


def documents_budget(*, prompt_budget_tokens: int) -> int:
    """Tokens the passages may take of a reply's prompt budget: ``DOCUMENTS_CONTEXT_TOKENS``, at most a third
    of the budget, so the newest turns keep room."""
    return max(0, min(settings.DOCUMENTS_CONTEXT_TOKENS, prompt_budget_tokens // 3))


def with_documents(system_prompt: str, context: DocumentsContext) -> str:
    """The system prompt with the passages block after it (the system prompt stays first)."""
    if not context.text:
        return system_prompt
    return f"{system_prompt}\n\n{context.text}" if system_prompt else context.text
