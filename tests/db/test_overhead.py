"""The product's own overhead on a reply's way, locked in by structure, not by timings (``docs/overhead.md``):
the SQL round trips a ``send`` costs, no database write per generated token, the connection pool the web
and worker processes are configured with. Real PostgreSQL, Redis and broker; a real engine over a tiny
random-weight Llama (no Celery: ``run_generation`` is what the task calls)."""

import dataclasses
import re
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import Tier, UsageRecord
from conversations import completions, generations
from conversations.models import Conversation, Message
from conversations.reply_runner import run_generation
from inference.worker import WorkerHost
from memory.models import Chunk
from memory.services import account_memory_set
from tests.conftest import broker_take
from tests.db.deployed import run_deployed

pytestmark = pytest.mark.django_db

#: Round trips of a first ``send`` (with the page's ``client_id``, ``resend`` false) to an existing
#: conversation: the conversation with its row lock, the prompt bound and the busy check (one aggregate),
#: the concurrency count, the organisation's cap, the place in line and the quota's upsert (one statement; the
#: place in line was a read of its own after the commit before lever 30, the upsert before lever 48), the two messages
#: with the input guard's verdict and the reply's reservation (one statement that inserts all four and moves
#: the previous leaf's pointer and the conversation's leaf), and whether the
#: question's vector is wanted (conversations.recall.question_vector_wanted: one query that spares the
#: embeddings worker a model call per send nothing would read); the rollout is read at most once per
#: ADMISSION_LOAD_CACHE_S per process; BEGIN/COMMIT are not counted. It was 8 before lever 48, 9 before lever 30, 13 before lever 28 (the
#: verdict, the reservation, the organisation's cap and the rollout each a statement of its own), 29
#: without the organisation, guard and vector reads before the first cut (savepoints per message, the owner
#: and tier read again for dispatch, two counts each for the prompt bound and the place in line), then 23
#: before lever 16 (docs/overhead.md): the idempotency lookup before a first send, the quota's
#: insert-if-missing and read, and the user message's leaf update; then 19 before lever 18: the
#: conversation is now read with its row lock, so the separate lock and the busy check's own query are gone
#: (the busy check is a count in the prompt bound's aggregate).
SEND_QUERIES = 7


