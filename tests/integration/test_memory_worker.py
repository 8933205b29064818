"""The embeddings worker as a real process (``celery -A memory.worker``, as the Procfile starts it): turns
indexed after commit are embedded there, questions are answered through Redis, recall reaches the reply's
context end to end, and its metrics are served."""

import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from django.db import transaction

from conversations.models import Conversation, Message
from devtools.memory_needles import NEEDLES
from memory import services
from memory.models import Chunk
from memory.query import question_embed
from memory.recall import FACTS_MARKER, RECALL_MARKER, memory_context
from memory.selectors import store_status
from tests.live_stack import ROOT, free_port, stack_env, wait_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def embeddings_worker(django_db_setup, tmp_path_factory):
    """One embeddings worker process for this module; yields its metrics URL."""
    from tests.conftest import broker_purge

    broker_purge()
    port = free_port()
    log_path = tmp_path_factory.mktemp("embeddings") / "worker.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "memory.worker", "worker", "--pool", "threads",
         "--concurrency", "4", "-Q", "embeddings.query,embeddings", "-n", f"embeddings-test-{port}@%h",
         "--loglevel", "INFO"],
        cwd=ROOT,
        env={**stack_env(), "EMBEDDINGS_METRICS_PORT": str(port)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        try:
            wait_port(port, proc, timeout=120)  # the metrics port opens once the model is loaded
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"embeddings worker did not start:\n{log_path.read_text()[-3000:]}") from exc
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        log.close()


def plant(user, title, question, reply):
    with transaction.atomic():
        conv = Conversation.objects.create(owner=user, title=title)
        asked = Message.objects.create(conversation=conv, role="user", content=question)
        answer = Message.objects.create(conversation=conv, role="assistant", content=reply, parent=asked)
        services.turn_index(
            user_id=user.pk, conversation_id=conv.pk, reply_id=answer.pk, question=question, reply=reply
        )
    return conv, answer


def wait_embedded(user, timeout=60.0):
    deadline = time.monotonic() + timeout
    while Chunk.objects.filter(user=user, embedding__isnull=True).exists():
        assert time.monotonic() < deadline, "the embeddings worker did not embed the chunks"
        time.sleep(0.2)


def words(text):
    return len(text.split())


def test_turns_are_embedded_by_the_worker_and_recalled_into_a_later_context(
    embeddings_worker, alice, bob, embedder
):
    for title, question, reply, _later in NEEDLES[:4]:
        plant(alice, title, question, reply)
    plant(bob, "Pets", "My cat is called Whiskers.", "A classic name.")
    wait_embedded(alice)
    wait_embedded(bob)
    services.memory_create(user_id=alice.pk, text="I prefer answers in metric units")
    stored = Chunk.objects.filter(user=alice).first()
    assert np.allclose(
        np.frombuffer(bytes(stored.embedding), "<f2"), embedder.encode([stored.text])[0], atol=2e-3
    )

    new_conv = Conversation.objects.create(owner=alice, title="Now")
    ctx = memory_context(
        user_id=alice.pk,
        conversation_id=new_conv.pk,
        question="What is my cat's name?",
        window_message_ids=[],
        budget_tokens=200,
        count_tokens=words,
        timeout_s=10,
    )
    pets_reply = Message.objects.get(conversation__owner=alice, conversation__title="Pets", role="assistant")

    assert ctx.text.startswith(FACTS_MARKER) and "metric units" in ctx.text
    assert RECALL_MARKER in ctx.text and "Biscuit" in ctx.text and '(from "Pets")' in ctx.text
    assert "Whiskers" not in ctx.text  # bob's cat is never recalled for alice
    assert Chunk.objects.get(pk=ctx.hits[0].chunk_id).message_id == pets_reply.pk
    assert ctx.tokens <= 200

    unrelated = memory_context(
        user_id=alice.pk,
        conversation_id=new_conv.pk,
        question="Explain how photosynthesis works.",
        window_message_ids=[],
        budget_tokens=200,
        count_tokens=words,
        timeout_s=10,
    )
    assert unrelated.hits == [] and RECALL_MARKER not in unrelated.text


def test_a_question_is_embedded_by_the_worker_like_the_packaged_model_does(embeddings_worker, embedder):
    vector = question_embed(text="Where did I grow up?", timeout_s=10)
    assert vector is not None and vector.shape == (384,)
    assert float(vector @ embedder.encode(["Where did I grow up?"])[0]) > 0.999


def test_the_worker_exports_throughput_queue_depth_and_index_size(embeddings_worker, alice):
    plant(alice, "Tea", "I like sencha.", "A grassy green tea.")
    wait_embedded(alice)
    body = urllib.request.urlopen(embeddings_worker, timeout=10).read().decode()
    assert 'chatsite:embedding_chunks_total{kind="chunk"}' in body
    assert 'chatsite:embedding_queue_depth{queue="embeddings"}' in body
    assert f'chatsite:vector_index_size{{backend="{store_status()["backend"]}"}}' in body
    assert "chatsite:embedding_batch_size_bucket" in body


@pytest.mark.asyncio
async def test_a_reply_recalls_a_fact_from_another_conversation_and_its_own_turn_is_remembered(
    embeddings_worker, celery_worker, alice, client, redis_clean
):
    from channels.db import database_sync_to_async
    from django.conf import settings

    from billing.models import Tier
    from memory.models import Recall
    from tests.sockets import open_socket

    def setup():
        Tier.objects.filter(name="free").update(max_reply_tokens=16)
        conv, _answer = plant(alice, "Pets", *NEEDLES[0][1:3])
        wait_embedded(alice)
        client.force_login(alice)
        return conv

    pets = await database_sync_to_async(setup)()
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    ws = await open_socket(cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "What is my cat's name?"})
    queued = await ws.receive_json_from(timeout=60)
    while (await ws.receive_json_from(timeout=180))["type"] != "done":
        pass
    await ws.disconnect()

    def check():
        reply = Message.objects.get(pk=queued["message_id"])
        assert reply.status == "completed"
        recalls = list(Recall.objects.filter(reply=reply).select_related("chunk"))
        assert [r.chunk.conversation_id for r in recalls] == [pets.pk]
        assert "Biscuit" in recalls[0].chunk.text
        # The page names where it came from, with a link, and a Forget button.
        page = client.get(f"/chat/{reply.conversation_id}/").content.decode()
        assert "recalled from" in page and f'href="/chat/{pets.pk}/"' in page
        # A share link of the new conversation shows none of it.
        share = client.post(f"/chat/{reply.conversation_id}/share/")
        assert share.status_code == 302
        from conversations.models import SharedLink

        token = SharedLink.objects.get(conversation_id=reply.conversation_id).token
        shared = client.get(f"/s/{token}/").content.decode()
        assert "recalled from" not in shared and f"/chat/{pets.pk}/" not in shared
        assert "hates the vacuum cleaner" not in shared
        # The new turn itself was indexed after the reply's commit and embedded by the worker.
        wait_embedded(alice)
        assert Chunk.objects.filter(message=reply, embedding__isnull=False).exists()

    await database_sync_to_async(check)()
