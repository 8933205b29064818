"""``python -m devtools.memory_bench quality``: recall@5 of memory's retrieval on the needle set
(``devtools.memory_needles``: facts told once, asked for later in other words, and unrelated questions that
must recall nothing above ``MEMORY_MIN_SCORE``) and on a labelled set built from CPython's Language Reference
topics. Indexed through the product's own chunking, embedding and store, on the database of DATABASE_URL."""

from __future__ import annotations

import sys

from devtools.memory_bench import bench_user, setup_database


def labelled_set() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """CPython's Language Reference topics (``pydoc_data.topics``, shipped with Python): the query is a
    topic's heading, the relevant passages are the chunks of that topic's text without the heading.
    Returns (documents [(topic, text)], queries [(topic, heading)])."""
    import re
    from pydoc_data.topics import topics

    docs, queries = [], []
    for name, text in sorted(topics.items()):
        lines = text.strip().splitlines()
        if len(lines) < 3 or not re.fullmatch(r"[*=\-]+", lines[1].strip()):
            continue
        heading, body = lines[0].strip(), "\n".join(lines[2:]).strip()
        if len(body) < 200:
            continue
        docs.append((name, body))
        queries.append((name, heading))
    return docs, queries


def bench_quality(args) -> None:
    """Index both sets for two fresh users and print recall@5 (hits/queries) for each, and the needle set's
    false recalls. ``args`` is the parsed command line (unused: the sets are fixed)."""
    setup_database()
    from devtools.memory_needles import FILLER, NEEDLES, UNRELATED
    from memory.chunking import chunk_text
    from memory.embedding import Embedder
    from memory.selectors import chunks_search
    from memory.services import chunks_create, chunks_embed
    from memory.store import SearchFilter, store_for

    embedder = Embedder()
    store = store_for()
    user = bench_user("membench-quality")

    def index(source_id: int, text: str) -> None:
        chunks = chunks_create(
            user_id=user.pk, source_kind="document", source_id=source_id, pieces=chunk_text(text), embed=False
        )
        chunks_embed(chunk_ids=[c.pk for c in chunks], encode=embedder.encode)

    for i, (_t, q, a) in enumerate(FILLER):
        index(1000 + i, f"User: {q}\nAssistant: {a}")
    for i, (_t, q, a, _later) in enumerate(NEEDLES):
        index(i, f"User: {q}\nAssistant: {a}")
    from django.conf import settings

    hits = 0
    for i, (*_x, later) in enumerate(NEEDLES):
        found = chunks_search(user_id=user.pk, vector=embedder.encode([later])[0], k=5)
        hits += any(f.chunk.source_id == i for f in found)
    false = sum(
        bool(chunks_search(user_id=user.pk, vector=v, k=5, min_score=settings.MEMORY_MIN_SCORE))
        for v in embedder.encode(UNRELATED)
    )
    print(f"{store.name} needle set: recall@5 {hits}/{len(NEEDLES)} = {hits / len(NEEDLES):.2f}; "
          f"unrelated questions with a recall above {settings.MEMORY_MIN_SCORE}: {false}/{len(UNRELATED)}")  # fmt: skip

    user = bench_user("membench-labelled")
    docs, queries = labelled_set()
    for i, (_name, body) in enumerate(docs):
        index(i, body)
    vectors = embedder.encode([h for _n, h in queries])
    hits = 0
    for i, v in enumerate(vectors):
        found = chunks_search(user_id=user.pk, vector=v, k=5, flt=SearchFilter(source_kinds=("document",)))
        hits += any(f.chunk.source_id == i for f in found)
    chunks = store.size(user_id=user.pk)
    print(
        f"{store.name} labelled set (CPython {sys.version.split()[0]} Language Reference topics, "
        f"pydoc_data.topics: {len(queries)} heading queries over {chunks} chunks of {len(docs)} topics): "
        f"recall@5 {hits}/{len(queries)} = {hits / len(queries):.2f}"
    )