def test_a_send_to_an_existing_conversation_costs_a_fixed_number_of_sql_round_trips(
    alice, redis_clean, django_assert_max_num_queries, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        first = generations.reply_request(user=alice, conversation_id=None, content="Hello")
    Message.objects.filter(pk=first.message.pk).update(status=Message.Status.COMPLETED)
    conversation_id = first.message.conversation_id
    broker_take("inference.smollm2-135m-instruct")

    with django_assert_max_num_queries(SEND_QUERIES), django_capture_on_commit_callbacks(execute=True):
        ticket = generations.reply_request(
            user=alice,
            conversation_id=conversation_id,
            content="And then?",
            client_id=str(uuid.uuid4()),
            resend=False,
        )

    stored = Message.objects.filter(conversation_id=conversation_id).order_by("id")
    assert [(m.role, m.status) for m in stored] == [
        ("user", "completed"),
        ("assistant", "completed"),
        ("user", "completed"),
        ("assistant", "queued"),
    ]
    assert ticket.position == 1 and ticket.message == stored[3]
    assert stored[2].active_child_id == stored[3].id  # the reply's insert moved both pointers
    assert Conversation.objects.get(pk=conversation_id).active_leaf_id == stored[3].id
    assert broker_take("inference.smollm2-135m-instruct") == [([ticket.message.id], 0)]


def _quota_row_and_no_reply_waiting(user) -> None:
    """A first reply of ``user`` stored and ended (so the day's quota row exists and nothing is active), and
    the model's broker queue emptied (so the test's own dispatch is the only task in it)."""
    generations.reply_request(user=user, conversation_id=None, content="Hello")
    Message.objects.filter(status="queued").update(status=Message.Status.COMPLETED)
    broker_take("inference.smollm2-135m-instruct")


#: Round trips of a first ``send`` that starts a conversation: as SEND_QUERIES, but the conversation is an
#: insert, and since no other transaction sees it yet there is no prompt bound to sum, no row lock and no busy
#: check (lever 16, docs/overhead.md; it was 19 before), and the two messages are one statement (lever 20; 15
#: before: two inserts, the user message's pointer and the conversation's leaf), with the verdict and the
#: reservation (lever 28; 12 before, as for SEND_QUERIES), and the place in line read with admission (lever
#: 30; 8 before), the conversation's insert in the chain's statement too (lever 47; 7 before), and the quota's
#: upsert in admission's read (lever 48; 6 before).
NEW_CONVERSATION_SEND_QUERIES = 5


def test_a_send_that_starts_a_conversation_costs_a_fixed_number_of_sql_round_trips(
    alice, redis_clean, django_assert_max_num_queries, django_capture_on_commit_callbacks
):
    _quota_row_and_no_reply_waiting(alice)
    with (
        django_assert_max_num_queries(NEW_CONVERSATION_SEND_QUERIES),
        django_capture_on_commit_callbacks(execute=True),
    ):
        ticket = generations.reply_request(
            user=alice, conversation_id=None, content="New topic", client_id=str(uuid.uuid4()), resend=False
        )
    user_message, reply = Message.objects.filter(conversation_id=ticket.message.conversation_id).order_by(
        "id"
    )
    assert (user_message.parent_id, user_message.active_child_id, reply.parent_id) == (
        None,
        reply.id,
        user_message.id,
    )
    assert Conversation.objects.get(pk=reply.conversation_id).active_leaf_id == reply.id
    assert ticket.position == 1 and reply.status == "queued"
    assert broker_take("inference.smollm2-135m-instruct") == [([reply.id], 0)]


#: Round trips of a streamed API completion of one user turn with sampling set (``store`` false): the
#: concurrency count, the organisation's cap and the quota's upsert (one statement; the upsert was a statement
#: of its own before lever 48), the conversation with
#: its leaf, the turn and the reply with its sampling, the input guard's verdict and the reservation (one
#: statement: the five inserts; the conversation was a statement of its own before lever 47), and the savepoint
#: pair of the test's own transaction (as in SEND_QUERIES; the rollout cached). 10 before lever 28
#: (docs/overhead.md); before lever 16 it was 17: the quota's insert-if-missing and read, the turn's leaf update
#: and the reply's second write for its sampling.
COMPLETION_QUERIES = 4


def test_an_api_completion_costs_a_fixed_number_of_sql_round_trips(
    alice, redis_clean, django_assert_max_num_queries, django_capture_on_commit_callbacks
):
    _quota_row_and_no_reply_waiting(alice)
    with django_assert_max_num_queries(COMPLETION_QUERIES), django_capture_on_commit_callbacks(execute=True):
        reply = completions.completion_request(
            user=alice,
            model=alice.tier.model_name,
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            sampling={"temperature": 0.2, "max_tokens": 8},
            api_user="end-user-7",
        )
    reply.refresh_from_db()
    turn = Message.objects.get(pk=reply.parent_id)
    assert (turn.role, turn.content, turn.active_child_id) == ("user", "Hi", reply.id)
    assert (reply.status, reply.sampling, reply.api_user) == (
        "queued",
        {"temperature": 0.2, "max_tokens": 8},
        "end-user-7",
    )
    assert Conversation.objects.get(pk=reply.conversation_id).active_leaf_id == reply.id
    assert broker_take("inference.smollm2-135m-instruct") == [([reply.id], 0)]


def test_a_worker_claims_a_reply_with_its_conversation_owner_and_tier_in_one_round_trip(
    alice, redis_clean, django_assert_num_queries
):
    """``generation_start`` (lever 16): the claim and the rows the reply runner reads next in one statement,
    loaded as the ORM loads them (the reply's JSON sampling decoded); a reply is claimed once."""
    from conversations.generation_worker import generation_start

    reply = completions.completion_request(
        user=alice,
        model=alice.tier.model_name,
        messages=[{"role": "user", "content": "Hi"}],
        sampling={"temperature": 0.2, "stop": ["\n"]},
        api_metadata={"k": "v"},
    )
    with django_assert_num_queries(1):
        claimed = generation_start(message_id=reply.id, trace_id="t-1", model_version="v2")
        tier_name = claimed.conversation.owner.tier.name
    fresh = Message.objects.select_related("conversation__owner__tier").get(pk=reply.id)
    assert (fresh.status, fresh.trace_id, fresh.model_version) == ("streaming", "t-1", "v2")
    assert claimed.sampling == {"temperature": 0.2, "stop": ["\n"]} and tier_name == alice.tier.name
    for ours, orm in [
        (claimed, fresh),
        (claimed.conversation, fresh.conversation),
        (claimed.conversation.owner, fresh.conversation.owner),
        (claimed.conversation.owner.tier, fresh.conversation.owner.tier),
    ]:
        names = [f.attname for f in type(orm)._meta.concrete_fields]
        assert [getattr(ours, n) for n in names] == [getattr(orm, n) for n in names]
    assert generation_start(message_id=reply.id) is None  # no longer queued: a redelivered task skips it


def test_a_claim_walks_its_branch_by_index_and_never_scans_every_message(alice, redis_clean):
    """Lever 42: the claim's walk up the branch carries the columns it needs, so nothing joins the walk's ids
    back to the messages table, which the planner (guessing 100 rows for a recursive CTE) did with a hash join
    over a sequential scan of every message (the plan's shape, not its timings)."""
    from conversations.generation_worker import _claim_statement
    from documents.models import Document

    reply = completions.completion_request(
        user=alice,
        model=alice.tier.model_name,
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "How are you?"},
        ],
        sampling={},
    )
    sql, _ = _claim_statement()
    params = ["streaming", reply.created_at, "", "", reply.id, "queued", Document.Status.READY]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # One read of the table each: the claimed row, the walk's first step, its recursive step. The old
    # statement had a fourth, outside the walk, which a small table's statistics made a full scan.
    reads = [
        line for line in plan.splitlines() if re.search(r"Scan (using \S+ )?on conversations_message ", line)
    ]
    assert len(reads) == 3, plan


