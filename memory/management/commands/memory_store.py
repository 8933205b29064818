"""``manage.py memory_store``: the vector store's state, and its upkeep.

* (no option) prints the backend, vectors held and chunks awaiting embedding;
* ``--install``: create pgvector's table and HNSW index (where the server offers the extension) and index
  the vectors already stored, then use it;
* ``--embed-pending``: queue every chunk that has no vector yet (after the embeddings workers were down).
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from memory.selectors import chunks_pending, store_status
from memory.services import chunks_embed_enqueue
from memory.store import pgvector, store_reset


class Command(BaseCommand):
    help = "Show the vector store; --install pgvector; --embed-pending re-queues unembedded chunks."

    def add_arguments(self, parser):
        parser.add_argument("--install", action="store_true", help="create the pgvector table and index")
        parser.add_argument("--embed-pending", action="store_true", help="queue chunks that have no vector")

    def handle(self, *args, install=False, embed_pending=False, **options):
        if install:
            self.install()
        if embed_pending:
            self.embed_pending()
        self.show()

    def install(self) -> None:
        if not pgvector.install(connection):
            raise CommandError(
                "this PostgreSQL server has no usable 'vector' extension; the exact store stays"
            )
        store_reset()
        self.stdout.write("pgvector installed")

    def embed_pending(self) -> int:
        ids = chunks_pending()
        chunks_embed_enqueue(chunk_ids=ids)  # outside a transaction: sent at once
        self.stdout.write(f"queued {len(ids)} chunks for embedding")
        return len(ids)

    def show(self) -> dict:
        status = store_status()
        self.stdout.write(
            f"backend {status['backend']}  vectors {status['vectors']}  pending {status['pending']}"
        )
        return status
