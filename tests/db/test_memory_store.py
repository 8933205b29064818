"""The vector store: both backends behind one table of tests.

``exact`` runs on the suite's own PostgreSQL 15 (no extension); ``pgvector`` on a PostgreSQL with the
extension (scripts/pgvector_server.py, TEST_PGVECTOR_SOCKET_DIR). Vectors here are random unit vectors:
the store is tested on its own, the model in test_memory_embedding.py and test_memory_recall.py.
"""

import numpy as np
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from conversations.models import Conversation, Message
from memory.models import Chunk
from memory.store import SearchFilter, detect

ALIASES = ["default"] + (["pgvector"] if "pgvector" in settings.DATABASES else [])
pytestmark = pytest.mark.django_db(databases=ALIASES)

NO_PGVECTOR = (
    "no PostgreSQL with the vector extension: run scripts/pgvector_server.py and set "
    "TEST_PGVECTOR_SOCKET_DIR to the directory it prints (scripts/test.sh does both)"
)


@pytest.fixture(params=["exact", "pgvector"])
def store(request):
    alias = {"exact": "default", "pgvector": "pgvector"}[request.param]
    if alias not in settings.DATABASES:
        pytest.skip(NO_PGVECTOR)
    found = detect(alias)
    assert found.name == request.param
    return found


