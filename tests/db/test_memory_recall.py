"""Memory across conversations at the service level, with the real packaged embedding model: the needle
test, isolation between users, the switches, cascading deletes and key facts."""

import numpy as np
import pytest
from django.conf import settings

from accounts.services import account_delete
from conversations.models import Conversation, Message
from conversations.services import conversation_delete
from devtools.memory_needles import FILLER, NEEDLES, UNRELATED
from memory import selectors, services
from memory.models import Chunk, Memory
from memory.store import SearchFilter, store_for

pytestmark = pytest.mark.django_db


def plant_turn(user, title, question, reply, *, embedder=None, conversation=None):
    """A finished turn in a conversation of ``user``, indexed (and embedded when ``embedder`` is given)."""
    conv = conversation or Conversation.objects.create(owner=user, title=title)
    asked = Message.objects.create(conversation=conv, role="user", content=question)
    answer = Message.objects.create(conversation=conv, role="assistant", content=reply, parent=asked)
    chunks = services.turn_index(
        user_id=user.pk, conversation_id=conv.pk, reply_id=answer.pk, question=question, reply=reply
    )
    if embedder is not None:
        services.chunks_embed(chunk_ids=[c.pk for c in chunks], encode=embedder.encode)
    return conv, answer, chunks


@pytest.fixture
def alice_history(alice, embedder):
    """Alice's old conversations: every needle in its own conversation, among the filler."""
    needles, chunk_ids = {}, []
    for title, question, reply in FILLER:
        chunk_ids += [c.pk for c in plant_turn(alice, title, question, reply)[2]]
    for title, question, reply, _later in NEEDLES:
        conv, answer, chunks = plant_turn(alice, title, question, reply)
        needles[title] = (conv, answer)
        chunk_ids += [c.pk for c in chunks]
    services.chunks_embed(
        chunk_ids=chunk_ids, encode=embedder.encode
    )  # one model call, as the worker batches
    return needles


def recall(user, embedder, question, **flt):
    vector = embedder.encode([question])[0]
    return selectors.chunks_search(
        user_id=user.pk, vector=vector, k=5, min_score=settings.MEMORY_MIN_SCORE, flt=SearchFilter(**flt)
    )


def test_facts_planted_in_old_conversations_are_recalled_later(alice, embedder, alice_history):
    for title, _question, _reply, later in NEEDLES:
        conv, answer = alice_history[title]
        found = recall(alice, embedder, later)
        assert found, f"nothing recalled for {later!r}"
        assert found[0].chunk.message_id == answer.pk, f"{later!r} recalled {found[0].chunk.text!r}"
        assert found[0].chunk.conversation == conv
        assert found[0].score >= settings.MEMORY_MIN_SCORE


def test_unrelated_questions_recall_nothing_above_the_threshold(alice, embedder, alice_history):
    for question in UNRELATED:
        assert recall(alice, embedder, question) == [], question


def test_turns_inside_the_window_are_not_recalled(alice, embedder, alice_history):
    conv, answer = alice_history["Pets"]
    found = recall(alice, embedder, "What is my cat's name?", exclude_message_ids=(answer.pk,))
    assert answer.pk not in {f.chunk.message_id for f in found}


def test_another_users_facts_are_never_recalled(alice, bob, embedder, alice_history):
    _conv, bob_answer, _ = plant_turn(
        bob, "Pets", "My cat is called Whiskers.", "Whiskers is a classic name!", embedder=embedder
    )
    alice_found = recall(alice, embedder, "What is my cat's name?")
    bob_found = recall(bob, embedder, "What is my cat's name?")

    assert bob_answer.pk not in {f.chunk.message_id for f in alice_found}
    assert [f.chunk.message_id for f in bob_found] == [bob_answer.pk]
    assert {f.chunk.user_id for f in alice_found} == {alice.pk}


def test_a_chunk_is_stored_with_its_text_owner_and_vector(alice, embedder):
    _conv, answer, chunks = plant_turn(
        alice, "Tea", "I like green tea.", "Sencha is a nice one.", embedder=embedder
    )
    chunk = Chunk.objects.get(pk=chunks[0].pk)
    assert chunk.text == "User: I like green tea.\nAssistant: Sencha is a nice one."
    assert (chunk.user_id, chunk.source_kind, chunk.source_id, chunk.message_id) == (
        alice.pk,
        "turn",
        answer.pk,
        answer.pk,
    )
    assert chunk.embedding_model == "all-MiniLM-L6-v2"
    assert np.allclose(
        np.frombuffer(bytes(chunk.embedding), dtype="<f2"), embedder.encode([chunk.text])[0], atol=2e-3
    )


