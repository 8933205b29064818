"""Splitting text into chunks that the embedding model reads whole.

Windows of ``max_tokens`` word pieces of the embedding model's own tokenizer, each starting
``max_tokens - overlap_tokens`` pieces after the previous one, so a fact that straddles a boundary is whole
in at least one chunk (the overlapping-window chunking of LangChain's ``TokenTextSplitter`` and LlamaIndex's
``TokenTextSplitter``). Chunk text is sliced from the original string by the tokenizer's character offsets:
nothing is normalised or lost. all-MiniLM-L6-v2 was trained on 128-piece inputs, hence the default.
"""

from __future__ import annotations

from dataclasses import dataclass

from memory.embedding import tokenizer

DEFAULT_MAX_TOKENS = 128
DEFAULT_OVERLAP_TOKENS = 24


@dataclass(frozen=True)
class TextPiece:
    """One chunk: ``text`` is ``source[char_start:char_end]``; ``tokens``: its word pieces (model tokens)."""

    text: str
    char_start: int
    char_end: int
    tokens: int


def chunk_text(
    text: str, *, max_tokens: int = DEFAULT_MAX_TOKENS, overlap_tokens: int = DEFAULT_OVERLAP_TOKENS
) -> list[TextPiece]:
    """Overlapping windows over ``text``; ``[]`` for blank text. Raises ``ValueError`` unless
    ``0 <= overlap_tokens < max_tokens``."""
    if not 0 <= overlap_tokens < max_tokens:
        raise ValueError("need 0 <= overlap_tokens < max_tokens")
    if not text or not text.strip():
        return []
    offsets = tokenizer().encode(text, add_special_tokens=False).offsets
    if not offsets:
        return []
    pieces: list[TextPiece] = []
    step = max_tokens - overlap_tokens
    start = 0
    while True:
        end = min(start + max_tokens, len(offsets))
        char_start = 0 if start == 0 else offsets[start][0]
        char_end = len(text) if end == len(offsets) else offsets[end - 1][1]
        piece = text[char_start:char_end].strip()
        if piece:
            pieces.append(TextPiece(piece, char_start, char_end, end - start))
        if end == len(offsets):
            return pieces
        start += step
