"""The fixed SQL of ``database/sql.py`` runs as server-side prepared statements planned once per connection
(docs/overhead-levers.md, lever 25), while the ORM's statements stay client-bound and unprepared; the query log
still shows what ran."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations import generations
from conversations.admission import conversation_totals
from conversations.generation_worker import generation_start
from conversations.models import Conversation, Message
from conversations.services import message_chain_create
from database.sql import fetch_one

pytestmark = pytest.mark.django_db

MEMBERSHIP_SQL = "SELECT organization_id FROM organizations_membership WHERE user_id = %(user)s"


def prepared(fragment: str) -> list[tuple[int, int]]:
    """``(generic_plans, custom_plans)`` of this connection's prepared statements whose text holds
    ``fragment`` (PostgreSQL's ``pg_prepared_statements``, read through the ORM's cursor, which is never
    prepared itself)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE strpos(statement, %s) > 0",
            [fragment],
        )
        return cursor.fetchall()


def test_a_fixed_statement_is_prepared_at_its_first_run_and_planned_once(alice):
    assert prepared("organizations_membership WHERE") == []
    for _ in range(3):
        assert fetch_one(MEMBERSHIP_SQL, {"user": alice.pk}) is None
    # One prepared statement for the three runs, each run on its generic plan: planned once, never re-planned
    # with the parameters' values (plan_cache_mode, chatsite/settings/database.py).
    assert prepared("organizations_membership WHERE") == [(3, 0)]


def test_the_orms_statements_are_not_prepared(alice):
    for _ in range(3):
        assert Conversation.objects.filter(owner=alice, title="prepared?").first() is None
    assert prepared("prepared?") == []
    assert prepared('"conversations_conversation"') == []


def test_the_query_log_shows_the_sql_of_each_prepared_run(alice):
    conversation = Conversation.objects.create(owner=alice, title="t")
    with CaptureQueriesContext(connection) as queries:
        fetch_one(MEMBERSHIP_SQL, {"user": alice.pk})
        conversation_totals(conversation=conversation)
        fetch_one(MEMBERSHIP_SQL, {"user": alice.pk})  # a run of the prepared statement
    logged = [q["sql"] for q in queries.captured_queries]
    assert len(logged) == 3
    assert "organizations_membership" in logged[0]
    assert "octet_length" in logged[1]
    assert "organizations_membership" in logged[2]  # not the previous statement's SQL, nor None


def test_the_send_chain_and_the_workers_claim_are_prepared_and_keep_their_results(alice):
    conversation = Conversation.objects.create(owner=alice, title="t")
    parent = None  # the first chain starts the conversation, the second follows the first reply
    for n in range(2):
        _, reply = message_chain_create(
            conversation=conversation,
            messages=[
                {"role": Message.Role.USER, "content": f"question {n}"},
                {"role": Message.Role.ASSISTANT, "status": Message.Status.QUEUED, "model_name": "m"},
            ],
            parent=parent,
            conversation_locked=True,
        )
        claimed = generation_start(message_id=reply.id)
        assert claimed is not None and claimed.status == Message.Status.STREAMING
        assert [m[3] for m in claimed.claim_reads.branch][-1] == f"question {n}"
        Message.objects.filter(pk=reply.pk).update(status=Message.Status.COMPLETED)
        parent = reply
    # Each statement prepared once and run twice on its generic plan.
    assert prepared("WITH RECURSIVE m AS") == [(2, 0)]
    assert sum(generic for generic, _ in prepared("WITH ids AS MATERIALIZED")) == 2
    # The stored rows are what the statements wrote.
    stored = list(conversation.messages.order_by("id").values_list("role", "status", "content"))
    assert stored == [
        ("user", "completed", "question 0"),
        ("assistant", "completed", ""),
        ("user", "completed", "question 1"),
        ("assistant", "completed", ""),
    ]