def unit(rng, n=1):
    v = rng.standard_normal((n, 384)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def make_user(alias, name):
    from billing.services import tiers_ensure

    tiers_ensure()
    return get_user_model().objects.db_manager(alias).create_user(username=name, password="pw-Secret-123")


def add_chunks(store, user, vectors, *, conversation=None, message=None, kind="turn", source_id=1):
    chunks = Chunk.objects.using(store.using).bulk_create(
        [
            Chunk(
                user=user,
                source_kind=kind,
                source_id=source_id,
                ordinal=i,
                conversation=conversation,
                message=message,
                text=f"chunk {i}",
            )
            for i in range(len(vectors))
        ]
    )
    store.add(rows=[(c.pk, user.pk, vectors[i]) for i, c in enumerate(chunks)])
    return chunks


def test_search_finds_the_nearest_of_the_users_own_chunks_best_first(store):
    rng = np.random.default_rng(1)
    alice, bob = make_user(store.using, "alice"), make_user(store.using, "bob")
    alice_vectors = unit(rng, 50)
    alice_chunks = add_chunks(store, alice, alice_vectors)
    query = alice_vectors[7] + 0.05 * unit(rng)[0]
    query /= np.linalg.norm(query)
    # Bob holds the query itself: the closest vector in the table, and never alice's result.
    bob_chunks = add_chunks(store, bob, query[None, :])

    hits = store.search(user_id=alice.pk, vector=query, k=5)

    assert [h.chunk_id for h in hits][0] == alice_chunks[7].pk
    assert hits[0].score > 0.99
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len(hits) == 5
    assert bob_chunks[0].pk not in {h.chunk_id for h in hits}
    assert [h.chunk_id for h in store.search(user_id=bob.pk, vector=query, k=5)] == [bob_chunks[0].pk]


def test_min_score_drops_chunks_below_the_threshold(store):
    rng = np.random.default_rng(2)
    alice = make_user(store.using, "alice")
    vectors = unit(rng, 20)
    chunks = add_chunks(store, alice, vectors)

    hits = store.search(user_id=alice.pk, vector=vectors[3], k=10, min_score=0.5)

    # Random 384-d unit vectors are nearly orthogonal (|cos| < 0.3): only the chunk itself passes.
    assert [h.chunk_id for h in hits] == [chunks[3].pk]


def test_filters_leave_out_window_messages_and_keep_one_source(store):
    rng = np.random.default_rng(3)
    alice = make_user(store.using, "alice")
    conv = Conversation.objects.using(store.using).create(owner=alice, title="trip")
    in_window = Message.objects.using(store.using).create(conversation=conv, role="assistant", content="x")
    older = Message.objects.using(store.using).create(conversation=conv, role="assistant", content="y")
    v = unit(rng, 3)
    window_chunk = add_chunks(
        store, alice, v[:1], conversation=conv, message=in_window, source_id=in_window.pk
    )[0]
    older_chunk = add_chunks(store, alice, v[1:2], conversation=conv, message=older, source_id=older.pk)[0]
    doc_chunk = add_chunks(store, alice, v[2:], kind="document", source_id=99)[0]
    query = (v[0] + v[1] + v[2]) / np.linalg.norm(v[0] + v[1] + v[2])

    outside = store.search(
        user_id=alice.pk, vector=query, k=5, flt=SearchFilter(exclude_message_ids=(in_window.pk,))
    )
    only_doc = store.search(user_id=alice.pk, vector=query, k=5, flt=SearchFilter(source=("document", 99)))
    only_turns = store.search(user_id=alice.pk, vector=query, k=5, flt=SearchFilter(source_kinds=("turn",)))

    assert {h.chunk_id for h in outside} == {older_chunk.pk, doc_chunk.pk}
    assert [h.chunk_id for h in only_doc] == [doc_chunk.pk]
    assert {h.chunk_id for h in only_turns} == {window_chunk.pk, older_chunk.pk}


def test_deleting_a_chunk_its_conversation_or_its_user_deletes_the_vectors(store):
    rng = np.random.default_rng(4)
    alice, bob = make_user(store.using, "alice"), make_user(store.using, "bob")
    conv = Conversation.objects.using(store.using).create(owner=alice)
    chunks = add_chunks(store, alice, unit(rng, 3), conversation=conv)
    add_chunks(store, alice, unit(rng, 2), kind="document", source_id=5)
    add_chunks(store, bob, unit(rng, 4))
    assert store.size(user_id=alice.pk) == 5

    Chunk.objects.using(store.using).filter(pk=chunks[0].pk).delete()
    assert store.size(user_id=alice.pk) == 4
    conv.delete()
    assert store.size(user_id=alice.pk) == 2
    alice_id = alice.pk
    alice.delete()

    assert store.size(user_id=alice_id) == 0
    assert store.size(user_id=bob.pk) == 4
    assert not Chunk.objects.using(store.using).filter(user_id=alice_id).exists()


def test_stored_vectors_are_float16_bytes_in_the_chunk_row(store):
    rng = np.random.default_rng(5)
    alice = make_user(store.using, "alice")
    vector = unit(rng)[0]
    chunk = add_chunks(store, alice, vector[None, :])[0]

    stored = bytes(Chunk.objects.using(store.using).get(pk=chunk.pk).embedding)

    assert len(stored) == 384 * 2
    assert np.allclose(np.frombuffer(stored, dtype="<f2"), vector, atol=1e-3)


def test_pgvector_is_refused_at_start_up_where_the_database_lacks_it(settings):
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'")
        has_extension = cursor.fetchone()[0]
    if has_extension:
        pytest.skip("this suite's own PostgreSQL has the vector extension")
    settings.MEMORY_VECTOR_BACKEND = "pgvector"
    with pytest.raises(ImproperlyConfigured, match="memory_store --install"):
        detect("default")
    settings.MEMORY_VECTOR_BACKEND = "auto"
    assert detect("default").name == "exact"


def test_searches_follow_chunks_added_embedded_late_and_deleted_in_between(store):
    rng = np.random.default_rng(6)
    alice = make_user(store.using, "alice")
    v = unit(rng, 8)
    add_chunks(store, alice, v[:5])
    assert len(store.search(user_id=alice.pk, vector=v[0], k=10)) == 5

    late = Chunk.objects.using(store.using).create(user=alice, source_kind="turn", source_id=9, text="late")
    newer = add_chunks(store, alice, v[6:7])[0]
    assert store.search(user_id=alice.pk, vector=v[6], k=1)[0].chunk_id == newer.pk
    store.add(rows=[(late.pk, alice.pk, v[5])])  # embedded after a newer chunk
    assert store.search(user_id=alice.pk, vector=v[5], k=1)[0].chunk_id == late.pk

    Chunk.objects.using(store.using).filter(pk=newer.pk).delete()
    assert newer.pk not in {h.chunk_id for h in store.search(user_id=alice.pk, vector=v[6], k=10)}
    assert len(store.search(user_id=alice.pk, vector=v[0], k=10)) == 6