def _writes_of_a_reply(user, host, max_reply_tokens: int) -> tuple[Message, list[str]]:
    Tier.objects.filter(pk=user.tier_id).update(max_reply_tokens=max_reply_tokens)
    ticket = generations.reply_request(user=user, conversation_id=None, content="Count to fifty, please.")
    with CaptureQueriesContext(connection) as queries:
        assert run_generation(message_id=ticket.message.id, host=host) == "completed"
    writes = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith(("INSERT", "UPDATE", "DELETE"))
    ]
    return Message.objects.get(pk=ticket.message.id), writes


def test_a_reply_writes_to_the_database_the_same_number_of_times_whatever_its_length(
    alice, redis_clean, engine
):
    host = WorkerHost(engine)
    short, short_writes = _writes_of_a_reply(alice, host, 2)
    long, long_writes = _writes_of_a_reply(alice, host, 24)
    # Tokens go to Redis (replay stream, channel layer); the text is written once, at the end.
    assert short.completion_tokens < long.completion_tokens
    assert long.content and long.status == Message.Status.COMPLETED
    assert len(short_writes) == len(long_writes)
    assert len(long_writes) < long.completion_tokens


def test_a_replys_final_write_reads_back_neither_the_reply_nor_its_conversation_or_owner(
    alice, redis_clean, engine
):
    """The final write sets on the claimed instance what it stored (docs/overhead-levers.md, lever 34): no
    read of the reply after its UPDATE, and the conversation, owner and tier the claim loaded stay cached
    (``refresh_from_db`` dropped them, and each was read again for the usage record)."""
    host = WorkerHost(engine)
    ticket = generations.reply_request(user=alice, conversation_id=None, content="Count to fifty, please.")
    reply_id = ticket.message.id
    with CaptureQueriesContext(connection) as queries:
        assert run_generation(message_id=reply_id, host=host) == "completed"
    sql = [q["sql"] for q in queries.captured_queries]
    read_again = [
        q
        for q in sql
        if q.startswith(
            ('SELECT "conversations_conversation"', 'SELECT "accounts_user"', 'SELECT "billing_tier"')
        )
        or (
            q.startswith('SELECT "conversations_message"')
            and f'"conversations_message"."id" = {reply_id}' in q
        )
    ]
    assert read_again == []
    stored = Message.objects.get(pk=reply_id)
    assert stored.status == Message.Status.COMPLETED and stored.content and stored.completion_tokens > 0
    usage = UsageRecord.objects.get(message_id=reply_id)
    assert (usage.user_id, usage.completion_tokens) == (alice.pk, stored.completion_tokens)


