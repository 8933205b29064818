"""The question's vector is prefetched for a queued reply only where something will read it: recall (memory
on and an embedded turn to recall) or a conversation's ready file. Each prefetch is a model call on the
embeddings worker, which shares the CPU with the engine (docs/overhead.md). A page send that starts a
conversation takes the admission warmer's answer (lever 46). Real database, Redis and broker."""

import numpy as np
import pytest

from billing.models import Tier
from conversations import generations
from conversations.models import Conversation, Message
from memory.models import AccountMemory, Chunk, ConversationMemory
from tests.conftest import broker_take

pytestmark = pytest.mark.django_db

QUERY_QUEUE = "embeddings.query"


@pytest.fixture
def asker(alice, redis_clean, django_capture_on_commit_callbacks):
    """``ask(text, conversation_id=None)``: a send by alice (commit callbacks run); returns the questions the
    embeddings worker was asked to embed for it, and the reply."""
    Tier.objects.filter(pk=alice.tier_id).update(memory_budget_tokens=512)
    alice.refresh_from_db()
    broker_take(QUERY_QUEUE)

    def ask(text: str, conversation_id=None):
        with django_capture_on_commit_callbacks(execute=True):
            ticket = generations.reply_request(user=alice, conversation_id=conversation_id, content=text)
        Message.objects.filter(pk=ticket.message.pk).update(status=Message.Status.COMPLETED)
        return [args[1] for args, _priority in broker_take(QUERY_QUEUE)], ticket.message

    return ask


def embedded_turn(user) -> Chunk:
    conversation = Conversation.objects.create(owner=user, title="Old")
    question = Message.objects.create(conversation=conversation, role="user", content="My cat is Tom.")
    reply = Message.objects.create(
        conversation=conversation, role="assistant", content="Noted.", parent=question
    )
    vector = np.ones(384, dtype="<f2") / np.sqrt(384)
    return Chunk.objects.create(
        user=user,
        source_kind=Chunk.Source.TURN,
        source_id=reply.pk,
        conversation=conversation,
        message=reply,
        text="My cat is Tom. Noted.",
        embedding=vector.astype("<f2").tobytes(),
    )


def test_no_prefetch_while_there_is_nothing_to_recall(alice, asker):
    asked, _reply = asker("What is my cat called?")
    assert asked == []


def test_a_prefetch_once_the_user_has_an_embedded_turn(alice, asker):
    embedded_turn(alice)
    asked, _reply = asker("What is my cat called?")
    assert asked == ["What is my cat called?"]


def test_no_prefetch_with_memory_off_for_the_account_or_the_conversation(alice, asker):
    embedded_turn(alice)
    AccountMemory.objects.create(user=alice, enabled=False)
    assert asker("What is my cat called?")[0] == []
    AccountMemory.objects.filter(user=alice).update(enabled=True)
    _asked, reply = asker("And my dog?")
    assert _asked == ["And my dog?"]
    ConversationMemory.objects.create(conversation_id=reply.conversation_id, enabled=False)
    assert asker("And my fish?", conversation_id=reply.conversation_id)[0] == []


def test_a_prefetch_for_a_conversation_with_a_ready_file(alice, asker):
    from documents.models import Document

    _asked, reply = asker("Hello")
    assert _asked == []
    Document.objects.create(
        owner=alice,
        conversation_id=reply.conversation_id,
        name="notes.txt",
        kind=Document.Kind.TEXT,
        content_type="text/plain",
        size_bytes=5,
        sha256="0" * 64,
        status=Document.Status.READY,
    )
    assert asker("What does the file say?", conversation_id=reply.conversation_id)[0] == [
        "What does the file say?"
    ]


def test_a_prefetched_vector_is_read_by_every_reply_asking_that_question(alice, asker):
    # The worker side of the prefetch: the embeddings worker's answer lands under the user's question key,
    # and each reading leaves it in place (two replies of the same question, a regenerate).
    from memory.query import question_answer, question_key, question_vector

    embedded_turn(alice)
    asked, _reply = asker("What is my cat called?")
    assert asked == ["What is my cat called?"]
    vector = np.arange(384, dtype="<f4") / 384
    question_answer(key=question_key(user_id=alice.pk, text="What is my cat called?"), vector=vector)
    for _ in range(2):
        got = question_vector(user_id=alice.pk, text="What is my cat called?", timeout_s=1)
        assert got is not None and np.array_equal(got, vector)
    # Another user's identical question is not theirs to read: no prefetch, so a round trip (no worker here).
    assert question_vector(user_id=alice.pk + 1, text="What is my cat called?", timeout_s=0.2) is None


