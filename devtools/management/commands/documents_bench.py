"""``manage.py documents_bench``: parse + index time of a PDF (default 50 pages of ~2,400 characters of prose each), end to end
through ``documents.processing.document_process`` with the packaged all-MiniLM-L6-v2 run in this process (as
the embeddings worker runs it), against this checkout's PostgreSQL. Prints each stage's median [min-max]
over the rounds: text extraction (pypdf), chunking, embedding, and the whole processing including the
one-transaction write of chunks and vectors.

    HF_HUB_OFFLINE=1 .venv/bin/python manage.py documents_bench --pages 50 --rounds 3

Creates a throwaway user, conversation and documents and deletes them at the end.
"""

from __future__ import annotations

import statistics
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s [{min(values):.2f}-{max(values):.2f}]"


def make_text(page: int, chars: int) -> str:
    """Prose-like text: varied sentences so chunks differ (no repeats the tokenizer could shortcut)."""
    words = (
        "the harbour ferry leaves early each morning while merchants open stalls along the quay and "
        "travellers compare timetables before crossing to the islands where fishermen mend nets"
    ).split()
    out, i = [], page * 7919
    while sum(len(w) + 1 for w in out) < chars:
        out.append(words[i % len(words)] + (f" {i % 97}." if i % 13 == 0 else ""))
        i = i * 31 + 17
    return f"Page {page}. " + " ".join(out)


class Command(BaseCommand):
    help = "Parse + index time of a generated PDF through documents.processing (median [min-max])."

    def add_arguments(self, parser):
        parser.add_argument("--pages", type=int, default=50)
        parser.add_argument("--chars-per-page", type=int, default=2400)
        parser.add_argument("--rounds", type=int, default=3)

    def handle(self, *args, pages: int, chars_per_page: int, rounds: int, **options):
        from conversations.services import conversation_create
        from devtools.document_files import make_pdf
        from documents import parsing
        from documents.processing import document_process, pieces_of
        from documents.services import document_add, documents_limits
        from memory.embedding import Embedder

        settings.DOCUMENTS_MAX_PAGES = max(settings.DOCUMENTS_MAX_PAGES, pages)
        pdf = make_pdf([make_text(p, chars_per_page) for p in range(1, pages + 1)])
        self.stdout.write(f"PDF: {pages} pages, {len(pdf) / 1024:.0f} KiB; loading the embedding model…")
        embedder = Embedder(num_threads=settings.EMBEDDINGS_NUM_THREADS or None)
        embedder.encode(["warm up"])
        user = get_user_model().objects.create_user(username=f"bench-{time.time_ns()}", password="x")
        conversation = conversation_create(owner=user, title="documents bench")
        extract_s, chunk_s, embed_s, total_s, chunks = [], [], [], [], 0
        try:
            for round_ in range(rounds):
                t0 = time.perf_counter()
                sections = parsing.extract(pdf, kind="pdf", limits=documents_limits())
                t1 = time.perf_counter()
                pieces, _ = pieces_of(sections)
                t2 = time.perf_counter()
                embedder.encode([p.text for p in pieces])
                t3 = time.perf_counter()
                extract_s.append(t1 - t0)
                chunk_s.append(t2 - t1)
                embed_s.append(t3 - t2)
                chunks = len(pieces)
                document = document_add(
                    user=user, conversation=conversation, name=f"bench-{round_}.pdf", data=pdf
                )
                t4 = time.perf_counter()
                status = document_process(document_id=document.id, encode=embedder.encode)
                total_s.append(time.perf_counter() - t4)
                if status != "ready":
                    raise RuntimeError(f"the document ended {status}")
                self.stdout.write(f"round {round_ + 1}: total {total_s[-1]:.2f} s")
        finally:
            user.delete()  # its documents, chunks and vectors go with it
        self.stdout.write(f"{pages} pages -> {chunks} chunks, {rounds} rounds, median [min-max]:")
        self.stdout.write(f"  extract (pypdf)        {_fmt(extract_s)}")
        self.stdout.write(f"  chunk (tokenizer)      {_fmt(chunk_s)}")
        self.stdout.write(f"  embed (MiniLM, 1 proc) {_fmt(embed_s)}")
        self.stdout.write(
            f"  document_process total {_fmt(total_s)}  (read + extract + chunk + embed + write)"
        )