def test_web_and_worker_processes_reuse_pooled_postgresql_connections():
    """The settings a deployment runs with (``chatsite.settings.dev``, as ``make run``) configure psycopg's
    pool, and consecutive database calls from the event loop (``db_call``, as a consumer makes them) are
    served by the same few PostgreSQL backends instead of one new connection each."""
    script = """
async def calls():
    return [await db_call(backend_pid, thread_sensitive=False)() for _ in range(6)]

print(json.dumps({"pool": settings.DATABASES["default"]["OPTIONS"]["pool"], "pids": asyncio.run(calls())}))
"""
    result = run_deployed(script, DB_POOL_MAX_SIZE="4", DB_POOL_MIN_SIZE="1")
    assert result["pool"]["max_size"] == 4
    # Without the pool each call opens (and closes) its own connection: six backends.
    assert len(set(result["pids"])) <= 2, result["pids"]


def _reply_run(user, host) -> tuple[int, list[str]]:
    """A new conversation's reply generated by the worker's runner: ``(reply id, its SQL, in order)``."""
    ticket = generations.reply_request(user=user, conversation_id=None, content="Count to fifty, please.")
    with CaptureQueriesContext(connection) as queries:
        assert run_generation(message_id=ticket.message.id, host=host) == "completed"
    return ticket.message.id, [q["sql"] for q in queries.captured_queries]


def _reads_of(sql: list[str], *tables: str) -> list[str]:
    return [q for q in sql if q.startswith("SELECT") and any(f'"{t}"' in q for t in tables)]


def test_a_reply_ends_without_reading_what_its_claim_read(alice, redis_clean, engine):
    """Memory off and no ready file when the worker claimed the reply: its final write reads neither the memory
    switches nor the reply's parent (nothing is indexed) nor the citations (none can exist; lever 36); the reply
    and its usage are stored as before."""
    account_memory_set(user_id=alice.pk, enabled=False)
    reply_id, sql = _reply_run(alice, WorkerHost(engine))
    assert _reads_of(sql, "memory_accountmemory", "memory_conversationmemory", "documents_citation") == []
    user_message = Message.objects.get(pk=reply_id).parent
    assert [q for q in sql if q.startswith("SELECT") and f"= {user_message.pk}" in q] == []
    assert not Chunk.objects.filter(message_id=reply_id).exists()
    assert Message.objects.get(pk=reply_id).status == Message.Status.COMPLETED
    assert UsageRecord.objects.filter(message_id=reply_id).exists()


def test_a_reply_with_memory_on_is_still_indexed_and_its_switches_read_again(alice, redis_clean, engine):
    """Memory on at the claim: the turn is indexed, and the switches are read again in the final write, so a
    user who turns memory off while a reply streams has it left out."""
    reply_id, sql = _reply_run(alice, WorkerHost(engine))
    assert Chunk.objects.filter(message_id=reply_id, source_kind=Chunk.Source.TURN).exists()
    assert _reads_of(sql, "memory_accountmemory")


def test_a_reply_whose_conversation_had_a_ready_file_reads_its_citations(
    alice, redis_clean, engine, monkeypatch
):
    """The citations read is skipped only when the claim saw no ready file."""
    from conversations import generation_worker

    claimed = []
    real_start = generation_worker.generation_start

    def start_seeing_a_file(**kwargs):
        message = real_start(**kwargs)
        message.claim_reads = dataclasses.replace(message.claim_reads, has_documents=True)
        claimed.append(message.pk)
        return message

    monkeypatch.setattr("conversations.reply_runner.generation_start", start_seeing_a_file)
    reply_id, sql = _reply_run(alice, WorkerHost(engine))
    assert claimed == [reply_id]
    assert _reads_of(sql, "documents_citation")