def test_a_fixed_statements_placeholders_are_converted_once_whatever_its_parameters(alice, monkeypatch):
    """Lever 61: psycopg converts ``%s`` placeholders to ``$n`` afresh on every run of a statement of more than
    50 parameters (its own cache skips those), which the send's message chain insert is."""
    import psycopg._queries

    from database import sql

    conversions = []
    convert = psycopg._queries._query2pg_nocache

    def counted(query: bytes, encoding: str):
        conversions.append(query)
        return convert(query, encoding)

    # Wherever the conversion runs: psycopg's own (uncached for such statements) or the fixed statements' cache.
    monkeypatch.setattr(psycopg._queries, "_query2pg_nocache", counted)
    monkeypatch.setattr(sql, "_query2pg_nocache", counted)
    sql._converted.cache_clear()
    for n in range(3):  # a page's send: a new conversation, its question, its reply, verdict and reservation
        ticket = generations.reply_request(
            user=alice, conversation_id=None, content=f"question {n}", client_id=uuid.uuid4()
        )
        Message.objects.filter(pk=ticket.message.pk).update(
            status=Message.Status.COMPLETED
        )  # the next is admitted
    chain = [query for query in conversions if query.startswith(b"WITH ids AS MATERIALIZED")]
    assert chain and chain[0].count(b"%s") > psycopg._queries.MAX_CACHED_STATEMENT_PARAMS
    assert len(chain) == 1  # converted at its first run, not at each of the three
    assert Message.objects.filter(conversation__owner=alice, role=Message.Role.ASSISTANT).count() == 3


