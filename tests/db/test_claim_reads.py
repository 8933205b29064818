"""A worker's claim reads what the reply's context assembly needs (``generation_worker.ClaimReads``,
docs/overhead-levers.md lever 21): the branch, whether the conversation has a ready file, the memory switches. They
must answer what the separate reads they replace answer (``branches.ancestors``,
``documents.retrieval.conversation_has_documents``, ``memory.selectors.memory_enabled_for``), kept here as
the reference, and the worker's reads before the prefill are then one statement."""

import pytest

from conversations.generation_worker import generation_branch, generation_start
from conversations.models import Conversation, Message
from documents.models import Document
from documents.retrieval import conversation_has_documents
from memory.models import AccountMemory, ConversationMemory
from memory.selectors import memory_enabled_for

pytestmark = pytest.mark.django_db


def _message(conversation, parent, role, content, status="completed") -> Message:
    message = Message.objects.create(
        conversation=conversation, parent=parent, role=role, content=content, status=status
    )
    if parent is not None:
        Message.objects.filter(pk=parent.pk).update(active_child=message)
    return message


@pytest.fixture
def branched(alice):
    """A conversation with a system message, a blocked user message, a reply that failed with no text, an
    edited branch beside the one answered, multi-byte text, and a queued reply at the end of one branch."""
    conversation = Conversation.objects.create(owner=alice, title="t", system_prompt="Be brief.")
    system = _message(conversation, None, "system", "You are helpful.")
    first = _message(conversation, system, "user", "Grüße — 你好")
    failed = _message(conversation, first, "assistant", "", status="failed")
    blocked = _message(conversation, failed, "user", "something refused", status="blocked")
    answer = _message(conversation, blocked, "assistant", "An answer.")
    _message(conversation, answer, "user", "the other branch")  # a sibling of the turn answered below
    question = _message(conversation, answer, "user", 'And then? "quoted" \\ back')
    reply = _message(conversation, question, "assistant", "", status="queued")
    return conversation, reply


def test_the_claim_reads_the_branch_the_ancestors_query_reads(branched):
    conversation, reply = branched
    claimed = generation_start(message_id=reply.pk)
    unclaimed = Message.objects.select_related("conversation").get(pk=reply.pk)
    assert not hasattr(unclaimed, "claim_reads")

    assert generation_branch(message=claimed) == generation_branch(message=unclaimed)
    system_prompt, turns, ids = generation_branch(message=claimed)
    assert system_prompt == "Be brief."
    assert [t["content"] for t in turns] == ["Grüße — 你好", "An answer.", 'And then? "quoted" \\ back']
    assert len(ids) == 3 and ids == sorted(ids)


def test_a_root_reply_claims_an_empty_branch(alice):
    conversation = Conversation.objects.create(owner=alice, title="t")
    reply = _message(conversation, None, "assistant", "", status="queued")
    assert generation_start(message_id=reply.pk).claim_reads.branch == ()


@pytest.mark.parametrize("document_status", [None, Document.Status.PROCESSING, Document.Status.READY])
@pytest.mark.parametrize("account_on", [True, False, None])
@pytest.mark.parametrize("conversation_on", [True, False, None])
def test_the_claim_reads_the_switches_the_separate_reads_read(
    alice, bob, branched, document_status, account_on, conversation_on
):
    conversation, reply = branched
    if document_status is not None:
        Document.objects.create(
            owner=alice,
            conversation=conversation,
            name="notes.txt",
            kind=Document.Kind.TEXT,
            content_type="text/plain",
            size_bytes=5,
            sha256="0" * 64,
            status=document_status,
        )
    if account_on is not None:  # no row: on
        AccountMemory.objects.create(user=alice, enabled=account_on)
    if conversation_on is not None:
        ConversationMemory.objects.create(conversation=conversation, enabled=conversation_on)
    AccountMemory.objects.create(user=bob, enabled=False)  # another user's switch changes nothing here

    reads = generation_start(message_id=reply.pk).claim_reads

    assert reads.has_documents == conversation_has_documents(conversation_id=conversation.pk)
    assert reads.memory_switches_on == memory_enabled_for(user_id=alice.pk, conversation_id=conversation.pk)
    assert reads.has_documents == (document_status == Document.Status.READY)


def test_the_worker_reads_a_reply_s_context_in_one_statement(alice, branched, django_assert_num_queries):
    """From the claim to the branch, the file check and the memory switches: one statement (four before
    lever 21). Memory off for the account, so recall stops at its switch."""
    from conversations.reply_runner import _documents_context
    from memory.recall import memory_context

    conversation, reply = branched
    AccountMemory.objects.create(user=alice, enabled=False)
    with django_assert_num_queries(1):
        claimed = generation_start(message_id=reply.pk)
        _system, turns, ids = generation_branch(message=claimed)
        cited, vector = _documents_context(None, claimed, turns, 1000)
        memory = memory_context(
            user_id=alice.pk,
            conversation_id=conversation.pk,
            question=turns[-1]["content"],
            window_message_ids=ids,
            budget_tokens=100,
            count_tokens=len,
            switches_on=claimed.claim_reads.memory_switches_on,
        )
    assert (cited.text, vector, memory.text) == ("", None, "")