def test_embedding_skips_chunks_deleted_before_the_worker_got_to_them(alice, embedder):
    _conv, _answer, chunks = plant_turn(alice, "x", "one", "two")
    ids = [c.pk for c in chunks]
    Chunk.objects.filter(pk__in=ids).delete()
    assert services.chunks_embed(chunk_ids=ids, encode=embedder.encode) == 0
    assert store_for().size(user_id=alice.pk) == 0


def test_memory_off_for_the_account_or_conversation_indexes_nothing(alice, embedder):
    conv, _answer, chunks = plant_turn(alice, "Pets", "My dog is Rex.", "Hello Rex!", embedder=embedder)
    assert chunks

    services.conversation_memory_set(user_id=alice.pk, conversation_id=conv.pk, enabled=False)
    assert not Chunk.objects.filter(conversation=conv).exists()  # what it had is forgotten too
    assert plant_turn(alice, "", "My dog is 3.", "Nice.", conversation=conv)[2] == []

    services.account_memory_set(user_id=alice.pk, enabled=False)
    assert plant_turn(alice, "Other", "My bird is Kiwi.", "Lovely.")[2] == []
    assert not selectors.memory_enabled_for(user_id=alice.pk)

    services.account_memory_set(user_id=alice.pk, enabled=True)
    assert plant_turn(alice, "Other", "My bird is Kiwi.", "Lovely.")[2]


def test_deleting_a_conversation_or_the_account_deletes_its_chunks_and_vectors(alice, bob, embedder):
    conv, _a, _c = plant_turn(alice, "A", "I live in Oslo.", "Nice city.", embedder=embedder)
    plant_turn(alice, "B", "I work as a nurse.", "Thank you for your work.", embedder=embedder)
    plant_turn(bob, "C", "I live in Rome.", "Bella.", embedder=embedder)
    assert store_for().size(user_id=alice.pk) == 2

    conversation_delete(conversation=conv)
    assert store_for().size(user_id=alice.pk) == 1
    alice_id = alice.pk
    account_delete(user=alice)

    assert store_for().size(user_id=alice_id) == 0
    assert not Chunk.objects.filter(user_id=alice_id).exists()
    assert store_for().size(user_id=bob.pk) == 1


def test_document_chunks_are_deleted_with_their_source(alice, embedder):
    chunks = services.source_index(
        user_id=alice.pk, source_kind="document", source_id=42, text="Page one text. " * 80, meta={"page": 1}
    )
    services.chunks_embed(chunk_ids=[c.pk for c in chunks], encode=embedder.encode)
    assert len(chunks) > 1 and [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert selectors.chunks_for_source(user_id=alice.pk, source_kind="document", source_id=42)[0].meta == {
        "page": 1
    }

    assert services.chunks_delete_for_source(source_kind="document", source_id=42) == len(chunks)
    assert store_for().size(user_id=alice.pk) == 0


def test_the_user_can_forget_a_recalled_chunk_but_not_another_users(alice, bob, embedder):
    _c, _a, chunks = plant_turn(alice, "A", "My PIN hint is blue.", "Noted.", embedder=embedder)
    with pytest.raises(Chunk.DoesNotExist):
        services.chunk_forget(user_id=bob.pk, chunk_id=chunks[0].pk)
    services.chunk_forget(user_id=alice.pk, chunk_id=chunks[0].pk)
    assert store_for().size(user_id=alice.pk) == 0


def test_remember_that_stores_a_key_fact_only_its_owner_can_edit(alice, bob):
    memory = services.memory_from_message(
        user_id=alice.pk, conversation_id=None, text="Remember that I am vegetarian."
    )
    assert memory is not None and memory.text == "I am vegetarian"
    assert services.memory_from_message(user_id=alice.pk, conversation_id=None, text="What is 2+2?") is None

    with pytest.raises(Memory.DoesNotExist):
        services.memory_update(user_id=bob.pk, memory_id=memory.pk, text="hacked")
    with pytest.raises(services.MemoryInvalid):
        services.memory_update(user_id=alice.pk, memory_id=memory.pk, text="   ")
    services.memory_update(user_id=alice.pk, memory_id=memory.pk, text="I am vegan")

    assert [m.text for m in selectors.memories_for_user(user_id=alice.pk)] == ["I am vegan"]
    assert selectors.memories_for_user(user_id=bob.pk) == []
    assert selectors.memory_export(user_id=alice.pk)["memories"][0]["text"] == "I am vegan"
    services.memory_delete(user_id=alice.pk, memory_id=memory.pk)
    assert not Memory.objects.filter(user=alice).exists()