def generic_plan(fragment: str, *params) -> str:
    """The plan this connection's prepared statement holding ``fragment`` runs on with ``params``, sequential
    scans priced out (``enable_seqscan`` off), so an index shows wherever the generic plan may use it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE strpos(statement, %s) > 0", [fragment])
        (name,) = cursor.fetchone()
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN EXECUTE {name}({', '.join(['%s'] * len(params))})", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_counts_of_active_and_queued_replies_use_the_partial_index_on_their_generic_plan(alice):
    from conversations.reply_dispatch import queue_position
    from conversations.selectors import active_generation_count

    # A user with a long history and one reply queued, as the planner's statistics see it.
    history = Conversation.objects.bulk_create(Conversation(owner=alice, title=f"t{i}") for i in range(300))
    Message.objects.bulk_create(
        Message(conversation=c, role=role, content="old", model_name="m")
        for c in history
        for role in ("user", "assistant")
    )
    (reply,) = message_chain_create(
        conversation=history[0],
        messages=[{"role": Message.Role.ASSISTANT, "status": Message.Status.QUEUED, "model_name": "m"}],
        parent=None,
        conversation_locked=True,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE conversations_message, conversations_conversation")
    assert active_generation_count(user=alice) == 1
    assert queue_position(message=reply) == 1
    # The replaced statement bound the statuses: its generic plan cannot tell that they are the partial
    # index's, so the count read every message of the user's conversations (lever 29, docs/overhead.md).
    replaced = (
        "SELECT COUNT(*) FROM conversations_message m JOIN conversations_conversation c"
        " ON c.id = m.conversation_id WHERE c.owner_id = %s AND m.role = %s AND m.status = ANY(%s)"
    )
    assert fetch_one(replaced, [alice.pk, "assistant", ["queued", "streaming"]]) == (1,)
    assert "msg_active_status_idx" not in generic_plan(
        "m.status = ANY($3)", alice.pk, "assistant", ["queued", "streaming"]
    )
    assert "msg_active_status_idx" in generic_plan(
        "m.status IN ('queued', 'streaming')", alice.pk, "assistant"
    )
    assert "msg_active_status_idx" in generic_plan("m.status = 'queued'", "m", "assistant", 0, reply.pk)


def test_admissions_counts_and_reads_are_fixed_statements_on_the_partial_index(alice, make_user):
    """Admission's queue counts (``load.active_at_or_above``), its user-tier and tier reads are fixed statements
    (lever 56): no ORM query compiled; the counts agree with the ORM's aggregate by tier priority and use the
    partial index of active replies on their generic plan."""
    from django.db.models import Count, Q

    from billing.models import Tier
    from conversations import load

    paid = make_user("paid-user", tier="paid")
    conversations = {u: Conversation.objects.create(owner=u, title="t") for u in (alice, paid)}
    for user, status in [(alice, "queued"), (alice, "streaming"), (paid, "queued"), (paid, "completed")]:
        Message.objects.create(
            conversation=conversations[user], role="assistant", status=status, model_name="m"
        )
    # A history of ended replies, as the planner's statistics see a live table.
    Message.objects.bulk_create(
        Message(conversation=conversations[alice], role="assistant", status="completed", model_name="m")
        for _ in range(600)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE conversations_message, conversations_conversation")
    load.clear_cache()
    for priority in (alice.tier.queue_priority, paid.tier.queue_priority):
        orm = Message.objects.filter(
            role="assistant",
            status__in=("queued", "streaming"),
            model_name="m",
            conversation__owner__tier__queue_priority__gte=priority,
        ).aggregate(q=Count("id", filter=Q(status="queued")), s=Count("id", filter=Q(status="streaming")))
        assert load.active_at_or_above(model_name="m", priority=priority) == (orm["q"], orm["s"])
    load.clear_cache()
    paid_tier = Tier.objects.get(name="paid")
    with CaptureQueriesContext(connection) as queries:
        tier = load.current_tier(paid.pk)
        load.warm(user_ids=[alice.pk, paid.pk])
    assert tier == paid_tier and load.cached_tier(alice.tier_id) == alice.tier
    assert queries.captured_queries, "nothing read"
    for q in queries.captured_queries:  # fixed SQL as written here, no ORM quoting of its own
        assert '"accounts_user"."' not in q["sql"] and '"billing_tier"."' not in q["sql"], q["sql"]
    assert "msg_active_status_idx" in generic_plan(
        "COUNT(*) FILTER (WHERE m.status = 'queued')", "m", "assistant", 0
    )
    load.clear_cache()
    with pytest.raises(Tier.DoesNotExist):
        load.cached_tier(10**9)


def test_a_replys_context_is_recorded_by_one_prepared_statement(alice):
    """The worker's record of a reply's window (omitted turns, prompt tokens) is one fixed statement, prepared
    once per connection, not an ``UPDATE`` the ORM compiles and PostgreSQL plans for every reply (lever 58)."""
    from conversations.generation_worker import generation_set_context

    conversation = Conversation.objects.create(owner=alice, title="t")
    reply = Message.objects.create(
        conversation=conversation, role="assistant", status="streaming", model_name="m"
    )
    before = reply.updated_at
    with CaptureQueriesContext(connection) as queries:
        generation_set_context(message=reply, omitted=2, prompt_tokens=40)
    (query,) = queries.captured_queries
    assert '"conversations_message"."' not in query["sql"]  # the ORM qualifies every column it compiles
    assert prepared("SET omitted_messages") == [(1, 0)]
    stored = Message.objects.get(pk=reply.pk)
    assert (
        (stored.omitted_messages, stored.prompt_tokens)
        == (2, 40)
        == (reply.omitted_messages, reply.prompt_tokens)
    )
    assert stored.updated_at == reply.updated_at > before


def test_a_message_is_read_for_its_user_by_one_prepared_statement(alice, bob):
    """``message_get_for_user`` (every ``resume`` frame, every ``stop``, a late joiner's catch-up) reads the
    message and its conversation by one fixed statement, prepared once per connection, loaded as the ORM loads
    them (lever 60); other users, bad ids and unstored conversations behave as before."""
    from conversations.selectors import MessageNotFound, message_get_for_user

    conversation = Conversation.objects.create(owner=alice, title="t", stored=False)
    reply = Message.objects.create(
        conversation=conversation,
        role="assistant",
        status="completed",
        model_name="m",
        content="Hello.",
        sampling={"temperature": 0.5, "stop": ["\n"]},
    )
    with CaptureQueriesContext(connection) as queries:
        first = message_get_for_user(user=alice, message_id=reply.pk)
        again = message_get_for_user(user=alice, message_id=str(reply.pk))
        # Its conversation and that conversation's owner come with it.
        assert first.conversation.title == "t" and first.conversation.owner is alice
    assert len(queries.captured_queries) == 2
    assert all('"conversations_message"."' not in q["sql"] for q in queries.captured_queries)
    assert prepared(" m JOIN ") == [(2, 0)]
    orm = Message.objects.select_related("conversation").get(pk=reply.pk)
    for loaded in (first, again):
        assert loaded == orm and not loaded._state.adding and loaded._state.db == "default"
        assert {f.attname: getattr(loaded, f.attname) for f in Message._meta.concrete_fields} == {
            f.attname: getattr(orm, f.attname) for f in Message._meta.concrete_fields
        }
        assert loaded.sampling == {"temperature": 0.5, "stop": ["\n"]}
        assert loaded.conversation == orm.conversation and loaded.conversation.stored is False
    for user, message_id in ((bob, reply.pk), (alice, "abc"), (alice, None), (alice, 2**63), (alice, 0)):
        with pytest.raises(MessageNotFound):
            message_get_for_user(user=user, message_id=message_id)