@pytest.mark.parametrize("store", [True, False])
def test_a_stored_api_completion_prefetches_its_question_and_an_unstored_one_does_not(alice, asker, store):
    from conversations.completions import completion_request

    embedded_turn(alice)
    completion_request(
        user=alice,
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": "What is my cat called?"}],
        sampling={},
        store=store,
    )
    asked = [args[1] for args, _priority in broker_take(QUERY_QUEUE)]
    assert asked == (["What is my cat called?"] if store else [])


@pytest.mark.parametrize(
    "turn, account_memory, expected", [(True, True, True), (False, True, False), (True, False, False)]
)
def test_an_api_key_read_says_whether_a_new_conversation_reads_its_question_vector(
    alice, asker, turn, account_memory, expected
):
    """The key read answers what ``question_vector_wanted`` would for a new conversation (lever 40), so a
    stored completion runs no statement of its own for it and still prefetches exactly when recall would read
    the vector."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from api.selectors import api_key_user
    from api.services import api_key_create
    from conversations.completions import completion_request

    if turn:
        embedded_turn(alice)
    AccountMemory.objects.update_or_create(user=alice, defaults={"enabled": account_memory})
    _, raw = api_key_create(user=alice, name="prefetch")
    user = api_key_user(raw_key=raw)
    assert user.question_vector_wanted is expected
    with CaptureQueriesContext(connection) as queries:
        completion_request(
            user=user,
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": "What is my cat called?"}],
            sampling={},
            store=True,
        )
    assert not any("memory_chunk" in q["sql"] for q in queries.captured_queries)
    asked = [args[1] for args, _priority in broker_take(QUERY_QUEUE)]
    assert asked == (["What is my cat called?"] if expected else [])


def test_an_api_key_read_for_a_tier_without_memory_says_no(alice, asker):
    from api.selectors import api_key_user
    from api.services import api_key_create

    embedded_turn(alice)
    Tier.objects.filter(pk=alice.tier_id).update(memory_budget_tokens=0)
    assert api_key_user(raw_key=api_key_create(user=alice, name="k")[1]).question_vector_wanted is False


@pytest.fixture
def no_warm_answers():
    from conversations import recall

    recall._new_conversation_wanted.clear()
    yield recall
    recall._new_conversation_wanted.clear()


@pytest.mark.parametrize(
    "turn, account_memory, expected", [(True, True, True), (False, True, False), (True, False, False)]
)
def test_a_send_that_starts_a_conversation_takes_the_warmers_answer_and_runs_no_statement_for_it(
    alice, asker, no_warm_answers, turn, account_memory, expected
):
    """The admission warmer's pass for an open socket's user reads what ``question_vector_wanted`` would
    answer for a new conversation (lever 46), so the send runs no statement of its own for it and still
    prefetches exactly when recall would read the vector."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from conversations import load_warmer

    if turn:
        embedded_turn(alice)
    AccountMemory.objects.update_or_create(user=alice, defaults={"enabled": account_memory})
    socket = {"session_key": "warm-prefetch", "user_id": alice.pk}
    load_warmer.socket_opened(**socket)
    try:
        load_warmer.warm_once()
    finally:
        load_warmer.socket_closed(**socket)
    assert no_warm_answers.new_conversation_wanted_cached(alice.pk) is expected
    with CaptureQueriesContext(connection) as queries:
        asked, _reply = asker("What is my cat called?")
    assert not any("memory_chunk" in q["sql"] for q in queries.captured_queries)
    assert asked == (["What is my cat called?"] if expected else [])


def test_a_warm_answer_older_than_the_admission_figures_is_read_again(
    alice, asker, no_warm_answers, settings
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    no_warm_answers.new_conversation_wanted_warm(user_ids={alice.pk})  # nothing to recall yet: False
    assert no_warm_answers.new_conversation_wanted_cached(alice.pk) is False
    embedded_turn(alice)
    settings.ADMISSION_LOAD_CACHE_S = 0.0
    assert no_warm_answers.new_conversation_wanted_cached(alice.pk) is None
    with CaptureQueriesContext(connection) as queries:
        asked, _reply = asker("What is my cat called?")
    assert any("memory_chunk" in q["sql"] for q in queries.captured_queries)  # asked on the spot
    assert asked == ["What is my cat called?"]


def test_a_follow_up_in_a_stored_conversation_still_asks_on_the_spot(alice, asker, no_warm_answers):
    """The warm answer is a new conversation's: a stored one may have its own files and memory switch."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    no_warm_answers.new_conversation_wanted_warm(user_ids={alice.pk})
    _asked, reply = asker("Hello")
    ConversationMemory.objects.create(conversation_id=reply.conversation_id, enabled=False)
    embedded_turn(alice)
    with CaptureQueriesContext(connection) as queries:
        asked, _reply = asker("What is my cat called?", conversation_id=reply.conversation_id)
    assert any("memory_chunk" in q["sql"] for q in queries.captured_queries)
    assert asked == []  # the conversation's own switch is off
